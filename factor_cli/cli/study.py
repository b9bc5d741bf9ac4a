"""`factor study plan|run|status|report|list` and the shortcuts `factor ablate`, `factor protocol`,
`factor sweep budget|sensitivity|estimators`, `factor transfer` (the library: factor_cli.studies).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from factor_cli.resources import presets_dir

from .common import EXIT_INTERRUPTED, console, err_console, fail, warn

if TYPE_CHECKING:
    from factor_cli.studies.matrix import Matrix
    from factor_cli.studies.state import CellState

app = typer.Typer(
    help=(
        "The paper's experiment matrices from declarative specs (experiments/studies/*.yaml), "
        "launched through submitit (local processes or a Slurm job array), resumable and "
        "deduplicated through the ledger.\n\n"
        "A cell is one `factor train` of a resolved config, keyed by its config hash: re-running "
        "a study skips finished cells and resumes killed or interrupted ones from their last "
        "checkpoint under the same ledger run; two runners of one study never start a cell "
        "twice. `--base smoke` runs any shipped matrix at CPU scale."
    ),
    no_args_is_help=True,
)
sweep_app = typer.Typer(
    help="Continuation-budget, sensitivity and estimator sweeps (`factor study run` on a spec).",
    no_args_is_help=True,
)

# The shipped specs are named from the folder itself, so a new one shows up in --help.
SPEC_HELP = "A shipped study ({}; `factor study list`) or a spec YAML file.".format(
    ", ".join(sorted(p.stem for p in (presets_dir() / "studies").glob("*.yaml")))
)
STATE_STYLE = {
    "finished": "green", "running": "cyan", "stale": "yellow", "killed": "yellow",
    "failed": "red", "pending": "", "invalid": "red",
}  # fmt: skip


# ----------------------------------------------------------------------------- options


def _split(values: list[str]) -> list[str]:
    """``--x a,b --x c`` -> [a, b, c]."""
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _axes(items: list[str]) -> dict[str, list[Any]] | None:
    if not items:
        return None
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip() or not raw.strip():
            fail(f"--axis {item!r}: expected KEY=V1,V2, e.g. --axis model.path=runs/a,runs/b")
        axes[key.strip()] = _axis_values(item, raw)
    return axes


def _axis_values(item: str, raw: str) -> list[Any]:
    """``V1,V2``, or a YAML list ``[V1, V2]`` for values with commas in them (coin's params)."""
    import yaml

    if not raw.strip().startswith("["):
        return [yaml.safe_load(v) for v in _split([raw])]
    try:
        values = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        fail(f"--axis {item!r}: not a YAML list ({str(exc).splitlines()[0]}); quote values "
             "that hold commas, e.g. --axis 'KEY=[\"a=1,b=2\", \"a=3,b=4\"]'")  # fmt: skip
    if not isinstance(values, list) or not values:
        fail(f"--axis {item!r}: expected a non-empty list, e.g. --axis 'KEY=[v1, v2]'")
    return values


def _seeds(values: list[str]) -> list[int] | None:
    if not values:
        return None
    try:
        return [int(v) for v in _split(values)]
    except ValueError:
        fail(f"--seeds {','.join(values)}: seeds are integers, e.g. --seeds 42,43")


def _matrix(
    spec: str,
    base: str | None,
    seeds: list[str],
    envs: list[str],
    rows: list[str],
    axes: list[str],
    overrides: list[str],
) -> Matrix:
    from factor_cli.studies.matrix import Options, expand
    from factor_cli.studies.spec import SpecError, load_spec

    options = Options(
        base=base, seeds=_seeds(seeds), envs=_split(envs) or None, rows=_split(rows) or None,
        overrides=tuple(overrides), axes=_axes(axes),
    )  # fmt: skip
    try:
        loaded, path = load_spec(spec)
        return expand(loaded, path, options)
    except SpecError as exc:
        fail(str(exc))


MATRIX_OPTIONS: dict[str, Any] = {
    "base": typer.Option(None, "--base", help="Preset or YAML every cell starts from "
                         "(default: the spec's, usually paper; smoke for CPU scale)."),
    "seeds": typer.Option([], "--seeds", help="Only these seeds, e.g. 42 or 42,43."),
    "envs": typer.Option([], "--envs", help="These environments instead of the spec's."),
    "rows": typer.Option([], "--rows", help="Only these rows (optional rows need naming)."),
    "axes": typer.Option([], "--axis", help="Replace an axis' values: KEY=V1,V2, or "
                         "KEY='[V1, V2]' (a YAML list) for values with commas in them."),
    "overrides": typer.Option([], "--set", help="Override a field in every cell: KEY=VALUE."),
}  # fmt: skip


def _with_matrix_options(fn: Callable[..., None]) -> Callable[..., None]:
    """Give ``fn`` the matrix options (one definition for every study command)."""
    sig = inspect.signature(fn, eval_str=True)  # typer needs real types, not strings
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                          annotation=str | None if name == "base" else list[str])
        for name, default in MATRIX_OPTIONS.items()
    ]  # fmt: skip
    fn.__signature__ = sig.replace(parameters=[*params, *extra])  # type: ignore[attr-defined]
    return fn


