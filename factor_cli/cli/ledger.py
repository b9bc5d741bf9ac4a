"""`factor ledger`: compute report and item-level export of the MLflow ledger.

Thin layer over :mod:`factor_cli.ledger`: resolve the store (``--tracking-uri`` >
``MLFLOW_TRACKING_URI`` > ``ledger/mlflow.db``), call the library, render with rich. Bad input
(unknown study, unreachable store, nothing to export) is one line on stderr and exit code 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from factor_cli.atomic import atomic_target

from .common import console, fail

if TYPE_CHECKING:
    import pandas as pd

app = typer.Typer(
    rich_markup_mode="markdown",
    help=(
        "The run ledger (MLflow): every training/evaluation run with its config, provenance, "
        "metrics, item-level results and node-hours (wall-clock hours x GPUs / 8).\n\n"
        "Store: --tracking-uri, else $MLFLOW_TRACKING_URI, else the SQLite file ledger/mlflow.db "
        "at the top of the repository (or of the working directory outside one)."
    ),
    no_args_is_help=True,
)

TrackingOpt = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        help="MLflow tracking URI (sqlite:///PATH.db, http(s)://HOST:PORT); default: "
        "$MLFLOW_TRACKING_URI, else ledger/mlflow.db under the repository.",
        show_default=False,
    ),
]
ExperimentOpt = Annotated[str, typer.Option("--experiment", help="MLflow experiment name.")]
_PARQUET = (".parquet", ".pq")
_CSV = (".csv", ".csv.gz", ".tsv")


def _hours(value: float) -> str:
    return f"{value:,.3f}" if value < 1000 else f"{value:,.1f}"


_COUNTS = (("runs", "runs"), ("finished", "ok"), ("failed", "fail"), ("killed", "kill"),
           ("running", "open"))  # fmt: skip
_HOURS = (("wall_clock_hours", "wall h"), ("node_hours", "node h"), ("cpu_core_hours", "core h"))


def _summary_table(summary: pd.DataFrame, uri: str) -> Table:
    """Counts per status (ok, fail, kill, open = never closed) and summed hours."""
    table = Table(
        title=f"Compute by study and method ({escape(uri)})", title_justify="left", show_edge=False
    )
    table.add_column("study", no_wrap=True)
    table.add_column("method", no_wrap=True)
    for _, header in (*_COUNTS, *_HOURS):
        table.add_column(header, justify="right", no_wrap=True)
    for study, part in summary.groupby("study", sort=True):
        for _, r in part.iterrows():
            table.add_row(
                escape(str(r["study"])), escape(str(r["method"])),
                *(str(int(r[c])) for c, _ in _COUNTS), *(_hours(r[c]) for c, _ in _HOURS),
            )  # fmt: skip
        if len(part) > 1:
            table.add_row(
                f"[bold]{escape(str(study))}[/]", "[bold]total[/]",
                *(str(int(part[c].sum())) for c, _ in _COUNTS),
                *(_hours(part[c].sum()) for c, _ in _HOURS),
                end_section=True,
            )  # fmt: skip
    return table


def _print_unfinished(runs: pd.DataFrame) -> None:
    """Failed, killed and never-closed runs, one block each, with the full run id."""
    console.print(f"\n[bold]Runs not finished[/] ({len(runs)})")
    for _, r in runs.iterrows():
        who = "/".join(str(r[c]) for c in ("study", "method", "env", "seed"))
        last = str(r["last_heartbeat"]).replace("T", " ").split("+")[0] or "-"
        console.print(
            f"  [bold]{r['status']:<8}[/] {escape(who)}  run {r['run_id']}  "
            f"{_hours(r['node_hours'])} node-h",
            highlight=False,
        )
        error = f"; {r['error']}" if r["error"] else ""
        console.print(f"           last log {escape(last)} UTC{escape(error)}", highlight=False)


def _records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records"))


@app.command("report")
def report_cmd(
    study: Annotated[
        str | None, typer.Option("--study", "-s", help="Only this study (default: all).")
    ] = None,
    tracking_uri: TrackingOpt = None,
    experiment: ExperimentOpt = "factor",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Runs, failed runs, node-hours and CPU core-hours by study and method.

    Like the paper's compute appendix: node-hours = wall-clock hours x GPUs / 8 (one 8-GPU node
    for one hour); failed and killed runs count, and are listed one by one below the totals.
    Runs never closed (RUNNING: live, or killed with SIGKILL) show the time up to their last log.
    """
    from factor_cli.ledger import LedgerError, resolve_tracking_uri, runs_table, summarize

    try:
        uri = resolve_tracking_uri(tracking_uri)
        runs = runs_table(study, uri, experiment)
    except LedgerError as exc:
        fail(str(exc))
    summary = summarize(runs)
    unfinished = runs[runs["status"] != "FINISHED"]
    if as_json:
        payload = {
            "tracking_uri": uri,
            "study": study,
            "summary": _records(summary),
            "unfinished_runs": _records(unfinished),
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    if runs.empty:
        console.print(f"no runs in {escape(uri)} (experiment {escape(experiment)})")
        return
    console.print(_summary_table(summary, uri))
    if not unfinished.empty:
        _print_unfinished(unfinished)


def _metric(value: float) -> str:
    return "" if value != value else f"{value:.3f}"  # NaN: not logged


@app.command("list")
def list_cmd(
    study: Annotated[
        str | None, typer.Option("--study", "-s", help="Only this study (default: all).")
    ] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Only train or eval runs.")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only FINISHED, FAILED, KILLED or RUNNING.")
    ] = None,
    last: Annotated[int, typer.Option("--last", "-n", help="The newest N runs (0: all).")] = 20,
    tracking_uri: TrackingOpt = None,
    experiment: ExperimentOpt = "factor",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON records.")] = False,
) -> None:
    """The runs, newest first: identity, kind, status, sessions, compute, final metrics
    (eval_metric, return_mean, success_rate, invalid_rate, loss) and study tags."""
    from factor_cli.ledger import LedgerError, list_runs

    try:
        runs = list_runs(study, tracking_uri, experiment, kind, status, last or None)
    except LedgerError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(_records(runs), indent=2))
        return
    wide = console.width >= 140  # compute, invalid rate and start time only fit a wide terminal
    table = Table(title=f"Runs ({len(runs)} shown, newest first)")
    table.add_column("run", no_wrap=True, min_width=12)  # the id stays whole, for copying
    cols = ["study/method/env/seed", "kind", "status", "sess.", "eval", "return", "success"]
    cols += ["core-h", "invalid", "started"] if wide else []
    for col in cols:  # only the identity folds; codes and numbers stay whole
        table.add_column(col, overflow="fold", no_wrap=col != cols[0])
    for r in runs.itertuples(index=False):
        row = [
            r.run_id[:12], Text(f"{r.study}/{r.method}/{r.env}/{r.seed}"), r.kind, r.status,
            str(r.sessions), _metric(r.eval_metric), _metric(r.return_mean),
            _metric(r.success_rate),
        ]  # fmt: skip
        if wide:
            row += [f"{r.cpu_core_hours:.3f}", _metric(r.invalid_rate), r.start_time[:19]]
        table.add_row(*row)
    console.print(table)


