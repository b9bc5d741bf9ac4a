"""Hierarchical (seed -> item) bootstrap of a macro-metric difference between two methods.

Notation: seeds s = 1..S; within seed s, items i = 1..N_s, each in a category (stratum)
c = 1..C_s of size n_{s,c}, with paired difference d_{s,i} = s^A_{s,i} - s^B_{s,i}. The per-seed
macro difference (see ``metric``) is

    Delta_s = sum_c (1/C_s) * (1/n_{s,c}) * sum_{i in c} d_{s,i}

and the point estimate is Delta = (1/S) sum_s Delta_s. One bootstrap replicate r:

    1. draw S seeds sigma_1..sigma_S uniformly with replacement from {1..S};
    2. for every draw k (a repeated seed is resampled afresh each time) and every category c of
       seed sigma_k, draw n_{sigma_k,c} items uniformly with replacement from that category, so
       every category keeps its size and methods A and B stay paired (an item carries d_i);
    3. Delta*_r = (1/S) sum_k sum_c (1/C) * mean of the drawn d's of category c.

Vectorisation. Within one (seed, category) the resampled mean depends on the draw only through
how many times each distinct value of d is hit, and for n_c uniform draws with replacement those
counts are Multinomial(n_c, f), f = the value frequencies of that category. With binary success
d takes at most three values {-1, 0, 1}, so the default ``method="counts"`` draws one small
multinomial per (replicate, seed draw, category) instead of n_c item indices: the same
distribution, cost independent of the number of items. ``method="items"`` draws the item indices
literally (vectorised, chunked); the tests check both against a slow loop and the exact variance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .metric import stratum_codes

METHODS: tuple[str, ...] = ("counts", "items")
_CHUNK_ELEMENTS = 4_000_000  # cap on int64 item indices held at once by method="items"


@dataclass(frozen=True)
class _Stratum:
    """One category of one seed: its items' d values and derived multinomial parameters."""

    d: np.ndarray  # d_i of the category's items, shape [n_c]
    values: np.ndarray  # distinct values of d, shape [k]
    freq: np.ndarray  # their relative frequencies, shape [k], sum 1
    scale: float  # 1 / (C * n_c): the weight of one drawn item in Delta*


def _layout(diff: np.ndarray, strata: np.ndarray) -> list[_Stratum]:
    codes, _ = stratum_codes(strata)
    n_cat = int(codes.max()) + 1
    out = []
    for c in range(n_cat):
        d = diff[codes == c]
        values, counts = np.unique(d, return_counts=True)
        out.append(_Stratum(d, values, counts / d.size, 1.0 / (n_cat * d.size)))
    return out


def _resample_counts(layout: list[_Stratum], m: int, rng: np.random.Generator) -> np.ndarray:
    """Delta* of m independent item resamples of one seed, shape [m] (multinomial counts)."""
    total = np.zeros(m)
    for st in layout:
        n_c = st.d.size
        if st.values.size == 1:  # every draw gives the same value
            total += st.values[0] * n_c * st.scale
            continue
        counts = rng.multinomial(n_c, st.freq, size=m)  # [m, k]: hits of each distinct value
        total += (counts @ st.values) * st.scale
    return total


