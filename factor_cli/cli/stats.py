"""`factor stats`: hierarchical bootstrap, item-level tests, aggregates, tables and plots.

Thin layer: read and validate files, call ``factor_cli.stats``, render with rich. Bad input is
one line on stderr (``error: FILE: what is wrong and how to fix it``) and exit code 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer
from rich.markup import escape
from rich.table import Table as RichTable

from factor_cli import stats as st
from factor_cli.stats.tables import cell_text, numeric_columns

from .common import console, fail

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

TASK_KINDS = ("env", "category")
FORMATS = ("rich", "csv", "markdown", "latex")
DEFAULT_GROUP = {"protocol": "reduction", "transfer": "backbone", "budget": "budget"}

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
    """Turn the library's ValueErrors into one-line errors (exit 1), prefixed by the file."""
    try:
        yield
    except ValueError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid input"
        if source is not None and str(source) not in message:
            message = f"{source}: {message}"
        fail(escape(message))


_STUDY_EXAMPLES = {"reduction": "token-mean", "backbone": "qwen2.5-7b", "budget": "2x4"}


def _load(path: Path, where: Sequence[str] | None, run_keys: Sequence[str] = ()) -> pd.DataFrame:
    """Read, filter (--where) and validate a results file; ``run_keys`` are study columns."""
    with _user_errors(path):
        frame = st.read_frame(path)
    for key in run_keys:
        if key not in frame.columns:
            example = _STUDY_EXAMPLES.get(key, "one value per run")
            fail(
                escape(
                    f"{path}: this table needs the study column {key!r} (e.g. {example}); "
                    f"add it, or pass --group-column NAME if yours is called differently"
                )
            )
    with _user_errors(path):
        frame = st.filter_rows(frame, where or [])
        return st.validate_results(frame, run_keys)


def _check_bootstrap_args(replicates: int, confidence: float) -> None:
    if replicates < 1:
        fail(f"--replicates must be at least 1, got {replicates}")
    if not 0.0 < confidence < 1.0:
        fail(f"--confidence must lie strictly between 0 and 1, got {confidence}")


def _choice(option: str, value: str, valid: Sequence[str]) -> str:
    if value not in valid:
        fail(escape(f"{option} {value!r} is not valid; choose one of: {', '.join(valid)}"))
    return value