# ----------------------------------------------------------------------------- plan


def _states(matrix: Matrix, stale_after: float = 600.0) -> list[CellState]:
    from factor_cli.studies.state import matrix_states

    return matrix_states(matrix, stale_after)


def _plan_table(matrix: Matrix, states: list[CellState], estimate: dict[str, Any]) -> Table:
    spec = matrix.spec
    table = Table(title=Text(f"{spec.title or spec.name}: {len(states)} cells, base {matrix.base}"))
    common = [f"{k}={v}" for k, v in spec.set.items()] + list(matrix.overrides)
    table.caption = Text("every cell: " + " ".join(common)) if common else None
    for col in ("#", "cell", "method", "env", "seed", "own overrides", "state", "run", "key"):
        table.add_column(col, overflow="fold")
    for i, st in enumerate(states, 1):
        cell = st.cell
        assert cell is not None
        state = Text(st.state, style=STATE_STYLE.get(st.state, ""))
        table.add_row(
            str(i), Text(" + ".join(cell.variants)), cell.method, cell.env, str(cell.seed),
            Text(" ".join(cell.own)), state, (st.run_id or "")[:12], cell.key[:12],
        )  # fmt: skip
    return table


def plan_cmd(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the matrix as JSON."),
    **matrix_opts: Any,
) -> None:
    """The job matrix: one row per cell with its overrides, ledger state and run id, and the
    estimated compute of the pending cells from past runs of the same study variant (row and
    axis point, any seed), else of the same (method, env, base) in any study."""
    import json

    from factor_cli.studies.estimate import estimate_pending

    matrix = _matrix(spec, **matrix_opts)
    states = _states(matrix)
    estimate = estimate_pending(matrix, states)
    if as_json:
        rows = [_cell_json(st) for st in states]
        typer.echo(json.dumps({"study": matrix.spec.name, "base": matrix.base,
                               "spec_hash": matrix.spec_hash, "cells": rows,
                               "estimate": estimate}))  # fmt: skip
        return
    console.print(_plan_table(matrix, states, estimate))
    _print_counts(states)
    _print_estimate(estimate)


def _cell_json(st: CellState) -> dict[str, Any]:
    cell = st.cell
    assert cell is not None
    return {
        "key": cell.key, "label": cell.label, "variants": cell.variants, "rows": list(cell.rows),
        "method": cell.method, "env": cell.env, "seed": cell.seed, "point": cell.point,
        "overrides": cell.overrides, "state": st.state, "run_id": st.run_id,
        "reason": st.reason, "attempts": st.attempts, **st.hours,
    }  # fmt: skip


def _print_counts(states: list[CellState]) -> None:
    counts: dict[str, int] = {}
    for st in states:
        counts[st.state] = counts.get(st.state, 0) + 1
    parts = [f"{n} {s}" for s, n in counts.items()]
    console.print(Text(f"{len(states)} cells: " + ", ".join(parts)))
    invalid = [st for st in states if st.state == "invalid"]
    if invalid:
        warn(f"{len(invalid)} cell(s) cannot run here, e.g. {invalid[0].cell.label}: "  # type: ignore[union-attr]
             f"{invalid[0].reason}")  # fmt: skip


