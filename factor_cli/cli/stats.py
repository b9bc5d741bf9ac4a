"""`factor stats`: hierarchical bootstrap, item-level tests, aggregates, tables and plots.

A thin shell: parse the options into a request, call :mod:`factor_cli.stats.report` (or a
:data:`~factor_cli.stats.TABLES` layout), render the report with rich. numpy, pandas, scipy and
matplotlib are imported inside the commands, so ``factor --help`` does not load them. Bad input
is one line on stderr (``error: FILE: what is wrong and how to fix it``) and exit code 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table as RichTable

from .common import console, fail, warn

if TYPE_CHECKING:
    import pandas as pd

    from factor_cli.stats.report import (
        AggregateReport,
        BootstrapReport,
        BootstrapRequest,
        ItemTestsReport,
    )
    from factor_cli.stats.tables import Table

app = typer.Typer(
    rich_markup_mode="markdown",
    help=(
        "Statistics on item-level evaluation results: hierarchical (seed -> item) bootstrap, "
        "paired item tests, rliable-style aggregates, the paper's tables and plots.\n\n"
        "Results files (CSV or Parquet) hold one row per (env, method, seed, evaluation item) "
        "with columns env, method, seed, item_id, category, success (0/1), score. The metric of "
        "a run is the unweighted macro average of its per-category success rates."
    ),
    no_args_is_help=True,
)
plot_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Write figures as PNG: training curves, ablation deltas, bootstrap distribution, "
    "performance profiles.",
    no_args_is_help=True,
)
app.add_typer(plot_app, name="plot")

# ----------------------------------------------------------------------------- options

InputOpt = Annotated[
    Path,
    typer.Option(
        "--input",
        "-i",
        help="Item-level results file (.csv, .csv.gz, .tsv, .parquet).",
        show_default=False,
    ),
]
EnvOpt = Annotated[str, typer.Option("--env", "-e", help="Environment to analyse.")]
MethodOpt = Annotated[str, typer.Option("--method", "-m", help="Method A (the one tested).")]
BaselineOpt = Annotated[str, typer.Option("--baseline", "-b", help="Method B (the comparison).")]
ReplicatesOpt = Annotated[
    int, typer.Option("--replicates", "-r", help="Number of bootstrap replicates.")
]
RngSeedOpt = Annotated[
    int, typer.Option("--seed", help="Seed of the bootstrap's random generator.")
]
ConfidenceOpt = Annotated[
    float, typer.Option("--confidence", help="Level of the percentile interval, in (0, 1).")
]
WhereOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        "-w",
        help="Keep only rows with COLUMN=VALUE (repeatable), e.g. --where reduction=action-mean.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
EnvsOpt = Annotated[
    list[str] | None,
    typer.Option("--env", "-e", help="Environment(s) to include, in order (default: all)."),
]
MethodsOpt = Annotated[
    list[str] | None,
    typer.Option("--method", "-m", help="Method(s) to include, in order (default: all)."),
]
OutputPng = Annotated[
    Path, typer.Option("--output", "-o", help="Output PNG file.", show_default=False)
]

# ----------------------------------------------------------------------------- helpers


@contextmanager
def _user_errors(source: Path | None = None) -> Iterator[None]:
    """Turn the library's ValueErrors into one-line errors (exit 1), prefixed by the file.

    A :class:`~factor_cli.stats.tables.TableOptionError` blames an option, not the file, so it
    keeps no prefix.
    """
    try:
        yield
    except ValueError as exc:
        from factor_cli.stats.tables import TableOptionError

        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid input"
        about_file = source is not None and not isinstance(exc, TableOptionError)
        # The path may stand in the fix (an iconv hint) without saying where the error is.
        if about_file and str(source) not in message.split(";")[0]:
            message = f"{source}: {message}"
        fail(message)


def _load(path: Path, where: Sequence[str] | None) -> pd.DataFrame:
    """Read, filter (--where) and validate an item-level results file."""
    from factor_cli.stats.report import load_results

    with _user_errors(path):
        frame = load_results(path, where or [])
    _warn_versions(frame, path)
    return frame


def _warn_versions(frame: pd.DataFrame, path: Path) -> None:
    """Warn, naming the package, when the ledger runs an items file came from (its ``run_id``
    column, as ``factor ledger export`` writes it) recorded different versions."""
    if "run_id" not in frame.columns:
        return
    from factor_cli.ledger.report import run_version_warnings

    ids = [str(r) for r in frame["run_id"].dropna().unique()]
    for line in run_version_warnings(ids, str(path)):
        warn(line)


def _check_bootstrap_args(replicates: int, confidence: float) -> None:
    if replicates < 1:
        fail(f"--replicates must be at least 1, got {replicates}")
    if not 0.0 < confidence < 1.0:
        fail(f"--confidence must lie strictly between 0 and 1, got {confidence}")


def _choice(option: str, value: str, valid: Sequence[str]) -> str:
    if value not in valid:
        fail(f"{option} {value!r} is not valid; choose one of: {', '.join(valid)}")
    return value


def _print_json(payload: dict[str, Any]) -> None:
    from factor_cli.stats.report import jsonable

    typer.echo(json.dumps(jsonable(payload), indent=2, allow_nan=False))


def _p(value: float) -> str:
    if not math.isfinite(value):
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


# ----------------------------------------------------------------------------- bootstrap


def _run_bootstrap(
    input: Path, where: Sequence[str] | None, request: BootstrapRequest
) -> BootstrapReport:
    """Load, bootstrap, and show the report's warnings (one line each on stderr)."""
    from factor_cli.stats.report import bootstrap_report

    _check_bootstrap_args(request.replicates, request.confidence)
    results = _load(input, where)
    with _user_errors(input):
        report = bootstrap_report(results, request)
    for message in report.warnings:
        warn(message)
    return report


