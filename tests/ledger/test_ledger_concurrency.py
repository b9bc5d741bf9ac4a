"""Many jobs at once on one SQLite ledger: a new store is created and migrated once, every run
is recorded with its metrics and items, none is left RUNNING, and the ledger stays readable.

Writers are separate processes forked by ``tests/ledger_writers.py`` (which imports MLflow once,
so eight writers cost one import, not eight). Cases run in order: ``new`` cases start on a
database that does not exist yet; ``existing`` cases then write to the store a ``new`` case left
(a migrated store that already holds runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("mlflow", reason="install with: pip install 'mlflow>=3.10'")

from mlflow import MlflowClient

from factor_cli.cli.main import app
from factor_cli.ledger import export_items, runs_table

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")
HELPER = Path(__file__).with_name("ledger_writers.py")
STEPS = 5  # ledger_writers.STEPS
ITEMS = 3  # rows of ledger_writers.ITEMS
# (case, writers, store): the existing-store cases reuse the store of the new-store case named.
CASES = [
    ("new-4", 4, "a"),
    ("existing-8", 8, "a"),
    ("new-8", 8, "b"),
    ("existing-4", 4, "b"),
]


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Run every case once; returns {case: tracking URI}."""
    root = tmp_path_factory.mktemp("concurrent")
    uris = {case: f"sqlite:///{root / store / 'mlflow.db'}" for case, _, store in CASES}
    spec = [{"uri": uris[case], "study": case, "writers": n} for case, n, _ in CASES]
    (root / "cases.json").write_text(json.dumps(spec))
    out = root / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, str(HELPER), str(root / "cases.json"), str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case, n, _ in CASES:
        for i in range(n):
            result = json.loads((out / f"{case}-{i}.json").read_text())
            assert "run_id" in result, f"{case} writer {i}:\n{result.get('error')}"
    return uris


@pytest.mark.parametrize(("case", "writers"), [(c, n) for c, n, _ in CASES])
def test_concurrent_writers_all_recorded(concurrent: dict[str, str], case: str, writers: int):
    uri = concurrent[case]
    runs = runs_table(case, uri)
    assert len(runs) == writers
    assert set(runs["status"]) == {"FINISHED"}  # none stuck RUNNING, none FAILED
    assert sorted(runs["seed"].astype(int)) == list(range(writers))
    client = MlflowClient(uri)
    for run_id in runs["run_id"]:
        history = client.get_metric_history(run_id, "loss")
        assert sorted(m.step for m in history) == list(range(STEPS))
        assert client.get_run(run_id).data.tags["ledger.session"] == "1"
    assert len(export_items(case, uri)) == writers * ITEMS

    res = CliRunner().invoke(app, ["ledger", "report", "-s", case, "--tracking-uri", uri, "--json"])
    assert res.exit_code == 0, res.output
    (summary,) = json.loads(res.output)["summary"]
    assert (summary["runs"], summary["finished"], summary["running"]) == (writers, writers, 0)


def test_concurrent_store_is_whole_afterwards(concurrent: dict[str, str]) -> None:
    """Both stores hold all their runs and answer a plain report of everything."""
    for store_cases in (("new-4", "existing-8"), ("new-8", "existing-4")):
        uri = concurrent[store_cases[0]]
        res = CliRunner().invoke(app, ["ledger", "report", "--tracking-uri", uri])
        assert res.exit_code == 0, res.output
        assert len(runs_table(None, uri)) == 12
        assert set(runs_table(None, uri)["study"]) == set(store_cases)
