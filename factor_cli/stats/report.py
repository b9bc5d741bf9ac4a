"""What every ``factor stats`` command computes, as typed requests in and frozen reports out.

The CLI parses options into a request, calls one function here and renders the report; all the
logic (loading and validating files, pairing, the aggregate loop over :data:`AGGREGATES`, the
single-seed warning) lives here, so it is tested without a terminal.

    load_results(path, where, run_keys) -> DataFrame              read + filter + validate
    bootstrap_report(results, BootstrapRequest) -> BootstrapReport   hierarchical bootstrap A - B
    item_tests_report(results, ItemTestsRequest) -> ItemTestsReport  paired item tests, one seed
    aggregate_report(results, AggregateRequest) -> AggregateReport   every AGGREGATES entry + CI
    profile_report(results, ProfileRequest) -> ProfileReport         performance profiles + bands
    TABLES.get(kind)(TableRequest(results, ...)) -> Table           the paper's tables (tables.py)

Units: a report stores what the command prints. Macro-metric differences and aggregates are in
percentage points / percent (x 100); probabilities (P(Delta > 0), P(X > Y)) stay fractions.
Every stochastic report takes its generator seed in the request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .aggregates import (
    AGGREGATES,
    Estimate,
    interval_estimate,
    performance_profile,
    probability_of_improvement,
)
from .bootstrap import BootstrapResult, hierarchical_bootstrap
from .io import (
    METRICS_COLUMNS,
    PairedRun,
    filter_rows,
    paired_runs,
    read_frame,
    require_value,
    validate_metrics,
    validate_results,
)
from .item_tests import PairedTests, paired_tests
from .metric import category_rates, run_metrics, score_matrix
from .tables import reference_deltas

#: What a task of the (runs x tasks) score matrix is: an env (its macro metric) or an
#: env/category cell (its success rate).
TASK_KINDS: tuple[str, ...] = ("env", "category")
#: The paired columns the Wilcoxon signed-rank test may use.
WILCOXON_ON: tuple[str, ...] = ("score", "success")


# ----------------------------------------------------------------------------- loading


def _any_value(column: str) -> str:
    return "one value per run"


def load_results(
    path: str | Path,
    where: Sequence[str] = (),
    run_keys: Sequence[str] = (),
    example: Callable[[str], str] = _any_value,
) -> pd.DataFrame:
    """Read an item-level results file, keep the ``where`` rows (COLUMN=VALUE) and validate it.

    Args:
        path: CSV / TSV / CSV.GZ / Parquet file (schema in :mod:`factor_cli.stats.io`).
        where: conditions every kept row matches (values compared as text).
        run_keys: study columns of a table layout that are part of a run's identity.
        example: an example value of a study column, for the error naming a missing one.

    Raises:
        ValueError: one line naming the line, column or value and the fix (without the path;
            the caller prefixes it).
    """
    frame = read_frame(path)
    for key in run_keys:
        if key not in frame.columns:
            raise ValueError(
                f"this table needs the study column {key!r} (e.g. {example(key)}); add it, or "
                "pass --group-column NAME if yours is called differently"
            )
    return validate_results(filter_rows(frame, where), run_keys)


def load_metrics(
    path: str | Path,
    metric: str,
    env: str | None = None,
    methods: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Read and validate a training-metrics file, keeping one env and some methods if given.

    Returns:
        rows (method, seed, step, ``metric`` [, env]) as :func:`validate_metrics` returns them.
    """
    header = (*METRICS_COLUMNS, metric)
    frame = validate_metrics(read_frame(path, ("method", "env"), header), metric)
    if env is not None:
        if "env" not in frame.columns:
            raise ValueError("--env needs an env column in the metrics file")
        require_value(frame, "env", env)
        frame = frame.loc[frame["env"] == env]
    if methods:
        for m in methods:
            require_value(frame, "method", m)
        frame = frame.loc[frame["method"].isin(methods)]
    return frame


# ----------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class BootstrapRequest:
    """A hierarchical bootstrap of the macro difference A - B on one environment.

    Attributes:
        env: the environment; method: A (the one tested); baseline: B (the comparison).
        replicates: R >= 1; seed: seed of the bootstrap's generator; confidence: CI level.
    """

    env: str
    method: str
    baseline: str
    replicates: int = 10_000
    seed: int = 0
    confidence: float = 0.95


