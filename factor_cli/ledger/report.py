"""Reading the ledger back: compute report by study and method, item-level export.

``report`` is the paper's compute appendix: per (study, method) the number of runs, how many
finished, failed, were killed or never closed (still RUNNING: live, or a SIGKILLed process), and
the wall-clock, node- and CPU-core-hours they used. Failed and killed runs count: they consumed
the compute. ``runs_table`` lists every run; the CLI shows the unfinished ones individually.

``export_items`` concatenates the item-level artifact (``items/eval_items.csv``) of every
FINISHED training run of a study (or of every evaluation run: ``kind="eval"``) into the file
``factor stats`` reads, adding the run id and the study columns that are tags (study, backbone,
reduction, temperature, budget, decoding where present). Training and evaluation runs are never
mixed: an evaluation of a training run's checkpoint repeats its (env, method, seed), and an
evaluation on the train split is no test result.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pandas as pd

from .runs import (
    DEFAULT_KIND,
    GPUS_PER_NODE,
    ITEMS_DIR,
    RUN_KINDS,
    T_CORE,
    T_GPU,
    T_HEARTBEAT,
    T_SESSION,
    T_WALL,
)
from .store import (
    DEFAULT_EXPERIMENT,
    LedgerError,
    first_line,
    get_experiment_id,
    open_client,
    resolve_tracking_uri,
)

STATUSES = ("FINISHED", "FAILED", "KILLED", "RUNNING", "SCHEDULED")
# Tags that become columns of the export (after env, method, seed, ...), when some run has them.
STUDY_COLUMNS = ("study", "backbone", "reduction", "temperature", "budget", "decoding")
# An evaluation run's export columns besides those: what it evaluated, from its tags. They are
# part of its identity, so evaluations of two checkpoints (or splits) of one config both count.
EVAL_COLUMNS = {
    "split": "eval.split",
    "checkpoint": "eval.checkpoint",
    "evaluated_run": "eval.run_id",
}
RUN_COLUMNS = (
    "run_id", "study", "method", "env", "seed", "backbone", "kind", "status", "sessions", "gpus",
    "wall_clock_hours", "node_hours", "cpu_core_hours", "start_time", "last_heartbeat", "error",
)  # fmt: skip
REPORT_COLUMNS = (
    "study", "method", "runs", "finished", "failed", "killed", "running",
    "wall_clock_hours", "node_hours", "cpu_core_hours",
)  # fmt: skip
_PAGE = 1000


def _open(tracking_uri: str | None, experiment: str):
    uri = resolve_tracking_uri(tracking_uri)
    client = open_client(uri, create=False)
    return uri, client, get_experiment_id(client, experiment, uri, create=False)


def _search(client, exp_id: str, filter_string: str = "") -> Iterator:
    token = None
    while True:
        page = client.search_runs(
            [exp_id], filter_string=filter_string, max_results=_PAGE, page_token=token
        )
        yield from page
        token = page.token
        if not token:
            return


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _float(tags: dict[str, str], key: str) -> float:
    try:
        return float(tags.get(key, 0.0))
    except ValueError:
        return 0.0


def _row(run) -> dict:
    tags = run.data.tags
    start = pd.Timestamp(run.info.start_time, unit="ms", tz="UTC") if run.info.start_time else None
    return {
        "run_id": run.info.run_id,
        "study": tags.get("study", ""),
        "method": tags.get("method", ""),
        "env": tags.get("env", ""),
        "seed": tags.get("seed", ""),
        "backbone": tags.get("backbone", ""),
        "kind": tags.get("kind", DEFAULT_KIND),
        "status": run.info.status,
        "sessions": int(_float(tags, T_SESSION)) or 1,
        "gpus": tags.get("gpus", ""),
        "wall_clock_hours": _float(tags, T_WALL) / 3600.0,
        "node_hours": _float(tags, T_GPU) / 3600.0 / GPUS_PER_NODE,
        "cpu_core_hours": _float(tags, T_CORE) / 3600.0,
        "start_time": start.isoformat(timespec="milliseconds") if start is not None else "",
        "last_heartbeat": tags.get(T_HEARTBEAT, ""),
        "error": tags.get("error", ""),
    }


def _known_studies(client, exp_id: str) -> list[str]:
    return sorted({r.data.tags.get("study", "") for r in _search(client, exp_id)} - {""})


def _unknown_study(study: str, studies: list[str], uri: str) -> LedgerError:
    known = ", ".join(studies) if studies else "none: the ledger has no runs"
    return LedgerError(f"unknown study {study!r} in {uri}; known studies: {known}")


def runs_table(
    study: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> pd.DataFrame:
    """One row per run (columns :data:`RUN_COLUMNS`), oldest first; all studies when None.

    Compute columns come from the accounting tags, which are written at every log and at the
    close, so an unclosed (SIGKILLed) run shows the time up to its last log.

    Raises:
        LedgerError: unusable store, or ``study`` names no run (the message lists the known
            studies).
    """
    uri, client, exp_id = _open(tracking_uri, experiment)
    if exp_id is None:
        if study is not None:
            raise _unknown_study(study, [], uri)
        return pd.DataFrame(columns=list(RUN_COLUMNS))
    filt = f"tags.study = {_quote(study)}" if study is not None else ""
    try:
        rows = [_row(r) for r in _search(client, exp_id, filt)]
    except LedgerError:
        raise
    except Exception as exc:
        raise LedgerError(f"cannot read runs from {uri}: {first_line(exc)}") from None
    if not rows and study is not None:
        raise _unknown_study(study, _known_studies(client, exp_id), uri)
    frame = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    return frame.sort_values(["start_time", "run_id"], kind="stable").reset_index(drop=True)


# What `factor ledger list` shows of each run besides RUN_COLUMNS: final metrics and study tags.
LIST_METRICS = ("eval_metric", "return_mean", "success_rate", "invalid_rate", "loss")
LIST_TAGS = ("reduction", "temperature", "budget", "cell_key", "attempt", "git_commit")


def list_runs(
    study: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    kind: str | None = None,
    status: str | None = None,
    last: int | None = None,
) -> pd.DataFrame:
    """The runs, newest first: :data:`RUN_COLUMNS`, each run's last value of every
    :data:`LIST_METRICS` metric it logged (NaN when none), and the :data:`LIST_TAGS` tags.

    Args:
        kind: only ``train`` or ``eval`` runs; status: only runs with this MLflow status;
        last: at most this many (the newest).

    Raises:
        LedgerError: unusable store, unknown study (listing the known ones), a bad kind/status.
    """
    if kind is not None and kind not in RUN_KINDS:
        raise LedgerError(f"--kind {kind!r}: unknown run kind; valid: {', '.join(RUN_KINDS)}")
    if status is not None and status.upper() not in STATUSES:
        raise LedgerError(f"--status {status!r}: unknown; valid: {', '.join(STATUSES)}")
    uri, client, exp_id = _open(tracking_uri, experiment)
    columns = [*RUN_COLUMNS, *LIST_METRICS, *LIST_TAGS]
    if exp_id is None:
        return pd.DataFrame(columns=columns)
    filt = f"tags.study = {_quote(study)}" if study is not None else ""
    try:
        runs = list(_search(client, exp_id, filt))
    except Exception as exc:
        raise LedgerError(f"cannot read runs from {uri}: {first_line(exc)}") from None
    if not runs and study is not None:
        raise _unknown_study(study, _known_studies(client, exp_id), uri)
    rows = []
    for run in runs:
        row = _row(run)
        row.update({m: run.data.metrics.get(m, float("nan")) for m in LIST_METRICS})
        row.update({t: run.data.tags.get(t, "") for t in LIST_TAGS})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    if kind is not None:
        frame = frame[frame["kind"] == kind]
    if status is not None:
        frame = frame[frame["status"] == status.upper()]
    frame = frame.sort_values(["start_time", "run_id"], ascending=False, kind="stable")
    return frame.head(last).reset_index(drop=True) if last else frame.reset_index(drop=True)


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Aggregate a :func:`runs_table` by (study, method): counts per status and summed hours."""
    if runs.empty:
        return pd.DataFrame(columns=list(REPORT_COLUMNS))
    status = runs["status"]
    counted = runs.assign(
        runs=1,
        finished=(status == "FINISHED").astype(int),
        failed=(status == "FAILED").astype(int),
        killed=(status == "KILLED").astype(int),
        running=status.isin(("RUNNING", "SCHEDULED")).astype(int),
    )
    cols = list(REPORT_COLUMNS[2:])
    out = counted.groupby(["study", "method"], sort=True, as_index=False)[cols].sum()
    return out[list(REPORT_COLUMNS)].reset_index(drop=True)