def _print_estimate(estimate: dict[str, Any]) -> None:
    if estimate["pending"] == 0:
        return
    if estimate["known"] == 0:
        console.print(
            Text(
                f"{estimate['pending']} pending cell(s); no past runs of the same "
                "(method, env, base) in the ledger to estimate their cost from"
            )
        )
        return
    console.print(Text(
        f"estimated for {estimate['known']} of {estimate['pending']} pending cell(s), from past "
        f"runs: {estimate['wall_clock_hours']:.2f} wall-clock h, {estimate['node_hours']:.3f} "
        f"node-h, {estimate['cpu_core_hours']:.2f} core-h"
    ))  # fmt: skip


# ----------------------------------------------------------------------------- run


class _LiveRun:
    """The table ``study run`` keeps on screen: counts and the cells in flight."""

    def __init__(self, total: int, launching: int) -> None:
        self.total, self.launching = total, launching
        self.flight: dict[str, float] = {}
        self.done: dict[str, int] = {}
        self.waiting: set[str] = set()

    def event(self, what: str, job: Any, outcome: Any) -> None:
        if what == "start":
            self.flight[job.label] = time.monotonic()
            self.waiting.discard(job.label)
        elif what in ("end", "wait"):
            self.flight.pop(job.label, None)
            if what == "wait":
                self.waiting.add(job.label)
            else:
                self.done[outcome.outcome] = self.done.get(outcome.outcome, 0) + 1
                if outcome.outcome == "failed":
                    err_console.print(Text(f"failed: {job.label}: {outcome.reason}", "red"))
        elif what == "submitted":
            console.print(Text(f"submitted {job.label}: {outcome.reason}"))

    def __rich__(self) -> Table:
        done = sum(self.done.values())
        title = f"{done}/{self.launching} launched cells done ({self.total} in the study)"
        table = Table(title=Text(title))
        table.add_column("cell in flight", overflow="fold")
        table.add_column("elapsed", justify="right")
        now = time.monotonic()
        for label, t0 in self.flight.items():
            table.add_row(Text(label), f"{now - t0:.0f} s")
        for label in sorted(self.waiting):
            table.add_row(Text(label), "held by another runner")
        if self.done:
            table.caption = ", ".join(f"{n} {k}" for k, n in self.done.items())
        return table


def run_cmd(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    launcher: str = typer.Option("local", "--launcher", help="local, slurm or debug."),
    max_parallel: int = typer.Option(2, "--max-parallel", help="Cells at once (Slurm: %N)."),
    gpus_per_job: int = typer.Option(0, "--gpus-per-job", help="GPUs per cell (>1: torchrun)."),
    retry_failed: int = typer.Option(
        0, "--retry-failed", help="Retry a failed cell while it failed at most K times."
    ),
    force: bool = typer.Option(False, "--force", help="Run finished cells again (new runs)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would start; start nothing."),
    stale_after: float = typer.Option(
        600.0, "--stale-after", help="Seconds of silence after which a remote cell is dead."
    ),
    partition: str | None = typer.Option(None, "--partition", help="Slurm partition."),
    account: str | None = typer.Option(None, "--account", help="Slurm account."),
    time_min: int = typer.Option(24 * 60, "--time", help="Slurm time limit per cell (minutes)."),
    cpus_per_task: int | None = typer.Option(None, "--cpus-per-task", help="Slurm CPUs per cell."),
    setup: list[str] = typer.Option([], "--setup", help="Shell line run before each cell."),
    **matrix_opts: Any,
) -> None:
    """Run every cell that is not finished: pending ones start, killed / interrupted ones resume
    from their last checkpoint under the same ledger run, failed ones only with --retry-failed.

    Local: at most --max-parallel cells at a time, each with its own --gpus-per-job GPUs, and a
    live table; Ctrl-C stops the cells (closed KILLED, resumable). Slurm: one job array with
    requeue on the pre-timeout signal; `factor study status` follows it.
    """
    from factor_cli.studies.launch import (
        LaunchOptions,
        SlurmOptions,
        StudyError,
        StudyInterrupted,
        run_study,
    )

    matrix = _matrix(spec, **matrix_opts)
    slurm = SlurmOptions(partition=partition, account=account, time_min=time_min,
                         cpus_per_task=cpus_per_task, setup=tuple(setup))  # fmt: skip
    options = LaunchOptions(
        launcher=launcher, max_parallel=max_parallel, gpus_per_job=gpus_per_job,
        retry_failed=retry_failed, force=force, dry_run=dry_run, stale_after=stale_after,
        slurm=slurm,
    )  # fmt: skip
    from factor_cli.studies.launch import plan_launch

    try:
        plan = plan_launch(matrix, options)
    except StudyError as exc:
        fail(str(exc))
    for line in plan.warnings:
        warn(line)
    _print_counts(plan.states)
    if dry_run or not plan.jobs:
        _print_dry_run(plan) if dry_run else console.print("nothing to start: every cell is done")
        return
    console.print(Text(f"starting {len(plan.jobs)} cell(s) with the {launcher} launcher"))
    live_view = _LiveRun(len(plan.states), len(plan.jobs))
    try:
        with Live(live_view, console=console, refresh_per_second=2, transient=True):
            _, outcomes = run_study(matrix, options, live_view.event, plan=plan)
    except StudyInterrupted as exc:
        err_console.print(Text.assemble(("interrupted", "yellow"), (
            f": stopped {len(exc.cells)} cell(s), each closed KILLED with its checkpoint; "
            f"`factor study run {spec} ...` with the same options resumes them"
        )), soft_wrap=True)  # fmt: skip
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _print_outcomes(outcomes, {job.key: job.label for job in plan.jobs})