def _clean(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN / inf to null."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_clean(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _print_json(payload: dict[str, Any]) -> None:
    typer.echo(json.dumps(_clean(payload), indent=2, allow_nan=False))


def _p(value: float) -> str:
    if not math.isfinite(value):
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


# ----------------------------------------------------------------------------- bootstrap


def _run_bootstrap(
    input: Path,
    env: str,
    method: str,
    baseline: str,
    where: Sequence[str] | None,
    replicates: int,
    seed: int,
    confidence: float,
) -> tuple[list[st.PairedRun], st.BootstrapResult]:
    _check_bootstrap_args(replicates, confidence)
    results = _load(input, where)
    with _user_errors(input):
        runs = st.paired_runs(results, env, method, baseline)
    result = st.hierarchical_bootstrap(
        [r.diff for r in runs],
        [r.category for r in runs],
        replicates,
        np.random.default_rng(seed),
        confidence,
    )
    return runs, result


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
    points, P(Delta > 0) as a fraction, and the per-seed differences.
    """
    runs, res = _run_bootstrap(input, env, method, baseline, where, replicates, seed, confidence)
    per_seed = {str(r.seed): 100.0 * d for r, d in zip(runs, res.per_seed, strict=True)}
    if as_json:
        _print_json(
            {
                "env": env,
                "method": method,
                "baseline": baseline,
                "point": 100.0 * res.point,
                "ci_low": 100.0 * res.ci_low,
                "ci_high": 100.0 * res.ci_high,
                "p_positive": res.p_positive,
                "replicates": res.replicates,
                "per_seed": per_seed,
                "confidence": res.confidence,
                "rng_seed": seed,
            }
        )
        return
    level = f"{100 * res.confidence:g}%"
    table = RichTable(title=escape(f"{method} - {baseline} on {env} (macro success, pp)"))
    for name in ("point (pp)", f"{level} CI (pp)", "P(Δ > 0)", "replicates", "seeds"):
        table.add_column(name, justify="right")
    table.add_row(
        f"{100 * res.point:+.2f}",
        f"[{100 * res.ci_low:+.2f}, {100 * res.ci_high:+.2f}]",
        f"{res.p_positive:.4f}",
        str(res.replicates),
        str(len(runs)),
    )
    console.print(table)
    seeds = RichTable(title="per-seed differences")
    for name in ("seed", "items", "categories", "Δ (pp)"):
        seeds.add_column(name, justify="right")
    for r, d in zip(runs, res.per_seed, strict=True):
        seeds.add_row(str(r.seed), str(r.diff.size), str(len(set(r.category))), f"{100 * d:+.2f}")
    console.print(seeds)


# ----------------------------------------------------------------------------- tests


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
    _choice("--wilcoxon-on", wilcoxon_on, ("score", "success"))
    results = _load(input, where)
    with _user_errors(input):
        (run,) = st.paired_runs(results, env, method, baseline, seeds=[seed])
    x, y = (run.score_a, run.score_b) if wilcoxon_on == "score" else (run.success_a, run.success_b)
    res = st.paired_tests(run.success_a, run.success_b, run.category, x, y)
    strat, wil = res.stratified, res.wilcoxon
    categories = [
        {"category": str(c), "n": int(n), "wins": int(w), "losses": int(lo), "weight": float(wt)}
        for c, n, w, lo, wt in zip(
            strat.categories, strat.n, strat.wins, strat.losses, strat.weights, strict=True
        )
    ]
    payload = {
        "env": env,
        "method": method,
        "baseline": baseline,
        "seed": seed,
        "n_items": res.n_items,
        "wins": res.wins,
        "losses": res.losses,
        "mcnemar_chi2": res.mcnemar_chi2,
        "mcnemar_p": res.mcnemar_p,
        "mcnemar_exact_p": res.mcnemar_exact_p,
        "stratified_macro_diff": 100.0 * strat.estimate,
        "stratified_se": 100.0 * strat.se0,
        "stratified_chi2": strat.chi2,
        "stratified_p": strat.p,
        "stratified_exact_p": strat.exact_p,
        "wilcoxon_on": wilcoxon_on,
        "wilcoxon_stat": wil.statistic,
        "wilcoxon_p": wil.p,
        "wilcoxon_n": wil.n,
        "wilcoxon_method": wil.method,
        "categories": categories,
    }
    if as_json:
        _print_json(payload)
        return
    table = RichTable(title=escape(f"{method} vs {baseline} on {env}, seed {seed}"))
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
        f"Wilcoxon signed-rank ({wilcoxon_on})",
        f"W = {wil.statistic:g} (n = {wil.n}, {wil.method})",
        _p(wil.p),
    )
    console.print(table)
    cats = RichTable(title="per category (stratified McNemar)")
    for name in ("category", "items", "wins", "losses", "weight 1/(C n_c)"):
        cats.add_column(name, justify="left" if name == "category" else "right")
    for c in categories:
        cats.add_row(
            escape(c["category"]),
            str(c["n"]),
            str(c["wins"]),
            str(c["losses"]),
            f"{c['weight']:.5f}",
        )
    console.print(cats)


# ----------------------------------------------------------------------------- aggregate


def _task_scores(
    results: pd.DataFrame, tasks: str, envs: Sequence[str] | None
) -> tuple[pd.DataFrame, list[str]]:
    """Per-run scores in long form (method, seed, task, score) and the task order."""
    env_list = list(dict.fromkeys(results["env"])) if not envs else list(envs)
    for e in env_list:
        st.require_value(results, "env", e)
    rows = results.loc[results["env"].isin(env_list)]
    if tasks == "env":
        runs = st.run_metrics(rows).rename(columns={"env": "task", "metric": "score"})
        order = env_list
    else:
        runs = st.category_rates(rows).rename(columns={"rate": "score"})
        runs["task"] = runs["env"] + "/" + runs["category"].astype(str)
        order = list(dict.fromkeys(runs["task"]))
    return runs[["method", "seed", "task", "score"]], order


def _matrices(
    long: pd.DataFrame, tasks: list[str], methods: Sequence[str] | None
) -> dict[str, np.ndarray]:
    names = list(dict.fromkeys(long["method"])) if not methods else list(methods)
    out = {}
    for m in names:
        st.require_value(long, "method", m)
        rows = long.loc[long["method"] == m]
        try:
            out[m], _ = st.score_matrix(rows, "score", "task", tasks)
        except ValueError as exc:
            raise ValueError(f"method {m!r}: {exc}") from None
    return out


AGGREGATE_NAMES = ("iqm", "mean", "median", "optimality_gap")


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
    _choice("--tasks", tasks, TASK_KINDS)
    _check_bootstrap_args(replicates, confidence)
    results = _load(input, where)
    with _user_errors(input):
        long, order = _task_scores(results, tasks, envs)
        mats = _matrices(long, order, methods)
        if baseline is not None and baseline not in mats:
            mats_b = _matrices(long, order, [baseline])
        else:
            mats_b = {}
    rng = np.random.default_rng(seed)
    report: dict[str, dict[str, Any]] = {}
    for m, x in mats.items():
        entry: dict[str, Any] = {"runs": int(x.shape[0])}
        for name in AGGREGATE_NAMES:
            est = st.interval_estimate([x], st.AGGREGATES.get(name), replicates, rng, confidence)
            entry[name] = {k: 100.0 * getattr(est, k) for k in ("point", "low", "high")}
        if baseline is not None and m != baseline:
            y = mats.get(baseline, mats_b.get(baseline))
            est = st.interval_estimate(
                [x, y], st.probability_of_improvement, replicates, rng, confidence
            )
            entry["probability_of_improvement"] = {
                "point": est.point,
                "low": est.low,
                "high": est.high,
            }
        report[m] = entry
    if as_json:
        _print_json(
            {
                "tasks": order,
                "task_kind": tasks,
                "baseline": baseline,
                "replicates": replicates,
                "confidence": confidence,
                "rng_seed": seed,
                "methods": report,
            }
        )
        return
    level = f"{100 * confidence:g}%"
    table = RichTable(
        title=f"Aggregates over {len(order)} task(s) ({tasks}), {level} stratified-bootstrap CIs",
        caption="Scores in %; P(A > B) as a probability.",
    )
    table.add_column("method")
    table.add_column("runs", justify="right")
    for name in AGGREGATE_NAMES:
        table.add_column(name.replace("_", " "), justify="right")
    if baseline is not None:
        table.add_column(escape(f"P(method > {baseline})"), justify="right")
    for m, entry in report.items():
        cells = [escape(m), str(entry["runs"])]
        for name in AGGREGATE_NAMES:
            e = entry[name]
            cells.append(f"{e['point']:.1f} [{e['low']:.1f}, {e['high']:.1f}]")
        if baseline is not None:
            poi = entry.get("probability_of_improvement")
            cells.append(
                "—" if poi is None else f"{poi['point']:.2f} [{poi['low']:.2f}, {poi['high']:.2f}]"
            )
        table.add_row(*cells)
    console.print(table)


# ----------------------------------------------------------------------------- table


def _rich_table(table: st.Table) -> RichTable:
    out = RichTable(title=escape(table.title), caption=escape(table.caption))
    for name, num in zip(table.columns, numeric_columns(table), strict=True):
        out.add_column(escape(name), justify="right" if num else "left")
    for row in table.rows:
        cells = []
        for c in row:
            text = escape(cell_text(c, table.decimals, "plain"))
            cells.append(f"[bold]{text}[/bold]" if c.bold else text)
        out.add_row(*cells)
    return out


def _build_table(
    kind: str,
    results: pd.DataFrame,
    envs: list[str] | None,
    methods: list[str] | None,
    reference: str | None,
    baseline: str | None,
    category_env: str | None,
    group: str,
    default_budget: str | None,
    decimals: int,
) -> st.Table:
    if kind == "main":
        if category_env is None:
            category_env = "alfworld" if "alfworld" in set(results["env"]) else None
        elif category_env.lower() == "none":
            category_env = None
        return st.TABLES.get("main")(results, envs, methods, category_env, decimals)
    if kind == "ablation":
        if reference is None:
            fail(
                "table ablation needs --reference METHOD (the full method the Δ columns "
                "compare against)"
            )
        return st.TABLES.get("ablation")(results, reference, envs, methods, decimals)
    if kind in ("protocol", "transfer"):
        return st.TABLES.get(kind)(results, group, envs, methods, decimals)
    if not methods or len(methods) != 1 or baseline is None:
        fail(
            "table budget needs exactly one --method (the method run at several budgets) and "
            "--baseline METHOD (the method the gains are measured against)"
        )
    return st.TABLES.get("budget")(
        results,
        methods[0],
        baseline,
        group,
        envs,
        default_budget=default_budget,
        decimals=decimals,
    )


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
    kind = _choice("table kind", kind, st.KINDS)
    fmt = _choice("--format", fmt, FORMATS)
    if decimals < 0:
        fail(f"--decimals must be >= 0, got {decimals}")
    group = group or DEFAULT_GROUP.get(kind, "")
    run_keys = (group,) if kind in DEFAULT_GROUP else ()
    results = _load(input, where, run_keys)
    with _user_errors(input):
        built = _build_table(
            kind,
            results,
            envs,
            methods,
            reference,
            baseline,
            category_env,
            group,
            default_budget,
            decimals,
        )
    if fmt == "rich":
        if output is not None:
            fail("--output needs --format csv, markdown or latex")
        console.print(_rich_table(built))
        return
    text = {"csv": st.to_csv, "markdown": st.to_markdown, "latex": st.to_latex}[fmt](built)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(escape(f"{output}: cannot write the table: {exc.strerror or exc}"))
    console.print(f"wrote {escape(str(output))}")


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
    _choice("--band", band, ("std", "minmax", "none"))
    if smooth < 1:
        fail(f"--smooth must be at least 1, got {smooth}")
    out = _png(output)
    with _user_errors(metrics):
        frame = st.validate_metrics(st.read_frame(metrics, ("method", "env")), metric)
        if env is not None:
            if "env" not in frame.columns:
                raise ValueError("--env needs an env column in the metrics file")
            st.require_value(frame, "env", env)
            frame = frame.loc[frame["env"] == env]
        if methods:
            for m in methods:
                st.require_value(frame, "method", m)
            frame = frame.loc[frame["method"].isin(methods)]
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
    out = _png(output)
    results = _load(input, where)
    with _user_errors(input):
        deltas = st.reference_deltas(results, reference, envs, methods)
    if deltas.empty:
        fail(escape(f"{input}: no method other than {reference!r} to compare"))
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
    out = _png(output)
    _, res = _run_bootstrap(input, env, method, baseline, where, replicates, seed, confidence)
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
    _choice("--tasks", tasks, TASK_KINDS)
    _check_bootstrap_args(replicates, confidence)
    out = _png(output)
    results = _load(input, where)
    with _user_errors(input):
        long, order = _task_scores(results, tasks, envs)
        mats = _matrices(long, order, methods)
    taus = np.linspace(0.0, 1.0, 101)
    rng = np.random.default_rng(seed)
    profiles = {}
    for m, x in mats.items():
        est = st.interval_estimate(
            [x], lambda s: st.performance_profile(s, taus), replicates, rng, confidence
        )
        profiles[m] = (np.asarray(est.point), np.asarray(est.low), np.asarray(est.high))
    _plots().performance_profiles(
        taus,
        profiles,
        out,
        xlabel="success-rate threshold τ",
        title=f"Performance profiles ({len(order)} {tasks} tasks)",
    )
    console.print(f"wrote {escape(str(out))}")
