"""`factor ledger`: compute report, run list, item-level export and transcripts of the ledger.

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

from factor_cli.atomic import atomic_target, atomic_write_text

from .common import console, fail, warn

if TYPE_CHECKING:
    import pandas as pd

    from factor_cli.ledger.transcripts import EpisodeRecord, Transcript, TranscriptIndex

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
    from factor_cli.ledger.report import version_warnings

    differ = version_warnings(study, uri, experiment)
    for line in differ:
        warn(line)
    if as_json:
        payload = {
            "tracking_uri": uri,
            "study": study,
            "summary": _records(summary),
            "unfinished_runs": _records(unfinished),
            "version_differences": differ,
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


@app.command("show")
def show_cmd(
    run: Annotated[str, typer.Argument(help="Ledger run id (a unique prefix is enough).")],
    step: Annotated[
        int | None,
        typer.Option(
            "--step",
            "-k",
            help="Training step (default: the last recorded); with --eval, the "
            "evaluation after that step (0: the starting policy; default: the last).",
            show_default=False,
        ),
    ] = None,
    episode: Annotated[
        int | None,
        typer.Option(
            "--episode",
            "-e",
            help="Episode of that step (default 0; with --html, all).",
            show_default=False,
        ),
    ] = None,
    evaluation: Annotated[
        bool, typer.Option("--eval", help="Show evaluation episodes instead of training ones.")
    ] = False,
    html_out: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Write one self-contained HTML page of the step's episodes here.",
            show_default=False,
        ),
    ] = None,
    prompt: Annotated[
        bool, typer.Option("--prompt", help="Print each turn's whole prompt x_t.")
    ] = False,
    weights: Annotated[
        bool, typer.Option("--weights", "-w", help="Print each token's weight too.")
    ] = False,
    tracking_uri: TrackingOpt = None,
    experiment: ExperimentOpt = "factor",
) -> None:
    """Show what the agent did: one recorded episode of a training run, turn by turn.

    Per turn: the observation, the reply with its action tokens coloured by allocation weight
    (as `factor credit explain`), the action and whether it was valid, the reward and the
    environment's feedback; beside it the credit A*_t, the value estimate V(x_t) and the mean
    token weight; per episode A^seq and the check sum_t A*_t = A^seq. Runs record
    `transcripts.episodes_per_step` sample episodes per step and every evaluation episode.
    """
    from .episode_render import print_episode

    tr, index, chosen = _episodes(run, step, episode, evaluation, tracking_uri, experiment)
    if html_out is not None:
        _write_page(tr, chosen, evaluation, html_out)
        return
    print_episode(console, chosen[0], len(tr.episodes), tr.run_id, prompt, weights)
    console.print(Text(f"recorded: {_recorded(index)}", style="dim"))


def _episodes(
    run: str,
    step: int | None,
    episode: int | None,
    evaluation: bool,
    tracking_uri: str | None,
    experiment: str,
) -> tuple[Transcript, TranscriptIndex, list[EpisodeRecord]]:
    """The transcript asked for and its chosen episodes (all of them when ``episode`` is
    None), or a one-line error; a torn last line is a warning."""
    from factor_cli.ledger.transcripts import TranscriptError, open_transcript

    if step is not None and step < 0:
        fail(f"--step {step}: steps are 0 or more")
    try:
        tr, index = open_transcript(run, step, evaluation, tracking_uri, experiment)
    except (TranscriptError, ValueError) as exc:
        fail(str(exc))
    count = len(tr.episodes)
    if tr.torn:
        warn(f"run {tr.run_id[:12]}: the last line of the {tr.kind} transcript of step "
             f"{tr.step} was cut short (a torn write); skipped it")  # fmt: skip
    if count == 0:
        fail(f"run {tr.run_id[:12]}: the {tr.kind} transcript of step {tr.step} holds no episode")
    if episode is not None and not 0 <= episode < count:
        fail(f"--episode {episode}: step {tr.step} recorded episodes 0-{count - 1}")
    return tr, index, tr.episodes if episode is None else [tr.episodes[episode]]


def _write_page(tr: Transcript, chosen: list[EpisodeRecord], evaluation: bool, out: Path) -> None:
    """One self-contained HTML page of ``chosen``, written atomically."""
    from .episode_render import episodes_html

    what = "evaluation after step" if evaluation else "training step"
    page = episodes_html(chosen, f"factor run {tr.run_id[:12]}: {what} {tr.step}", len(tr.episodes))
    try:
        atomic_write_text(out, page)
    except OSError as exc:
        fail(f"--html {out}: cannot write it ({exc.strerror or exc})")
    console.print(Text(f"wrote {len(chosen)} episodes to {out}"), soft_wrap=True)


def _recorded(index: TranscriptIndex) -> str:
    """``steps 1-4; evals after steps 0, 4``: what else ``show`` can open for this run."""
    from factor_cli.ledger.transcripts import ranges

    have = [f"steps {ranges(index.steps)}" if index.steps else "",
            f"evals after steps {ranges(index.evals)}" if index.evals else ""]  # fmt: skip
    return "; ".join(h for h in have if h)


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