@dataclass(frozen=True)
class BootstrapReport:
    """The bootstrap's result, the paired runs it used, and warnings for the user.

    Attributes:
        request: what was asked.
        runs: one :class:`PairedRun` per training seed, ascending seed (S = len(runs)).
        result: the library result, in the units of d (fractions).
        warnings: one-line notes to show on stderr (e.g. a single seed).
    """

    request: BootstrapRequest
    runs: tuple[PairedRun, ...]
    result: BootstrapResult
    warnings: tuple[str, ...]

    @property
    def per_seed_pp(self) -> dict[str, float]:
        """Delta_s in percentage points, keyed by the training seed (as text)."""
        pairs = zip(self.runs, self.result.per_seed, strict=True)
        return {str(r.seed): 100.0 * float(d) for r, d in pairs}

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` object: differences in pp, P(Delta > 0) as a fraction."""
        q, res = self.request, self.result
        return {
            "env": q.env,
            "method": q.method,
            "baseline": q.baseline,
            "point": 100.0 * res.point,
            "ci_low": 100.0 * res.ci_low,
            "ci_high": 100.0 * res.ci_high,
            "p_positive": res.p_positive,
            "replicates": res.replicates,
            "per_seed": self.per_seed_pp,
            "confidence": res.confidence,
            "rng_seed": q.seed,
        }


def _seed_warnings(request: BootstrapRequest, runs: Sequence[PairedRun]) -> tuple[str, ...]:
    """With S = 1 every replicate draws the same seed: the CI reflects item noise only."""
    if len(runs) != 1:
        return ()
    return (
        f"only one training seed ({runs[0].seed}) of {request.method!r} and "
        f"{request.baseline!r} on {request.env!r}: the {100 * request.confidence:g}% CI "
        "resamples items only and ignores seed-to-seed variance; evaluate more training "
        "seeds for an interval over runs",
    )


def bootstrap_report(results: pd.DataFrame, request: BootstrapRequest) -> BootstrapReport:
    """Pair A with B seed by seed on ``request.env`` and run the hierarchical bootstrap.

    The generator is ``numpy.random.default_rng(request.seed)``; see
    :func:`factor_cli.stats.hierarchical_bootstrap` for the procedure.
    """
    q = request
    runs = paired_runs(results, q.env, q.method, q.baseline)
    result = hierarchical_bootstrap(
        [r.diff for r in runs],
        [r.category for r in runs],
        q.replicates,
        np.random.default_rng(q.seed),
        q.confidence,
    )
    return BootstrapReport(q, tuple(runs), result, _seed_warnings(q, runs))


# ----------------------------------------------------------------------------- item tests


@dataclass(frozen=True)
class ItemTestsRequest:
    """Paired item-level tests of A against B within one training seed.

    Attributes:
        env, method (A), baseline (B): the comparison; seed: the training seed compared.
        wilcoxon_on: the paired column of the Wilcoxon test (one of :data:`WILCOXON_ON`).
    """

    env: str
    method: str
    baseline: str
    seed: int
    wilcoxon_on: str = "score"


@dataclass(frozen=True)
class CategoryCounts:
    """One stratum of the stratified McNemar test: n_c items, W_c wins, L_c losses, 1/(C n_c)."""

    category: str
    n: int
    wins: int
    losses: int
    weight: float


@dataclass(frozen=True)
class ItemTestsReport:
    """The tests of one seed's paired items and the per-category counts."""

    request: ItemTestsRequest
    run: PairedRun
    tests: PairedTests
    categories: tuple[CategoryCounts, ...]

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` object: macro difference and its null SE in pp, p-values as is."""
        q, res = self.request, self.tests
        strat, wil = res.stratified, res.wilcoxon
        return {
            "env": q.env,
            "method": q.method,
            "baseline": q.baseline,
            "seed": q.seed,
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
            "wilcoxon_on": q.wilcoxon_on,
            "wilcoxon_stat": wil.statistic,
            "wilcoxon_p": wil.p,
            "wilcoxon_n": wil.n,
            "wilcoxon_method": wil.method,
            "categories": [asdict(c) for c in self.categories],
        }


def item_tests_report(results: pd.DataFrame, request: ItemTestsRequest) -> ItemTestsReport:
    """McNemar (corrected, exact), stratified macro McNemar and Wilcoxon on one seed's items."""
    q = request
    if q.wilcoxon_on not in WILCOXON_ON:
        raise ValueError(f"wilcoxon_on {q.wilcoxon_on!r} is not one of {', '.join(WILCOXON_ON)}")
    (run,) = paired_runs(results, q.env, q.method, q.baseline, seeds=[q.seed])
    x, y = (
        (run.score_a, run.score_b) if q.wilcoxon_on == "score" else (run.success_a, run.success_b)
    )
    tests = paired_tests(run.success_a, run.success_b, run.category, x, y)
    s = tests.stratified
    categories = tuple(
        CategoryCounts(str(c), int(n), int(w), int(lo), float(wt))
        for c, n, w, lo, wt in zip(s.categories, s.n, s.wins, s.losses, s.weights, strict=True)
    )
    return ItemTestsReport(q, run, tests, categories)