def _print_dry_run(plan: Any) -> None:
    for job in plan.jobs:
        console.print(Text(f"would start {job.label}: " + " ".join(job.command(1, None))))


def _print_outcomes(outcomes: list[Any], labels: dict[str, str]) -> None:
    if not outcomes:
        return
    table = Table(title="Cells launched")
    for col in ("cell", "outcome", "attempt", "run", "reason"):
        table.add_column(col, overflow="fold")
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
        style = STATE_STYLE.get(o.outcome, "")
        table.add_row(Text(labels.get(o.key, o.key[:12])), Text(o.outcome, style=style),
                      str(o.attempt or ""), o.run_id or "", Text(o.reason))  # fmt: skip
    table.caption = ", ".join(f"{n} {k}" for k, n in counts.items())
    console.print(table)
    failed = [o for o in outcomes if o.outcome == "failed"]
    if failed:
        fail(f"{len(failed)} cell(s) failed, first: {failed[0].reason} (see `factor study "
             "status`; --retry-failed K retries them)")  # fmt: skip


# ----------------------------------------------------------------------------- status


def _status_table(matrix: Matrix, states: list[CellState]) -> Table:
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for st in states:
        assert st.cell is not None
        for row in st.cell.rows:
            counts = groups.setdefault((row, st.cell.env), {})
            counts[st.state] = counts.get(st.state, 0) + 1
    done = sum(st.state == "finished" for st in states)
    hours = {k: sum(st.hours.get(k, 0.0) for st in states)
             for k in ("node_hours", "cpu_core_hours", "wall_clock_hours")}  # fmt: skip
    title = (f"{matrix.spec.name}: {done}/{len(states)} cells finished; "
             f"{hours['node_hours']:.3f} node-h, {hours['cpu_core_hours']:.2f} core-h, "
             f"{hours['wall_clock_hours']:.2f} wall-clock h spent")  # fmt: skip
    table = Table(title=Text(title))
    for col in ("row", "env", "done", "running", "to resume", "failed", "pending"):
        table.add_column(col)
    for (row, env), c in groups.items():
        total = sum(c.values())
        table.add_row(
            Text(row), env, f"{c.get('finished', 0)}/{total}", str(c.get("running", 0)),
            str(c.get("killed", 0) + c.get("stale", 0)), str(c.get("failed", 0)),
            str(c.get("pending", 0) + c.get("invalid", 0)),
        )  # fmt: skip
    return table


def status_cmd(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    watch: float = typer.Option(0.0, "--watch", help="Refresh every N seconds until done."),
    **matrix_opts: Any,
) -> None:
    """Progress per row and env, the failures with their one-line reasons, compute spent."""
    matrix = _matrix(spec, **matrix_opts)
    if watch <= 0:
        states = _states(matrix)
        console.print(_status_table(matrix, states))
        _print_failures(states)
        return
    with Live(console=console, refresh_per_second=1) as live:
        while True:
            states = _states(matrix)
            live.update(_status_table(matrix, states))
            if all(st.state in ("finished", "failed", "invalid") for st in states):
                break
            time.sleep(watch)
    _print_failures(states)