def _render_bootstrap(report: BootstrapReport) -> None:
    q, res = report.request, report.result
    level = f"{100 * res.confidence:g}%"
    table = RichTable(title=escape(f"{q.method} - {q.baseline} on {q.env} (macro success, pp)"))
    for name in ("point (pp)", f"{level} CI (pp)", "P(Δ > 0)", "replicates", "seeds"):
        table.add_column(name, justify="right")
    table.add_row(
        f"{100 * res.point:+.2f}",
        f"[{100 * res.ci_low:+.2f}, {100 * res.ci_high:+.2f}]",
        f"{res.p_positive:.4f}",
        str(res.replicates),
        str(len(report.runs)),
    )
    console.print(table)
    seeds = RichTable(title="per-seed differences")
    for name in ("seed", "items", "categories", "Δ (pp)"):
        seeds.add_column(name, justify="right")
    for r, d in zip(report.runs, res.per_seed, strict=True):
        seeds.add_row(str(r.seed), str(r.diff.size), str(len(set(r.category))), f"{100 * d:+.2f}")
    console.print(seeds)


@app.command()
def bootstrap(
    input: InputOpt,
    env: EnvOpt,
    method: MethodOpt,
    baseline: BaselineOpt,
    replicates: ReplicatesOpt = 10_000,
    seed: RngSeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    where: WhereOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Hierarchical bootstrap of the macro-metric difference A - B on one environment.

    Each replicate resamples the training seeds with replacement, then, within every resampled
    seed, the evaluation items with replacement inside each category (A and B stay paired; every
    category keeps its size), and averages the per-seed macro differences. Reports the point
    estimate (mean over seeds of the per-seed difference) and the percentile CI in percentage
    points, P(Delta > 0) as a fraction, and the per-seed differences. With a single seed the CI
    ignores seed-to-seed variance (a warning on stderr says so).
    """
    from factor_cli.stats.report import BootstrapRequest

    request = BootstrapRequest(env, method, baseline, replicates, seed, confidence)
    report = _run_bootstrap(input, where, request)
    if as_json:
        _print_json(report.as_json())
    else:
        _render_bootstrap(report)


# ----------------------------------------------------------------------------- tests


def _render_item_tests(report: ItemTestsReport) -> None:
    q, res = report.request, report.tests
    strat, wil = res.stratified, res.wilcoxon
    table = RichTable(title=escape(f"{q.method} vs {q.baseline} on {q.env}, seed {q.seed}"))
    table.add_column("test")
    table.add_column("statistic", justify="right")
    table.add_column("p", justify="right")
    table.add_row("discordant pairs", f"wins {res.wins} / losses {res.losses}", "")
    table.add_row(
        "McNemar (continuity-corrected)", f"χ² = {res.mcnemar_chi2:.3f}", _p(res.mcnemar_p)
    )
    table.add_row("McNemar exact (binomial)", "", _p(res.mcnemar_exact_p))
    table.add_row(
        "stratified McNemar (macro)",
        f"Δ = {100 * strat.estimate:+.2f} pp, χ² = {strat.chi2:.3f}",
        _p(strat.p),
    )
    table.add_row("stratified McNemar exact", "", _p(strat.exact_p))
    table.add_row(
        f"Wilcoxon signed-rank ({q.wilcoxon_on})",
        f"W = {wil.statistic:g} (n = {wil.n}, {wil.method})",
        _p(wil.p),
    )
    console.print(table)
    cats = RichTable(title="per category (stratified McNemar)")
    for name in ("category", "items", "wins", "losses", "weight 1/(C n_c)"):
        cats.add_column(name, justify="left" if name == "category" else "right")
    for c in report.categories:
        cats.add_row(escape(c.category), str(c.n), str(c.wins), str(c.losses), f"{c.weight:.5f}")
    console.print(cats)


@app.command()
def tests(
    input: InputOpt,
    env: EnvOpt,
    method: MethodOpt,
    baseline: BaselineOpt,
    seed: Annotated[
        int, typer.Option("--seed", "-s", help="Training seed whose items are compared.")
    ],
    wilcoxon_on: Annotated[
        str, typer.Option("--wilcoxon-on", help="Column the Wilcoxon test uses: score or success.")
    ] = "score",
    where: WhereOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Item-level paired tests of A against B within one training seed (descriptive).

    Discordant counts (wins: A succeeds and B fails; losses: the reverse); McNemar chi-square
    with continuity correction and its exact binomial version; a category-stratified McNemar
    test whose statistic is the macro difference itself (each category weighted 1/C as in the
    metric; exact conditional p-value too); Wilcoxon signed-rank on the paired scores.
    """
    from factor_cli.stats.report import WILCOXON_ON, ItemTestsRequest, item_tests_report

    _choice("--wilcoxon-on", wilcoxon_on, WILCOXON_ON)
    results = _load(input, where)
    with _user_errors(input):
        report = item_tests_report(
            results, ItemTestsRequest(env, method, baseline, seed, wilcoxon_on)
        )
    if as_json:
        _print_json(report.as_json())
    else:
        _render_item_tests(report)


# ----------------------------------------------------------------------------- aggregate


def _render_aggregates(report: AggregateReport) -> None:
    q = report.request
    level = f"{100 * q.confidence:g}%"
    table = RichTable(
        title=f"Aggregates over {len(report.tasks)} task(s) ({q.tasks}), "
        f"{level} stratified-bootstrap CIs",
        caption="Scores in %; P(A > B) as a probability.",
    )
    table.add_column("method")
    table.add_column("runs", justify="right")
    for name in report.aggregates:
        table.add_column(name.replace("_", " "), justify="right")
    if q.baseline is not None:
        table.add_column(escape(f"P(method > {q.baseline})"), justify="right")
    for m, agg in report.methods.items():
        cells = [escape(m), str(agg.runs)]
        cells += [f"{e.point:.1f} [{e.low:.1f}, {e.high:.1f}]" for e in agg.percent.values()]
        if q.baseline is not None:
            poi = agg.improvement
            cells.append("—" if poi is None else f"{poi.point:.2f} [{poi.low:.2f}, {poi.high:.2f}]")
        table.add_row(*cells)
    console.print(table)


@app.command()
def aggregate(
    input: InputOpt,
    methods: MethodsOpt = None,
    envs: EnvsOpt = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", "-b", help="Also report P(method > baseline) for each method."),
    ] = None,
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks",
            help="What a task is: env (macro metric per env) or category "
            "(success rate per env/category cell).",
        ),
    ] = "env",
    replicates: ReplicatesOpt = 10_000,
    seed: RngSeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    where: WhereOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """rliable-style aggregates over the (seeds x tasks) score matrix of each method.

    IQM (mean of the middle 50% of all run x task scores), mean, median and optimality gap
    (mean shortfall from 100%), in percent, each with a stratified-bootstrap percentile CI
    (runs resampled with replacement independently per task). With --baseline, the probability
    of improvement P(method > baseline): the chance that a run of the method beats a run of the
    baseline on a random task (ties count 1/2), with its CI.
    """
    from factor_cli.stats.report import TASK_KINDS, AggregateRequest, aggregate_report

    _choice("--tasks", tasks, TASK_KINDS)
    _check_bootstrap_args(replicates, confidence)
    results = _load(input, where)
    request = AggregateRequest(methods, envs, baseline, tasks, replicates, seed, confidence)
    with _user_errors(input):
        report = aggregate_report(results, request)
    if as_json:
        _print_json(report.as_json())
    else:
        _render_aggregates(report)


