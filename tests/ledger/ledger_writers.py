"""Concurrent ledger writers for tests/test_ledger_concurrency.py: many processes at once.

Usage: ``python tests/ledger_writers.py CASES.json OUT_DIR``, where CASES.json is a list of
``{"uri": ..., "study": ..., "writers": N}`` run in order. The package and MLflow are imported
once, here; then for each case N processes are forked (each opens its own store, SQLite
connections and lock file descriptor, as N separate jobs would), wait at one barrier so they
start together, and each records one run through the ledger API: STEPS steps of metrics, the
item-level results, a clean close. Each writes ``OUT_DIR/<study>-<i>.json`` with its run id or
its traceback and exits 0 or 1. Nothing opens a store before the fork (MLflow caches stores and
SQLAlchemy engines per process, and an engine must not cross a fork).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import traceback
from pathlib import Path
from typing import Any

import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (imported once, before the fork)
import pandas as pd

import factor_cli.stats.io  # noqa: F401
from factor_cli.ledger import start_run

STEPS = 5
ITEMS = pd.DataFrame(
    {"item_id": ["a", "b", "c"], "category": ["x", "x", "y"], "success": [1, 0, 1],
     "score": [1.0, 0.0, 1.0]}
)  # fmt: skip
BARRIER_TIMEOUT_S = 300


def write_one(case: dict[str, Any], index: int, barrier: Any, out: Path) -> None:
    """One writer: a run with STEPS steps of metrics and item-level results."""
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        with start_run(
            {"writer": index}, study=case["study"], method="m", env="twx", seed=index,
            backbone="b", tracking_uri=case["uri"], cpu_cores=1,
        ) as run:  # fmt: skip
            for step in range(STEPS):
                run.log_metrics({"loss": 1.0 / (step + 1), "writer": index}, step=step)
            run.log_items(ITEMS)
        out.write_text(json.dumps({"run_id": run.run_id}))
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        sys.exit(1)


def run_case(case: dict[str, Any], out_dir: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    n = int(case["writers"])
    barrier = ctx.Barrier(n)
    procs = [
        ctx.Process(
            target=write_one, args=(case, i, barrier, out_dir / f"{case['study']}-{i}.json")
        )
        for i in range(n)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    for case in cases:
        run_case(case, out_dir)


if __name__ == "__main__":
    main()
