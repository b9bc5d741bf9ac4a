"""Statistics for FACTOR's evaluations: pure numpy / scipy / pandas (no other package imports).

Public entry points (N items, S seeds, R replicates, N_runs x M tasks):

    macro_success(success[N], category[N]) -> float                        the paper's metric
    hierarchical_bootstrap(diffs[S][N_s], strata[S][N_s], R, rng) -> BootstrapResult
    paired_tests(a[N], b[N], category[N], score_a[N], score_b[N]) -> PairedTests
    stratified_mcnemar(a[N], b[N], category[N]) -> StratifiedMcNemar
    iqm / mean / median / optimality_gap(scores[..., N_runs, M]) -> float | array
    probability_of_improvement(x[..., N, M], y[..., K, M]) -> float | array
    performance_profile(scores[..., N, M], taus[T]) -> array[..., T]
    interval_estimate(scores, statistic, R, rng) -> Estimate        (stratified bootstrap CI)
    TABLES.get(kind)(TableRequest(results, ...)) -> Table; to_markdown / to_latex / to_csv
    read_results(path) -> DataFrame; paired_runs(results, env, method, baseline) -> [PairedRun]

``factor_cli.stats.report`` holds what each ``factor stats`` command computes (typed requests
in, frozen reports out); ``factor_cli.stats.plots`` (matplotlib) is imported only on demand.
"""

from .aggregates import (
    AGGREGATES,
    Estimate,
    interval_estimate,
    iqm,
    mean,
    median,
    optimality_gap,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap,
)
from .bootstrap import (
    BootstrapResult,
    bootstrap_replicates,
    hierarchical_bootstrap,
    percentile_interval,
    seed_differences,
)
from .io import (
    REQUIRED_COLUMNS,
    PairedRun,
    filter_rows,
    paired_runs,
    read_frame,
    read_results,
    require_value,
    validate_metrics,
    validate_results,
)
from .item_tests import (
    PairedTests,
    StratifiedMcNemar,
    WilcoxonResult,
    discordant_counts,
    mcnemar,
    mcnemar_exact,
    paired_tests,
    stratified_mcnemar,
    wilcoxon_signed_rank,
)
from .metric import category_rates, macro_success, macro_weights, run_metrics, score_matrix
from .tables import (
    EXPORTS,
    KINDS,
    TABLES,
    Cell,
    Table,
    TableBuilder,
    TableLayout,
    TableOptionError,
    TableRequest,
    reference_deltas,
    to_csv,
    to_latex,
    to_markdown,
)

__all__ = [
    "AGGREGATES",
    "EXPORTS",
    "KINDS",
    "REQUIRED_COLUMNS",
    "TABLES",
    "BootstrapResult",
    "Cell",
    "Estimate",
    "PairedRun",
    "PairedTests",
    "StratifiedMcNemar",
    "Table",
    "TableBuilder",
    "TableLayout",
    "TableOptionError",
    "TableRequest",
    "WilcoxonResult",
    "bootstrap_replicates",
    "category_rates",
    "discordant_counts",
    "filter_rows",
    "hierarchical_bootstrap",
    "interval_estimate",
    "iqm",
    "macro_success",
    "macro_weights",
    "mcnemar",
    "mcnemar_exact",
    "mean",
    "median",
    "optimality_gap",
    "paired_runs",
    "paired_tests",
    "percentile_interval",
    "performance_profile",
    "probability_of_improvement",
    "read_frame",
    "read_results",
    "reference_deltas",
    "require_value",
    "run_metrics",
    "score_matrix",
    "seed_differences",
    "stratified_bootstrap",
    "stratified_mcnemar",
    "to_csv",
    "to_latex",
    "to_markdown",
    "validate_metrics",
    "validate_results",
    "wilcoxon_signed_rank",
]