def _resample_items(layout: list[_Stratum], m: int, rng: np.random.Generator) -> np.ndarray:
    """Delta* of m independent item resamples of one seed, shape [m] (literal item indices)."""
    total = np.zeros(m)
    for st in layout:
        n_c = st.d.size
        rows = max(1, _CHUNK_ELEMENTS // n_c)
        for lo in range(0, m, rows):
            hi = min(m, lo + rows)
            idx = rng.integers(0, n_c, size=(hi - lo, n_c))  # [rows, n_c] drawn item positions
            total[lo:hi] += st.d[idx].sum(axis=1) * st.scale
    return total


def _check_inputs(
    diffs: Sequence[np.ndarray], strata: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    if len(diffs) == 0:
        raise ValueError("the bootstrap needs at least one seed; got no per-seed differences")
    if len(diffs) != len(strata):
        raise ValueError(f"got {len(diffs)} difference vectors but {len(strata)} strata vectors")
    out = []
    for k, (d, c) in enumerate(zip(diffs, strata, strict=True)):
        d = np.asarray(d, dtype=np.float64)
        c = np.asarray(c)
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"seed {k}: differences must be a non-empty 1-D array, got {d.shape}")
        if c.shape != d.shape:
            raise ValueError(f"seed {k}: strata has shape {c.shape}, differences {d.shape}")
        if not np.all(np.isfinite(d)):
            raise ValueError(f"seed {k}: differences contain NaN or infinite values")
        out.append((d, c))
    return out


def seed_differences(diffs: Sequence[np.ndarray], strata: Sequence[np.ndarray]) -> np.ndarray:
    """Delta_s = (1/C_s) sum_c (1/n_{s,c}) sum_{i in c} d_{s,i} for every seed, shape [S].

    Args:
        diffs: per seed, d_{s,i} = s^A - s^B of its items, shape [N_s].
        strata: per seed, the category of each item, shape [N_s].
    """
    out = []
    for d, c in _check_inputs(diffs, strata):
        codes, _ = stratum_codes(c)
        sums = np.bincount(codes, weights=d)  # sum of d per category, [C]
        out.append(np.mean(sums / np.bincount(codes)))  # summing first keeps 0 exactly 0
    return np.array(out)


def bootstrap_replicates(
    diffs: Sequence[np.ndarray],
    strata: Sequence[np.ndarray],
    replicates: int,
    rng: np.random.Generator | int,
    method: str = "counts",
) -> np.ndarray:
    """Delta*_r for r = 1..R replicates of the hierarchical bootstrap (module docstring).

    Args:
        diffs: per seed s, the paired differences d_{s,i}, shape [N_s].
        strata: per seed s, the category of each item, shape [N_s].
        replicates: R >= 1.
        rng: a ``numpy.random.Generator`` or an integer seed for one.
        method: ``"counts"`` (multinomial counts of distinct d values, default) or ``"items"``
            (literal item indices); both sample the same distribution.

    Returns:
        Delta*[R], in the units of d (fractions for success indicators).
    """
    pairs = _check_inputs(diffs, strata)
    if not isinstance(replicates, (int, np.integer)) or replicates < 1:
        raise ValueError(f"replicates must be a positive integer, got {replicates!r}")
    if method not in METHODS:
        raise ValueError(f"unknown bootstrap method {method!r}; valid: {', '.join(METHODS)}")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    resample = _resample_counts if method == "counts" else _resample_items
    layouts = [_layout(d, c) for d, c in pairs]
    n_seeds = len(layouts)
    draws = gen.integers(0, n_seeds, size=(replicates, n_seeds))  # [R, S]: sigma_k per replicate
    slot = np.empty((replicates, n_seeds))  # [R, S]: Delta* of the k-th drawn seed
    for s, layout in enumerate(layouts):
        hit = draws == s
        m = int(hit.sum())
        if m:
            slot[hit] = resample(layout, m, gen)
    return slot.mean(axis=1)


def percentile_interval(distribution: np.ndarray, confidence: float) -> tuple[float, float]:
    """Percentile interval [q_{(1-c)/2}, q_{(1+c)/2}] of a bootstrap distribution.

    Quantiles use linear interpolation between order statistics (numpy's default).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(np.asarray(distribution), [alpha, 1.0 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class BootstrapResult:
    """Summary of a hierarchical bootstrap of A - B (all values in the units of d).

    Attributes:
        point: Delta = mean_s Delta_s.
        ci_low, ci_high: percentile interval of Delta* at ``confidence``.
        p_positive: fraction of replicates with Delta*_r > 0.
        replicates: R.
        confidence: the interval's level.
        per_seed: Delta_s, shape [S], in the order the seeds were given.
        distribution: Delta*_r, shape [R].
    """

    point: float
    ci_low: float
    ci_high: float
    p_positive: float
    replicates: int
    confidence: float
    per_seed: np.ndarray
    distribution: np.ndarray


def hierarchical_bootstrap(
    diffs: Sequence[np.ndarray],
    strata: Sequence[np.ndarray],
    replicates: int,
    rng: np.random.Generator | int,
    confidence: float = 0.95,
    method: str = "counts",
) -> BootstrapResult:
    """Point estimate, percentile CI and P(Delta > 0) of the macro difference A - B.

    Arguments as :func:`bootstrap_replicates`; ``confidence`` in (0, 1).
    """
    per_seed = seed_differences(diffs, strata)
    dist = bootstrap_replicates(diffs, strata, replicates, rng, method)
    lo, hi = percentile_interval(dist, confidence)
    return BootstrapResult(
        point=float(per_seed.mean()),
        ci_low=lo,
        ci_high=hi,
        p_positive=float(np.mean(dist > 0)),
        replicates=int(replicates),
        confidence=float(confidence),
        per_seed=per_seed,
        distribution=dist,
    )