# ----------------------------------------------------------------------------- score matrices


def _task_scores(
    results: pd.DataFrame, tasks: str, envs: Sequence[str] | None
) -> tuple[pd.DataFrame, list[str]]:
    """Per-run scores in long form (method, seed, task, score) and the task order."""
    if tasks not in TASK_KINDS:
        raise ValueError(f"unknown task kind {tasks!r}; valid: {', '.join(TASK_KINDS)}")
    env_list = list(dict.fromkeys(results["env"])) if not envs else list(envs)
    for e in env_list:
        require_value(results, "env", e)
    rows = results.loc[results["env"].isin(env_list)]
    if tasks == "env":
        runs = run_metrics(rows).rename(columns={"env": "task", "metric": "score"})
        order = env_list
    else:
        runs = category_rates(rows).rename(columns={"rate": "score"})
        runs["task"] = runs["env"] + "/" + runs["category"].astype(str)
        order = list(dict.fromkeys(runs["task"]))
    return runs[["method", "seed", "task", "score"]], order


def _matrices(
    long: pd.DataFrame, tasks: list[str], methods: Sequence[str] | None
) -> dict[str, np.ndarray]:
    """Method -> its (seeds x tasks) score matrix x[n, m], tasks in ``tasks`` order."""
    names = list(dict.fromkeys(long["method"])) if not methods else list(methods)
    out = {}
    for m in names:
        require_value(long, "method", m)
        rows = long.loc[long["method"] == m]
        try:
            out[m], _ = score_matrix(rows, "score", "task", tasks)
        except ValueError as exc:
            raise ValueError(f"method {m!r}: {exc}") from None
    return out


def _percent(est: Estimate) -> Estimate:
    return Estimate(100.0 * est.point, 100.0 * est.low, 100.0 * est.high)


# ----------------------------------------------------------------------------- aggregates


@dataclass(frozen=True)
class AggregateRequest:
    """rliable-style aggregates of each method's (seeds x tasks) score matrix.

    Attributes:
        methods, envs: what to include, in order (None: all, in order of first appearance).
        baseline: also estimate P(method > baseline) for every other method (None: no).
        tasks: one of :data:`TASK_KINDS`.
        replicates, seed, confidence: the stratified bootstrap's R, generator seed and level.
    """

    methods: Sequence[str] | None = None
    envs: Sequence[str] | None = None
    baseline: str | None = None
    tasks: str = "env"
    replicates: int = 10_000
    seed: int = 0
    confidence: float = 0.95


@dataclass(frozen=True)
class MethodAggregates:
    """One method's aggregates.

    Attributes:
        runs: N, the number of runs (training seeds) in its score matrix.
        percent: aggregate name -> estimate in percent, one entry per :data:`AGGREGATES` entry,
            in registry order.
        improvement: P(method > baseline) with its CI (a probability); None without a
            baseline or for the baseline itself.
    """

    runs: int
    percent: Mapping[str, Estimate]
    improvement: Estimate | None


@dataclass(frozen=True)
class AggregateReport:
    """Every method's aggregates over the same tasks.

    Attributes:
        request: what was asked.
        tasks: the tasks, in score-matrix column order.
        aggregates: the :data:`AGGREGATES` names, in the order each method's ``percent`` has.
        methods: method -> its aggregates, in the order requested (or of first appearance).
    """

    request: AggregateRequest
    tasks: tuple[str, ...]
    aggregates: tuple[str, ...]
    methods: Mapping[str, MethodAggregates]

    def as_json(self) -> dict[str, Any]:
        """The ``--json`` object (aggregates in %, P(X > Y) a probability)."""
        q = self.request
        return {
            "tasks": list(self.tasks),
            "task_kind": q.tasks,
            "baseline": q.baseline,
            "replicates": q.replicates,
            "confidence": q.confidence,
            "rng_seed": q.seed,
            "methods": {m: _method_json(agg) for m, agg in self.methods.items()},
        }


