"""Both kinds of run a training loop writes to satisfy one Protocol (``train.run.RunLog``)."""

from __future__ import annotations

import inspect

from factor_cli.ledger.runs import LedgerRun
from factor_cli.train.run import RankRun, RunLog


def test_both_run_kinds_are_run_logs() -> None:
    assert isinstance(RankRun("abc"), RunLog)
    members = [m for m in dir(RunLog) if m.startswith("log_")]
    assert members == ["log_artifact", "log_items", "log_metrics"]
    for name in members:  # the ledger run takes at least the Protocol's parameters
        want = list(inspect.signature(getattr(RunLog, name)).parameters)
        assert list(inspect.signature(getattr(LedgerRun, name)).parameters)[: len(want)] == want


def test_a_rank_run_writes_nothing(tmp_path) -> None:
    run = RankRun("abc")
    run.log_metrics({"x": 1.0}, step=1)
    run.log_artifact(tmp_path / "missing.txt")
    assert run.run_id == "abc" and list(tmp_path.iterdir()) == []
