"""The ledger: every run in MLflow with provenance, metrics, item-level results and node-hours.

Public API::

    start_run(config, study=, method=, env=, seed=, backbone=, gpus=0, tracking_uri=None,
              resume_run_id=None, experiment="factor", kind="train") -> LedgerRun  (a context
              manager; kind="eval" for `factor eval`)
    report(study, tracking_uri) -> DataFrame          runs and compute by (study, method)
    runs_table(study, tracking_uri) -> DataFrame      one row per run
    export_items(study, tracking_uri, kind="train") -> DataFrame   items for `factor stats`
    list_runs(study, tracking_uri, kind=None, status=None, last=None) -> DataFrame  newest first
    resolve_tracking_uri(uri) -> str                 --tracking-uri > $MLFLOW_TRACKING_URI > ledger/
    check_store(uri) -> str                          open (create) the store now, or LedgerError

A SQLite store is safe for many concurrent jobs: it is created and migrated once, under a file
lock beside it, and writes that SQLite refuses as "database is locked" are retried (see
:mod:`factor_cli.ledger.store`).

node_hours = wall-clock hours x GPUs / 8 (one 8-GPU node for one hour; 0 on CPU).
"""

from .provenance import (
    Digestible,
    GitState,
    Hardware,
    canonical_json,
    config_hash,
    git_state,
    hardware,
)
from .report import (
    REPORT_COLUMNS,
    RUN_COLUMNS,
    export_items,
    list_runs,
    report,
    runs_table,
    summarize,
)
from .runs import (
    DEFAULT_KIND,
    GPUS_PER_NODE,
    RUN_KINDS,
    LedgerRun,
    RunTerminated,
    flatten_config,
    start_run,
)
from .store import (
    DEFAULT_EXPERIMENT,
    LedgerError,
    check_store,
    default_tracking_uri,
    resolve_tracking_uri,
)

__all__ = [
    "DEFAULT_EXPERIMENT",
    "DEFAULT_KIND",
    "GPUS_PER_NODE",
    "REPORT_COLUMNS",
    "RUN_COLUMNS",
    "RUN_KINDS",
    "Digestible",
    "GitState",
    "Hardware",
    "LedgerError",
    "LedgerRun",
    "RunTerminated",
    "canonical_json",
    "check_store",
    "config_hash",
    "default_tracking_uri",
    "export_items",
    "flatten_config",
    "git_state",
    "hardware",
    "list_runs",
    "report",
    "resolve_tracking_uri",
    "runs_table",
    "start_run",
    "summarize",
]
