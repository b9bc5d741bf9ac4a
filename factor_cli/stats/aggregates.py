"""rliable-style aggregates over a (runs x tasks) score matrix, with stratified-bootstrap CIs.

Shapes: a method's scores are x[n, m], n = 1..N runs (training seeds), m = 1..M tasks
(environments, or (environment, category) cells); a score is a normalised value in [0, 1] such
as the macro success rate. Every aggregate takes an array of shape [..., N, M] and reduces the
last two axes: a float for a 2-D input, an array over the leading (batch) axes otherwise. That
is what lets any aggregate plug into :func:`stratified_bootstrap`, which evaluates it on all
replicates at once.

Stratified bootstrap (rliable): a replicate resamples, independently for every task m, N runs
with replacement from that task's column, so every task keeps its weight. Several methods are
resampled independently of each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from factor_cli.registry import Registry

from .bootstrap import percentile_interval

Aggregate = Callable[[np.ndarray], "float | np.ndarray"]
#: The aggregates every report computes, in the order they are reported (IQM first: rliable's
#: headline statistic). The only list of aggregates: ``factor stats aggregate`` loops over it.
AGGREGATES: Registry[Aggregate] = Registry("aggregate")


def _scores(name: str, x: ArrayLike) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim < 2 or arr.shape[-1] == 0 or arr.shape[-2] == 0:
        raise ValueError(
            f"{name} must have shape [..., N_runs, N_tasks] with N, M >= 1, got {arr.shape}"
        )
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


def _out(value: np.ndarray) -> float | np.ndarray:
    return float(value) if np.ndim(value) == 0 else value


@AGGREGATES.register("iqm")
def iqm(scores: ArrayLike) -> float | np.ndarray:
    """Interquartile mean: the mean of the N M scores after dropping the lowest and highest 25%.

    With K = N M sorted scores x_(1) <= ... <= x_(K) and g = floor(K / 4):
    IQM = (1/(K - 2g)) sum_{k=g+1}^{K-g} x_(k)   (as ``scipy.stats.trim_mean(x, 0.25)``).
    """
    x = _scores("scores", scores)
    flat = np.sort(x.reshape(*x.shape[:-2], -1), axis=-1)
    k = flat.shape[-1]
    g = k // 4
    return _out(flat[..., g : k - g].mean(axis=-1))


@AGGREGATES.register("mean")
def mean(scores: ArrayLike) -> float | np.ndarray:
    """Mean score: (1/(N M)) sum_{n,m} x[n, m]."""
    x = _scores("scores", scores)
    return _out(x.mean(axis=(-2, -1)))


@AGGREGATES.register("median")
def median(scores: ArrayLike) -> float | np.ndarray:
    """Median of the N M scores."""
    x = _scores("scores", scores)
    return _out(np.median(x.reshape(*x.shape[:-2], -1), axis=-1))


@AGGREGATES.register("optimality_gap")
def optimality_gap(scores: ArrayLike, gamma: float = 1.0) -> float | np.ndarray:
    """Mean shortfall from the target gamma: (1/(N M)) sum_{n,m} max(gamma - x[n, m], 0)."""
    x = _scores("scores", scores)
    return _out(np.maximum(gamma - x, 0.0).mean(axis=(-2, -1)))


def probability_of_improvement(x: ArrayLike, y: ArrayLike) -> float | np.ndarray:
    """P(X > Y): the probability that a run of X beats a run of Y on a random task.

        P(X > Y) = (1/M) sum_m (1/(N K)) sum_{i,j} S(x[i, m], y[j, m]),
        S(a, b) = 1 if a > b, 1/2 if a = b, 0 otherwise   (the Mann-Whitney U / (N K) per task)

    Args:
        x: scores of X, shape [..., N, M]; y: scores of Y, shape [..., K, M] (same M, same batch).
    """
    xa, ya = _scores("x", x), _scores("y", y)
    if xa.shape[-1] != ya.shape[-1]:
        raise ValueError(f"x has {xa.shape[-1]} tasks but y has {ya.shape[-1]}; tasks must match")
    a = xa[..., :, None, :]  # [..., N, 1, M]
    b = ya[..., None, :, :]  # [..., 1, K, M]
    s = (a > b) + 0.5 * (a == b)  # [..., N, K, M]
    return _out(s.mean(axis=(-3, -2, -1)))


def performance_profile(scores: ArrayLike, taus: ArrayLike) -> np.ndarray:
    """Score distribution F(tau) = (1/(N M)) sum_{n,m} [x[n, m] > tau] for every threshold.

    Args:
        scores: shape [..., N, M]; taus: thresholds, shape [T].

    Returns:
        shape [..., T]: the fraction of (run, task) scores above each tau.
    """
    x = _scores("scores", scores)
    t = np.asarray(taus, dtype=np.float64)
    if t.ndim != 1:
        raise ValueError(f"taus must be 1-D, got shape {t.shape}")
    flat = x.reshape(*x.shape[:-2], -1)  # [..., N M]
    return (flat[..., None, :] > t[:, None]).mean(axis=-1)


def _generator(rng: np.random.Generator | int) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def stratified_resample(
    scores: np.ndarray, replicates: int, rng: np.random.Generator
) -> np.ndarray:
    """R stratified resamples of one method's (runs x tasks) matrix, shape [R, N, M].

    Resample r has entries scores[J[r, n, m], m] with J[r, n, m] uniform on 0..N-1.
    """
    n_runs, n_tasks = scores.shape
    idx = rng.integers(0, n_runs, size=(replicates, n_runs, n_tasks))  # J[r, n, m]
    return scores[idx, np.arange(n_tasks)[None, None, :]]


def stratified_bootstrap(
    scores: Sequence[ArrayLike],
    statistic: Callable[..., float | np.ndarray],
    replicates: int,
    rng: np.random.Generator | int,
) -> np.ndarray:
    """statistic(*resampled) for R stratified-bootstrap replicates.

    Args:
        scores: one (runs x tasks) matrix per method, each [N_j, M]; each is resampled
            independently (e.g. (x,) for IQM, (x, y) for P(X > Y)).
        statistic: a batched aggregate taking one [..., N_j, M] array per method.
        replicates: R >= 1.
        rng: a ``numpy.random.Generator`` or an integer seed for one.

    Returns:
        shape [R] for a scalar statistic, [R, T] for a vector one (a performance profile).
    """
    if not isinstance(replicates, (int, np.integer)) or replicates < 1:
        raise ValueError(f"replicates must be a positive integer, got {replicates!r}")
    mats = [_scores(f"scores[{j}]", s) for j, s in enumerate(scores)]
    if any(m.ndim != 2 for m in mats):
        raise ValueError("each score matrix must be 2-D [N_runs, N_tasks]")
    gen = _generator(rng)
    chunk = max(1, 2_000_000 // max(m.size for m in mats))  # bound memory of [R, N, M] draws
    out = []
    for lo in range(0, replicates, chunk):
        r = min(chunk, replicates - lo)
        out.append(np.asarray(statistic(*(stratified_resample(m, r, gen) for m in mats))))
    return np.concatenate(out, axis=0)


@dataclass(frozen=True)
class Estimate:
    """An aggregate with its stratified-bootstrap percentile interval.

    ``point``, ``low`` and ``high`` are floats for scalar aggregates, arrays [T] for profiles.
    """

    point: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray


def interval_estimate(
    scores: Sequence[ArrayLike],
    statistic: Callable[..., float | np.ndarray],
    replicates: int,
    rng: np.random.Generator | int,
    confidence: float = 0.95,
) -> Estimate:
    """Point value statistic(*scores) and the percentile interval of its bootstrap replicates."""
    point = statistic(*(np.asarray(s, dtype=np.float64) for s in scores))
    reps = stratified_bootstrap(scores, statistic, replicates, rng)
    if reps.ndim == 1:
        lo, hi = percentile_interval(reps, confidence)
        return Estimate(float(point), lo, hi)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    alpha = (1.0 - confidence) / 2.0
    lo_v, hi_v = np.quantile(reps, [alpha, 1.0 - alpha], axis=0)
    return Estimate(np.asarray(point), lo_v, hi_v)