def report(
    study: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> pd.DataFrame:
    """Runs, failed runs and compute by (study, method), like the paper's compute appendix.

    Columns :data:`REPORT_COLUMNS`: runs (all), finished, failed, killed, running (never
    closed), and the sums of wall_clock_hours, node_hours (= wall-clock hours x GPUs / 8) and
    cpu_core_hours over all runs, failed ones included.
    """
    return summarize(runs_table(study, tracking_uri, experiment))


def version_warnings(
    study: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> list[str]:
    """One line per package or runtime whose recorded version differs between the runs of
    ``study`` (all runs when None), naming the values (:func:`provenance.version_conflicts`)."""
    from .provenance import version_conflicts

    _, client, exp_id = _open(tracking_uri, experiment)
    if exp_id is None:
        return []
    filt = f"tags.study = {_quote(study)}" if study is not None else ""
    conflicts = version_conflicts([r.data.tags for r in _search(client, exp_id, filt)])
    where = f"study {study}" if study is not None else "the ledger"
    return [
        f"the runs of {where} differ in {name}: {', '.join(values)}; results may not compare"
        for name, values in conflicts.items()
    ]


def run_version_warnings(
    run_ids: list[str],
    source: str,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> list[str]:
    """:func:`version_warnings` for the runs ``run_ids`` (e.g. the ``run_id`` column of an
    exported items file ``source``); runs the ledger does not hold are left out, and a ledger
    that cannot be opened gives no warning (the file may come from another machine)."""
    from .provenance import version_conflicts

    try:
        _, client, exp_id = _open(tracking_uri, experiment)
    except LedgerError:
        return []
    if exp_id is None or not run_ids:
        return []
    tags = []
    for run_id in sorted(set(run_ids)):
        try:
            tags.append(client.get_run(run_id).data.tags)
        except Exception:  # not in this ledger (MLflow raises its own RestException)
            continue
    conflicts = version_conflicts(tags)
    return [
        f"the runs of {source} differ in {name}: {', '.join(values)}; results may not compare"
        for name, values in conflicts.items()
    ]


def export_items(
    study: str | None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    name: str = "eval_items.csv",
    keep_latest: bool = False,
    kind: str = DEFAULT_KIND,
) -> pd.DataFrame:
    """Item-level results of every FINISHED run of ``study`` (None: all), for ``factor stats``.

    Columns: env, method, seed, item_id, category, success, score (and any other item columns),
    then run_id and the study columns present as tags (:data:`STUDY_COLUMNS`; for
    evaluation runs also :data:`EVAL_COLUMNS`: split, checkpoint, evaluated_run).

    Args:
        name: the items artifact to collect (``items/<name>``).
        keep_latest: when two finished runs share (env, method, seed, study columns), keep the
            newer one instead of failing.
        kind: which runs: ``train`` (the final evaluation of each training run) or ``eval``
            (stand-alone ``factor eval`` runs).

    Raises:
        LedgerError: unknown study or kind, no finished run with the items artifact, two runs
            with the same identity (without ``keep_latest``), or an artifact that breaks the
            schema.
    """
    from factor_cli.stats.io import REQUIRED_COLUMNS, read_frame, validate_results

    if kind not in RUN_KINDS:
        raise LedgerError(f"unknown run kind {kind!r}; valid: {', '.join(RUN_KINDS)}")
    runs = runs_table(study, tracking_uri, experiment)
    _, client, _ = _open(tracking_uri, experiment)
    finished = runs[(runs["status"] == "FINISHED") & (runs["kind"] == kind)]
    columns = {c: c for c in STUDY_COLUMNS} | (EVAL_COLUMNS if kind == "eval" else {})
    frames = []
    with tempfile.TemporaryDirectory(prefix="factor-export-") as tmp:
        for run_id in finished["run_id"]:
            mlrun = client.get_run(run_id)
            tags = mlrun.data.tags
            try:
                local = client.download_artifacts(run_id, f"{ITEMS_DIR}/{name}", tmp)
            except Exception:  # the run logged no items under this name
                continue
            try:
                items = read_frame(local)
            except ValueError as exc:
                raise LedgerError(f"run {run_id}: {ITEMS_DIR}/{name}: {exc}") from None
            items["run_id"] = run_id
            for col, tag in columns.items():
                if tag in tags and col not in items.columns:
                    items[col] = tags[tag]
            items["_start"] = mlrun.info.start_time or 0
            frames.append(items)
    if not frames:
        raise LedgerError(
            f"nothing to export for study {study or '(all)'}: no FINISHED {kind} run has the "
            f"artifact {ITEMS_DIR}/{name} ({len(finished)} finished {kind} runs of {len(runs)})"
        )
    out = pd.concat(frames, ignore_index=True, sort=False)
    study_cols = [c for c in columns if c in out.columns]
    run_keys = [c for c in study_cols if c != "study"]
    out = _dedupe(out, ["env", "method", "seed", *run_keys], keep_latest)
    try:
        out = validate_results(out.drop(columns="_start"), run_keys)
    except ValueError as exc:
        raise LedgerError(f"study {study or '(all)'}: {exc}") from None
    rest = [c for c in out.columns if c not in (*REQUIRED_COLUMNS, "run_id", *study_cols)]
    first = [*REQUIRED_COLUMNS, *rest]
    return out[[*first, "run_id", *study_cols]].reset_index(drop=True)


def _dedupe(frame: pd.DataFrame, key: list[str], keep_latest: bool) -> pd.DataFrame:
    """Refuse (or resolve, newest run wins) two runs with the same identity."""
    ident = frame[[*key, "run_id", "_start"]].drop_duplicates(subset=["run_id"])
    ident[key] = ident[key].fillna("").astype(str)
    dup = ident.duplicated(subset=key, keep=False)
    if not dup.any():
        return frame
    if not keep_latest:
        first = ident.loc[dup].iloc[0]
        same = ident.loc[(ident[key] == first[key]).all(axis=1), "run_id"].tolist()
        where = ", ".join(f"{k}={first[k]}" for k in key if first[k] != "")
        raise LedgerError(
            f"{len(same)} finished runs share {where} ({', '.join(same)}); delete the "
            f"unwanted ones (mlflow runs delete --run-id ID) or pass --keep-latest"
        )
    newest = ident.sort_values("_start", kind="stable").drop_duplicates(subset=key, keep="last")
    return frame[frame["run_id"].isin(set(newest["run_id"]))]
