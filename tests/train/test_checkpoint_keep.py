"""Which checkpoints survive: the two newest, and with ``checkpoint_keep_every`` the steps it
divides (the policies ``factor diagnose td-sign`` replays)."""

from __future__ import annotations

from pathlib import Path

import pytest

from factor_cli.train import checkpoint


class _Engine:
    def save(self, directory: Path) -> None:
        (directory / "weights").write_text("w")


@pytest.mark.parametrize(
    ("keep_every", "kept"),
    [(None, [6, 7]), (4, [4, 6, 7]), (3, [3, 6, 7]), (1, [1, 2, 3, 4, 5, 6, 7])],
)
def test_pruning_keeps_the_newest_two_and_every_nth(
    tmp_path: Path, keep_every: int | None, kept: list[int]
) -> None:
    for step in range(1, 8):
        checkpoint.save(tmp_path, step, _Engine(), {}, keep_every=keep_every)
    left = sorted(
        int(p.name.removeprefix("step-")) for p in (tmp_path / "checkpoints").glob("step-*")
    )
    assert left == kept
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoints" / "step-000007"