# ----------------------------------------------------------------------------- table


def rich_table(table: Table) -> RichTable:
    from factor_cli.stats.tables import cell_text, numeric_columns

    out = RichTable(title=escape(table.title), caption=escape(table.caption))
    for name, num in zip(table.columns, numeric_columns(table), strict=True):
        out.add_column(escape(name), justify="right" if num else "left", overflow="fold")
    for row in table.rows:
        cells = []
        for c in row:
            text = escape(cell_text(c, table.decimals, "plain"))
            cells.append(f"[bold]{text}[/bold]" if c.bold else text)
        out.add_row(*cells)
    return out


def _category_env(option: str | None) -> str | None:
    """--category-env: unset -> the layout's automatic choice, 'none' -> no category columns."""
    from factor_cli.stats.tables import AUTO

    if option is None:
        return AUTO
    return None if option.lower() == "none" else option


def _write_export(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{output}: cannot write the table: {exc.strerror or exc}")
    console.print(f"wrote {escape(str(output))}")


@app.command()
def table(
    kind: Annotated[
        str,
        typer.Argument(
            help="Layout: main (Table 1), ablation (Table 4), protocol (Table 2), "
            "budget (Table 5) or transfer (Table 3).",
            show_default=False,
        ),
    ],
    input: InputOpt,
    envs: EnvsOpt = None,
    methods: MethodsOpt = None,
    reference: Annotated[
        str | None, typer.Option("--reference", help="ablation: the full method Δ refers to.")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option("--baseline", "-b", help="budget: the method gains refer to.")
    ] = None,
    category_env: Annotated[
        str | None,
        typer.Option(
            "--category-env",
            help="main: env whose categories get columns "
            "(default: alfworld when present; 'none' for no category columns).",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group-column",
            help="protocol / transfer / budget: the study column "
            "(default: reduction / backbone / budget).",
        ),
    ] = None,
    default_budget: Annotated[
        str | None, typer.Option("--default-budget", help="budget: label marked (default).")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="rich (terminal), csv, markdown or latex.")
    ] = "rich",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the export to this file.")
    ] = None,
    decimals: Annotated[int, typer.Option("--decimals", help="Decimals shown.")] = 1,
    where: WhereOpt = None,
) -> None:
    """The paper's result tables from an item-level results file.

    Cells are the macro success rate in percent: mean ± sample standard deviation over seeds.
    main: one row per method, the category columns of one env, then each env. ablation: adds
    Δ-vs-reference columns (pp), reference in bold. protocol / transfer: one row per (study
    value, method), from a study column such as reduction or backbone. budget: one row per
    continuation budget (column budget, e.g. 2x4) of one method: cost ratios from the optional
    run-level columns interactions and wall_clock, and the gain over --baseline in pp. Bold
    marks the best shown value (per backbone for transfer).
    """
    from factor_cli.stats.report import load_results
    from factor_cli.stats.tables import EXPORTS, TABLES, TableRequest

    layout = TABLES.get(_choice("table kind", kind, TABLES.names()))
    fmt = _choice("--format", fmt, ("rich", *EXPORTS.names()))
    if decimals < 0:
        fail(f"--decimals must be >= 0, got {decimals}")
    with _user_errors(input):
        results = load_results(input, where or [], layout.run_keys(group), layout.example)
        built = layout(
            TableRequest(
                results,
                envs=envs,
                methods=methods,
                reference=reference,
                baseline=baseline,
                category_env=_category_env(category_env),
                group=group,
                default_budget=default_budget,
                decimals=decimals,
            )
        )
    if fmt == "rich":
        if output is not None:
            *others, last = EXPORTS.names()
            fail(f"--output needs --format {', '.join(others)} or {last}")
        console.print(rich_table(built))
        return
    _write_export(EXPORTS.get(fmt)(built), output)