def _print_failures(states: list[CellState]) -> None:
    for st in states:
        if st.state == "failed":
            assert st.cell is not None
            console.print(Text(f"failed {st.cell.label} ({st.failures} failure(s)): {st.reason}",
                               style="red"))  # fmt: skip
        elif st.state in ("killed", "stale"):
            assert st.cell is not None
            console.print(Text(f"{st.state} {st.cell.label}: run {st.run_id}, resumed by the "
                               "next `factor study run`", style="yellow"))  # fmt: skip


# ----------------------------------------------------------------------------- report


def report_cmd(
    spec: str = typer.Argument(..., help=SPEC_HELP),
    out: str | None = typer.Option(None, "--out", help="Folder (default ledger/reports/STUDY)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap generator seed."),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples."),
    **matrix_opts: Any,
) -> None:
    """The paper-layout table of the finished cells (saying which are missing), the hierarchical
    bootstrap of the subject vs the reference per env, seed-by-seed wins and the cost table;
    written as Markdown, CSV and PNG under ledger/reports/STUDY/ and printed."""
    from pathlib import Path

    from factor_cli.ledger import LedgerError
    from factor_cli.ledger.report import version_warnings
    from factor_cli.ledger.store import project_root
    from factor_cli.studies.report import build_report, write_report
    from factor_cli.studies.results import gather

    from .study_report import render

    matrix = _matrix(spec, **matrix_opts)
    states = _states(matrix)
    results = gather(matrix, states)
    report = build_report(matrix, results, seed=seed, resamples=resamples)
    try:
        for line in version_warnings(matrix.spec.name, matrix.tracking_uri):
            warn(line)
    except LedgerError:  # no ledger yet: the report itself says which cells are missing
        pass
    folder = Path(out) if out else project_root() / "ledger" / "reports" / matrix.spec.name
    files = write_report(report, folder)
    render(report, console)
    console.print(Text(f"written: {', '.join(str(f) for f in files)}"), soft_wrap=True)


def list_cmd() -> None:
    """The shipped study specs."""
    from factor_cli.studies.spec import load_spec, shipped_specs

    table = Table(title="Shipped studies (experiments/studies/)")
    for col in ("study", "title", "base", "rows", "axes", "envs", "seeds"):
        table.add_column(col, overflow="fold")
    for name in shipped_specs():
        spec, _ = load_spec(name)
        table.add_row(
            name, Text(spec.title), spec.base, str(len(spec.rows)),
            Text(", ".join(spec.axes) or "-"), ", ".join(spec.envs),
            ", ".join(map(str, spec.seeds)),
        )  # fmt: skip
    console.print(table)


# ----------------------------------------------------------------------------- registration

app.command("list")(list_cmd)
app.command("plan")(_with_matrix_options(plan_cmd))
app.command("run")(_with_matrix_options(run_cmd))
app.command("status")(_with_matrix_options(status_cmd))
app.command("report")(_with_matrix_options(report_cmd))


def shortcut(spec_name: str, summary: str) -> Callable[..., None]:
    """``factor <shortcut> [options]`` = ``factor study run <spec_name> [options]``."""

    def command(**kwargs: Any) -> None:
        run_cmd(spec=spec_name, **kwargs)

    sig = inspect.signature(run_cmd)  # with the matrix options (registered above)
    command.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p for name, p in sig.parameters.items() if name != "spec"]
    )
    command.__doc__ = f"{summary}: `factor study run {spec_name}` with the same options."
    return command


SHORTCUTS = {
    "ablate": ("ablations", "Table 4's eleven ablation rows"),
    "protocol": ("protocol", "Table 2's reduction x temperature x method study"),
    "transfer": ("transfer", "Table 3's cross-backbone transfer (--axis model.path=...)"),
}
SWEEPS = {
    "budget": ("budget", "Tables 5/10: continuation budget B x M"),
    "sensitivity": ("sensitivity", "Tables 11-14: eta_0, tau, d and warm-up, one at a time"),
    "estimators": ("estimators", "Table 25: alternative credit estimators"),
}
for _name, (_spec, _summary) in SWEEPS.items():
    sweep_app.command(_name)(shortcut(_spec, _summary))
