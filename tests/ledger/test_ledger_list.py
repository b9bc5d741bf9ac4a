"""`factor ledger list`: runs newest first with their final metrics and study tags."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from factor_cli.cli.app import app
from factor_cli.ledger import LedgerError, list_runs, start_run

CONFIG = {"lr": 1e-4}


def _run(uri: str, study: str, method: str, seed: int, **kwargs: object) -> str:
    kind = str(kwargs.pop("kind", "train"))
    with start_run(
        CONFIG, study=study, method=method, env="twx", seed=seed, backbone="tiny",
        tracking_uri=uri, kind=kind, tags={"reduction": "action-mean", "cell_key": "k1"},
    ) as run:  # fmt: skip
        run.log_metrics({"return_mean": 0.1 * seed, "eval_metric": 0.5}, step=1)
        run.log_metrics({"return_mean": 0.2 * seed}, step=2)  # the last value is listed
        if kwargs.get("fail"):
            raise RuntimeError("boom")
    return run.run_id


def test_runs_newest_first_with_final_metrics_and_tags(uri: str) -> None:
    first = _run(uri, "s1", "grpo", 1)
    second = _run(uri, "s1", "factor", 2, kind="eval")
    with pytest.raises(RuntimeError):
        _run(uri, "s2", "factor", 3, fail=True)
    runs = list_runs(tracking_uri=uri)
    assert list(runs["study"]) == ["s2", "s1", "s1"]
    assert list(runs["status"]) == ["FAILED", "FINISHED", "FINISHED"]
    by_id = runs.set_index("run_id")
    assert by_id.loc[first, "return_mean"] == pytest.approx(0.2)
    assert by_id.loc[first, "eval_metric"] == pytest.approx(0.5)
    assert math.isnan(by_id.loc[first, "loss"])  # never logged
    assert by_id.loc[first, "reduction"] == "action-mean" and by_id.loc[first, "cell_key"] == "k1"
    assert list(list_runs("s1", uri)["run_id"]) == [second, first]
    assert list(list_runs(tracking_uri=uri, kind="eval")["run_id"]) == [second]
    assert list(list_runs(tracking_uri=uri, status="failed")["study"]) == ["s2"]
    assert len(list_runs(tracking_uri=uri, last=1)) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "sft"}, "--kind 'sft': unknown run kind; valid: train, eval"),
        ({"status": "DONE"}, "--status 'DONE': unknown"),
        ({"study": "nope"}, "unknown study 'nope'"),
    ],
)
def test_bad_filters_are_one_line(uri: str, kwargs: dict, message: str) -> None:
    _run(uri, "s1", "grpo", 1)
    with pytest.raises(LedgerError, match=message):
        list_runs(tracking_uri=uri, **kwargs)


def test_cli_lists_and_prints_json(uri: str) -> None:
    run_id = _run(uri, "s1", "grpo", 1)
    out = CliRunner().invoke(app, ["ledger", "list", "--tracking-uri", uri, "--json"])
    assert out.exit_code == 0, out.output
    (record,) = json.loads(out.output)
    assert record["run_id"] == run_id and record["return_mean"] == pytest.approx(0.2)
    table = CliRunner().invoke(app, ["ledger", "list", "--tracking-uri", uri])
    assert table.exit_code == 0 and run_id[:12] in table.output
    bad = CliRunner().invoke(app, ["ledger", "list", "--tracking-uri", uri, "--kind", "x"])
    assert bad.exit_code == 1 and "unknown run kind" in bad.output