# ----------------------------------------------------------------------------- plots


def _plots() -> ModuleType:
    """matplotlib is imported only by the plot commands (it costs ~0.5 s at start-up)."""
    from factor_cli.stats import plots

    return plots


def _png(output: Path) -> Path:
    with _user_errors():
        return _plots().check_output(output)


@plot_app.command("curves")
def plot_curves(
    metrics: Annotated[
        Path,
        typer.Option(
            "--metrics",
            help="Training-metrics file: columns method, seed, step "
            "and the metric (optionally env).",
            show_default=False,
        ),
    ],
    output: OutputPng,
    metric: Annotated[str, typer.Option("--metric", help="Metric column to plot.")] = "reward",
    env: Annotated[
        str | None, typer.Option("--env", "-e", help="Keep one env (needs an env column).")
    ] = None,
    methods: MethodsOpt = None,
    band: Annotated[
        str, typer.Option("--band", help="Seed band: std (± sample std), minmax or none.")
    ] = "std",
    smooth: Annotated[
        int, typer.Option("--smooth", help="Moving-average window over steps, per seed.")
    ] = 1,
) -> None:
    """Training curves: mean over seeds per method, with a seed band."""
    from factor_cli.stats.report import load_metrics

    _choice("--band", band, _plots().BANDS)
    if smooth < 1:
        fail(f"--smooth must be at least 1, got {smooth}")
    out = _png(output)
    with _user_errors(metrics):
        frame = load_metrics(metrics, metric, env, methods)
    title = f"{metric}{f' on {env}' if env else ''}"
    _plots().training_curves(frame, metric, out, band, smooth, title)
    console.print(f"wrote {escape(str(out))}")


