"""Split manifests: deterministic build, lock digests, verification catching every problem kind."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factor_cli.cli.main import app
from factor_cli.envs import availability, make_env
from factor_cli.splits.build import EVAL_PER_CELL, TRAIN_PER_CELL, build_manifest, sciworld_cell
from factor_cli.splits.manifest import ManifestError, Row, read_manifest, write_manifest
from factor_cli.splits.verify import verify_dir

runner = CliRunner()
twx_missing = availability("twx")
sw_missing = availability("scienceworld")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
needs_sw = pytest.mark.skipif(sw_missing is not None, reason=f"scienceworld: {sw_missing}")
SMALL = {"coin": (6, 3), "cookingworld": (4, 2)}


@pytest.fixture
def twx_dir(tmp_path: Path) -> Path:
    with make_env("twx") as env:
        build_manifest("twx", env, tmp_path, seed=3, games=SMALL)
    return tmp_path


@needs_twx
def test_twx_build_is_deterministic_and_verifies(twx_dir: Path, tmp_path_factory) -> None:
    rows = read_manifest(twx_dir / "twx_ids.csv")
    assert len(rows) == 15 and {r.split for r in rows} == {"train", "eval"}
    assert all(r.extra["params"] for r in rows)
    again = tmp_path_factory.mktemp("again")
    with make_env("twx") as env:
        build_manifest("twx", env, again, seed=3, games=SMALL)
    assert (again / "twx_ids.csv").read_bytes() == (twx_dir / "twx_ids.csv").read_bytes()
    reports, problems = verify_dir(twx_dir)
    assert problems == [] and reports[0].checked == 15 and reports[0].eval == 5


def _rewrite(path: Path, edit) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")


@needs_twx
def test_verify_reports_each_problem_kind(twx_dir: Path) -> None:
    path = twx_dir / "twx_ids.csv"
    rows = read_manifest(path)
    # A checksum that does not match the environment, written with a valid lock.
    bad = [
        Row(
            r.instance_id, r.split, r.category, r.episode, "0" * 64 if i == 0 else r.sha256, r.extra
        )
        for i, r in enumerate(rows)
    ]
    # And an eval instance that is also a train instance.
    bad.append(Row(rows[0].instance_id, "eval", rows[0].category, 0, rows[0].sha256, rows[0].extra))
    write_manifest(path, bad)
    _, problems = verify_dir(twx_dir)
    kinds = {p.kind for p in problems}
    assert {"lock", "checksum", "overlap"} <= kinds


@needs_twx
def test_cli_verify_exit_codes(twx_dir: Path) -> None:
    ok = runner.invoke(app, ["verify-splits", "--splits-dir", str(twx_dir)])
    assert ok.exit_code == 0, ok.output
    assert "all manifests verified" in ok.output
    _rewrite(twx_dir / "twx_ids.csv", lambda ls: [*ls[:-1], ls[-1].replace("eval", "test")])
    bad = runner.invoke(app, ["verify-splits", "--splits-dir", str(twx_dir)])
    assert bad.exit_code == 1 and "column split is 'test'" in bad.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "instance_id,split,category,sha256\ncoin/1,train,coin," + "a" * 64,
            r"missing column\(s\) episode",
        ),
        (
            "instance_id,split,category,episode,sha256\ncoin/1,train,coin,x," + "a" * 64,
            "column episode is 'x'",
        ),
        (
            "instance_id,split,category,episode,sha256\ncoin/1,train,coin,0,abc",
            "column sha256 is not",
        ),
        (
            "instance_id,split,category,episode,sha256\n,train,coin,0," + "a" * 64,
            "column instance_id is empty",
        ),
        (
            "instance_id,split,category,episode,sha256\ncoin/1,train,coin,0,"
            + "a" * 64
            + "\ncoin/1,train,coin,0,"
            + "a" * 64,
            "duplicate row",
        ),
    ],
)
def test_manifest_schema_errors_name_file_row_column(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "twx_ids.csv"
    path.write_text(content + "\n")
    with pytest.raises(ManifestError, match=message) as err:
        read_manifest(path)
    assert str(path) in str(err.value)


def test_verify_missing_folder_and_bad_lock(tmp_path: Path) -> None:
    res = runner.invoke(app, ["verify-splits", "--splits-dir", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "no such folder" in res.output
    (tmp_path / "splits.lock").write_text("{oops")
    _, problems = verify_dir(tmp_path)
    assert problems and "not valid JSON" in problems[0].detail


def test_sciworld_cell_rule() -> None:
    # Few test variations: topped up from dev; few train variations: repeated with episodes.
    cell = {"train": [0, 1, 2, 3], "dev": [4, 5], "test": [6, 7, 8, 9]}
    evals, train = sciworld_cell(cell, random.Random(0))
    assert len(evals) == EVAL_PER_CELL and set(evals) <= {4, 5, 6, 7, 8, 9}
    assert {6, 7, 8, 9} <= set(evals)
    assert len(train) == TRAIN_PER_CELL and {v for v, _ in train} == {0, 1, 2, 3}
    assert (
        sorted(ep for v, ep in train if v == 0)
        == [0, 1, 2, 3, 4][: sum(1 for w, _ in train if w == 0)]
    )
    plenty = {"train": list(range(30)), "dev": list(range(30, 40)), "test": list(range(40, 60))}
    evals, train = sciworld_cell(plenty, random.Random(1))
    assert set(evals) <= set(range(40, 60)) and all(ep == 0 for _, ep in train)
    with pytest.raises(ValueError, match="eval episodes needed"):
        sciworld_cell({"train": [0], "dev": [1], "test": [2]}, random.Random(0))


@needs_sw
def test_sciworld_build_subset_and_verify(tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "splits",
            "build",
            "scienceworld",
            "--splits-dir",
            str(tmp_path),
            "--tasks",
            "melt",
            "--seed",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = read_manifest(tmp_path / "sciworld_ids.csv")
    assert len(rows) == 3 * (EVAL_PER_CELL + TRAIN_PER_CELL)
    assert {r.category for r in rows} == {"melt/L0", "melt/L1", "melt/L2"}
    lock = json.loads((tmp_path / "splits.lock").read_text())
    assert set(lock) == {"sciworld_ids.csv"}
    reports, problems = verify_dir(tmp_path, sample=5)
    assert problems == [] and reports[0].checked == 5


def test_cli_build_unknown_env() -> None:
    res = runner.invoke(app, ["splits", "build", "chess"])
    assert res.exit_code == 1 and "no split rule for 'chess'" in res.output


def test_committed_manifests_verify() -> None:
    """The manifests shipped in splits/ match their lock, counts and (sampled) environments."""
    splits = Path(__file__).resolve().parents[2] / "splits"
    reports, problems = verify_dir(splits, sample=8)
    assert problems == []
    by_name = {r.manifest: r for r in reports}
    sci = by_name["sciworld_ids.csv"]
    assert (sci.train, sci.eval) == (1620, 540)
    assert {"twx_ids.csv", "sciworld_ids.csv"} <= set(by_name)