def write_atomic(frame: pd.DataFrame, out: Path) -> None:
    """Write CSV/TSV or Parquet (by extension) to a temporary file beside ``out``, then rename."""
    name = out.name.lower()
    if not name.endswith(_PARQUET + _CSV):
        raise ValueError(
            f"unsupported output type {out.suffix!r}; use one of {', '.join(_CSV + _PARQUET)}"
        )
    with atomic_target(out) as tmp:
        if name.endswith(_PARQUET):
            frame.to_parquet(tmp, index=False)
        else:
            sep = "\t" if name.endswith(".tsv") else ","
            compression = "gzip" if name.endswith(".gz") else None
            frame.to_csv(tmp, index=False, sep=sep, compression=compression)


@app.command("export")
def export_cmd(
    study: Annotated[str, typer.Option("--study", "-s", help="Study to export.")],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Output file: .csv, .csv.gz, .tsv, .parquet.", show_default=False
        ),
    ],
    tracking_uri: TrackingOpt = None,
    experiment: ExperimentOpt = "factor",
    name: Annotated[
        str, typer.Option("--name", help="Items artifact to collect (items/NAME).")
    ] = "eval_items.csv",
    keep_latest: Annotated[
        bool,
        typer.Option(
            "--keep-latest",
            help="When finished runs repeat an (env, method, seed, study columns), keep the "
            "newest instead of failing.",
        ),
    ] = False,
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help="Runs to collect: train (each run's final evaluation) or eval "
            "(`factor eval` runs).",
        ),
    ] = "train",
) -> None:
    """Write the item-level results of a study's finished runs: the file `factor stats` reads.

    One row per (run, evaluation item): env, method, seed, item_id, category, success, score,
    then run_id and the study columns that are tags (study, backbone, reduction, temperature,
    budget where present). Written atomically (temporary file + rename).
    """
    from factor_cli.ledger import LedgerError, export_items, resolve_tracking_uri

    if not out.name.lower().endswith(_PARQUET + _CSV):
        fail(f"--out {out}: unsupported file type; use one of {', '.join(_CSV + _PARQUET)}")
    try:
        uri = resolve_tracking_uri(tracking_uri)
        items = export_items(study, uri, experiment, name=name, keep_latest=keep_latest, kind=kind)
    except LedgerError as exc:
        fail(str(exc))
    try:
        write_atomic(items, out)
    except (OSError, ValueError, ImportError) as exc:
        fail(f"cannot write {out}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    runs = items["run_id"].nunique()
    console.print(Text(f"wrote {len(items)} items from {runs} runs of study {study} to {out}"))