@plot_app.command("ablation")
def plot_ablation(
    input: InputOpt,
    reference: Annotated[str, typer.Option("--reference", help="The full method Δ refers to.")],
    output: OutputPng,
    envs: EnvsOpt = None,
    methods: MethodsOpt = None,
    where: WhereOpt = None,
) -> None:
    """Bar chart of Δ = mean macro success(method) - mean(reference), pp, per env."""
    from factor_cli.stats.report import ablation_deltas

    out = _png(output)
    results = _load(input, where)
    with _user_errors(input):
        deltas = ablation_deltas(results, reference, envs, methods)
    _plots().ablation_deltas(deltas, reference, out)
    console.print(f"wrote {escape(str(out))}")


@plot_app.command("bootstrap")
def plot_bootstrap(
    input: InputOpt,
    env: EnvOpt,
    method: MethodOpt,
    baseline: BaselineOpt,
    output: OutputPng,
    replicates: ReplicatesOpt = 10_000,
    seed: RngSeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    where: WhereOpt = None,
) -> None:
    """Histogram of the hierarchical-bootstrap distribution of A - B with CI and point."""
    from factor_cli.stats.report import BootstrapRequest

    out = _png(output)
    request = BootstrapRequest(env, method, baseline, replicates, seed, confidence)
    res = _run_bootstrap(input, where, request).result
    _plots().bootstrap_distribution(
        100.0 * res.distribution,
        100.0 * res.point,
        (100.0 * res.ci_low, 100.0 * res.ci_high),
        res.p_positive,
        out,
        title=f"{method} - {baseline} on {env}: P(Δ > 0) = {res.p_positive:.3f}",
    )
    console.print(f"wrote {escape(str(out))}")


@plot_app.command("profile")
def plot_profile(
    input: InputOpt,
    output: OutputPng,
    methods: MethodsOpt = None,
    envs: EnvsOpt = None,
    tasks: Annotated[
        str, typer.Option("--tasks", help="What a task is: env or category.")
    ] = "category",
    replicates: ReplicatesOpt = 2_000,
    seed: RngSeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    where: WhereOpt = None,
) -> None:
    """Performance profiles: fraction of run x task scores above each threshold, with bands."""
    from factor_cli.stats.report import TASK_KINDS, ProfileRequest, profile_report

    _choice("--tasks", tasks, TASK_KINDS)
    _check_bootstrap_args(replicates, confidence)
    out = _png(output)
    results = _load(input, where)
    request = ProfileRequest(methods, envs, tasks, replicates, seed, confidence)
    with _user_errors(input):
        report = profile_report(results, request)
    profiles = {m: (e.point, e.low, e.high) for m, e in report.profiles.items()}
    _plots().performance_profiles(
        report.taus,
        profiles,
        out,
        xlabel="success-rate threshold τ",
        title=f"Performance profiles ({len(report.tasks)} {tasks} tasks)",
    )
    console.print(f"wrote {escape(str(out))}")