def _estimate_json(est: Estimate) -> dict[str, Any]:
    return {"point": est.point, "low": est.low, "high": est.high}


def _method_json(agg: MethodAggregates) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": agg.runs}
    out.update((name, _estimate_json(est)) for name, est in agg.percent.items())
    if agg.improvement is not None:
        out["probability_of_improvement"] = _estimate_json(agg.improvement)
    return out


def aggregate_report(results: pd.DataFrame, request: AggregateRequest) -> AggregateReport:
    """Every :data:`AGGREGATES` entry of every method with a stratified-bootstrap CI.

    One generator, ``default_rng(request.seed)``, is drawn from in a fixed order (methods in
    order, each aggregate in registry order, then P(method > baseline)), so a seed gives the
    same numbers run after run.
    """
    q = request
    long, order = _task_scores(results, q.tasks, q.envs)
    mats = _matrices(long, order, q.methods)
    base = mats.get(q.baseline) if q.baseline is not None else None
    if q.baseline is not None and base is None:  # a baseline not among the methods shown
        base = _matrices(long, order, [q.baseline])[q.baseline]
    rng = np.random.default_rng(q.seed)

    def estimate(statistic: Callable[..., Any], *scores: np.ndarray) -> Estimate:
        return interval_estimate(list(scores), statistic, q.replicates, rng, q.confidence)

    methods: dict[str, MethodAggregates] = {}
    for m, x in mats.items():
        percent = {name: _percent(estimate(AGGREGATES.get(name), x)) for name in AGGREGATES}
        improvement = None
        if base is not None and m != q.baseline:
            improvement = estimate(probability_of_improvement, x, base)
        methods[m] = MethodAggregates(int(x.shape[0]), percent, improvement)
    return AggregateReport(q, tuple(order), tuple(AGGREGATES), methods)


# ----------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class ProfileRequest:
    """Performance profiles F(tau) of each method with stratified-bootstrap bands.

    Attributes:
        methods, envs, tasks, replicates, seed, confidence: as :class:`AggregateRequest`.
        thresholds: T, the number of evenly spaced thresholds tau in [0, 1].
    """

    methods: Sequence[str] | None = None
    envs: Sequence[str] | None = None
    tasks: str = "category"
    replicates: int = 2_000
    seed: int = 0
    confidence: float = 0.95
    thresholds: int = 101


@dataclass(frozen=True)
class ProfileReport:
    """taus[T], and per method F(tau) with its band (point, low, high: arrays [T])."""

    request: ProfileRequest
    tasks: tuple[str, ...]
    taus: np.ndarray
    profiles: Mapping[str, Estimate]


def profile_report(results: pd.DataFrame, request: ProfileRequest) -> ProfileReport:
    """F(tau) = fraction of (run, task) scores above tau, per method, with percentile bands."""
    q = request
    long, order = _task_scores(results, q.tasks, q.envs)
    mats = _matrices(long, order, q.methods)
    taus = np.linspace(0.0, 1.0, q.thresholds)
    rng = np.random.default_rng(q.seed)

    def profile(scores: np.ndarray) -> np.ndarray:
        return performance_profile(scores, taus)

    profiles = {
        m: interval_estimate([x], profile, q.replicates, rng, q.confidence) for m, x in mats.items()
    }
    return ProfileReport(q, tuple(order), taus, profiles)


# ----------------------------------------------------------------------------- ablation plot


def ablation_deltas(
    results: pd.DataFrame,
    reference: str,
    envs: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Delta per (method, env) vs ``reference`` in pp (:func:`reference_deltas`), never empty."""
    deltas = reference_deltas(results, reference, envs, methods)
    if deltas.empty:
        raise ValueError(f"no method other than {reference!r} to compare")
    return deltas


# ----------------------------------------------------------------------------- JSON


def jsonable(value: Any) -> Any:
    """A JSON-safe copy: numpy scalars and arrays to Python, NaN and infinities to None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value
