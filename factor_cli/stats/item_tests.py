"""Item-level paired tests of method A against method B within one seed.

Items i = 1..N carry binary successes a_i (method A) and b_i (method B), a category c(i) with
sizes n_c (c = 1..C), and raw scores x_i (A), y_i (B). Discordant counts:

    wins   W = #{i : a_i = 1, b_i = 0}        losses L = #{i : a_i = 0, b_i = 1}

These tests condition on one trained checkpoint per method: they describe item-level
disagreement, not training-seed uncertainty (that is the hierarchical bootstrap's job).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

from .metric import stratum_codes

EXACT_ATOM_LIMIT = 2_000_000  # largest support the exact stratified null is enumerated over


def _binary(name: str, x: ArrayLike) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{name} must hold only 0/1 success indicators")
    return arr.astype(np.int64)


def discordant_counts(success_a: ArrayLike, success_b: ArrayLike) -> tuple[int, int]:
    """(W, L): items A solves and B fails, and the reverse. Inputs shape [N], values 0/1."""
    a, b = _binary("success_a", success_a), _binary("success_b", success_b)
    if a.shape != b.shape:
        raise ValueError(f"success_a has shape {a.shape} but success_b has shape {b.shape}")
    return int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))


def mcnemar(wins: int, losses: int) -> tuple[float, float]:
    """McNemar's chi-square with Edwards' continuity correction, 1 degree of freedom.

        X^2 = (|W - L| - 1)^2 / (W + L),    p = P(chi^2_1 >= X^2)

    The textbook form (as R's ``mcnemar.test`` and statsmodels); with no discordant pair there
    is no evidence either way and (X^2, p) = (0, 1).
    """
    n = wins + losses
    if n == 0:
        return 0.0, 1.0
    chi2 = (abs(wins - losses) - 1.0) ** 2 / n
    return float(chi2), float(sps.chi2.sf(chi2, df=1))


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact (binomial) McNemar p-value, two-sided.

    Under H0 each discordant pair is a win with probability 1/2, so W | (W + L) ~ Bin(W + L, 1/2)
    and p = min(1, 2 * P(Bin(W + L, 1/2) <= min(W, L))); 1 when W + L = 0.
    """
    n = wins + losses
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * sps.binom.cdf(min(wins, losses), n, 0.5)))


@dataclass(frozen=True)
class StratifiedMcNemar:
    """Category-stratified McNemar test of the macro difference (see :func:`stratified_mcnemar`).

    Attributes:
        estimate: T = sum_c (W_c - L_c) / (C n_c), the observed macro difference (a fraction).
        se0: sqrt(Var0(T | D)), its null standard deviation given the discordant counts.
        chi2: X^2 = T^2 / Var0 (0 when no stratum has a discordant pair).
        p: P(chi^2_1 >= X^2).
        exact_p: P0(|T| >= |t_obs| | D) from the exact conditional null; NaN when either half
            of its support would exceed ``EXACT_ATOM_LIMIT`` atoms or the integer lattice would
            overflow int64 (many categories of coprime sizes); use ``p`` then.
        categories: category names, shape [C]; n, wins, losses: per-category counts, shape [C];
        weights: 1 / (C n_c), shape [C].
    """

    estimate: float
    se0: float
    chi2: float
    p: float
    exact_p: float
    categories: np.ndarray
    n: np.ndarray
    wins: np.ndarray
    losses: np.ndarray
    weights: np.ndarray


def _lattice_pmf(steps: list[int], discordant: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """Distribution of sum_c k_c (2 B_c - D_c), B_c ~ Bin(D_c, 1/2): (sorted keys, probs).

    None when the support would pass ``EXACT_ATOM_LIMIT`` atoms.
    """
    keys = np.zeros(1, dtype=np.int64)
    probs = np.ones(1)
    for k_c, d_c in zip(steps, discordant, strict=True):
        j = np.arange(d_c + 1)
        offsets = k_c * (2 * j - d_c)  # [D_c + 1] possible contributions of the stratum
        if keys.size * offsets.size > EXACT_ATOM_LIMIT:
            return None
        pmf = sps.binom.pmf(j, d_c, 0.5)
        keys, inverse = np.unique((keys[:, None] + offsets[None, :]).ravel(), return_inverse=True)
        probs = np.bincount(inverse.ravel(), weights=(probs[:, None] * pmf[None, :]).ravel())
    return keys, probs


def _exact_stratified_p(steps: list[int], discordant: np.ndarray, t_obs: int) -> float:
    """P(|X + Y| >= |t_obs|) for the exact conditional null T = X + Y (meet in the middle).

    The strata with discordant pairs are split into two halves of about equal support; each
    half's distribution is enumerated on the integer lattice, and the two-sided tail of the
    sum is read off with sorted cumulative sums, so the cost is about the square root of the
    joint support.
    """
    t = abs(t_obs)
    if t == 0:
        return 1.0
    active = [(int(k), int(d)) for k, d in zip(steps, discordant, strict=True) if d > 0]
    if sum(k * d for k, d in active) >= 2**62:  # the integer lattice would overflow int64
        return math.nan
    halves: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
    sizes = [0.0, 0.0]
    for k, d in sorted(active, key=lambda kd: -kd[1]):
        h = 0 if sizes[0] <= sizes[1] else 1
        halves[h].append((k, d))
        sizes[h] += math.log(d + 1)
    parts = [_lattice_pmf([k for k, _ in h], [d for _, d in h]) for h in halves]
    if parts[0] is None or parts[1] is None:
        return math.nan
    (xk, xp), (yk, yp) = parts
    at_least = np.concatenate([np.cumsum(yp[::-1])[::-1], [0.0]])  # P(Y >= yk[j]); [len+1]
    at_most = np.concatenate([[0.0], np.cumsum(yp)])  # P(Y <= yk[j-1]); [len+1]
    upper = at_least[np.searchsorted(yk, t - xk, side="left")]  # P(Y >= t - x)
    lower = at_most[np.searchsorted(yk, -t - xk, side="right")]  # P(Y <= -t - x)
    return float(min(1.0, np.dot(xp, upper + lower)))


def stratified_mcnemar(
    success_a: ArrayLike, success_b: ArrayLike, category: ArrayLike
) -> StratifiedMcNemar:
    """A McNemar test whose statistic is the macro difference itself.

    The macro difference of A and B on the same items is linear in the discordant counts:

        T = sum_c w_c (W_c - L_c),    w_c = 1 / (C n_c)          (= M(A) - M(B) exactly)

    Under H0 (within every category a discordant pair is equally likely to favour A or B), and
    conditioning on D_c = W_c + L_c, W_c ~ Bin(D_c, 1/2) independently across categories, so
    E0[T] = 0 and Var0(T | D) = sum_c w_c^2 D_c. The test reports

        X^2 = T^2 / Var0(T | D)  ~ chi^2_1 (asymptotically),

    and the exact conditional p-value P0(|T| >= |t_obs| | D), enumerated on the integer lattice
    T * C * lcm(n_c). It weights categories like the macro metric does (each category 1/C,
    whatever its size): with a single category it is the uncorrected McNemar test and the
    binomial McNemar test, with equal category sizes it is the pooled (Mantel-Haenszel) McNemar
    test; with unequal sizes it tests the macro estimand, not the item-pooled one.

    Args:
        success_a, success_b: 0/1 successes of A and B on the same items, shape [N].
        category: category of each item, shape [N].
    """
    a, b = _binary("success_a", success_a), _binary("success_b", success_b)
    codes, names = stratum_codes(category)
    if not (a.shape == b.shape == codes.shape):
        raise ValueError(
            f"success_a {a.shape}, success_b {b.shape} and category {codes.shape} must match"
        )
    n_cat = names.size
    n = np.bincount(codes, minlength=n_cat)  # n_c
    wins = np.bincount(codes, weights=(a == 1) & (b == 0), minlength=n_cat).astype(np.int64)
    losses = np.bincount(codes, weights=(a == 0) & (b == 1), minlength=n_cat).astype(np.int64)
    weights = 1.0 / (n_cat * n)
    discordant = wins + losses
    estimate = float(np.dot(weights, wins - losses))
    var0 = float(np.dot(weights**2, discordant))
    chi2 = estimate**2 / var0 if var0 > 0 else 0.0
    p = float(sps.chi2.sf(chi2, df=1)) if var0 > 0 else 1.0
    lattice = math.lcm(*(int(x) for x in n))
    steps = [lattice // int(x) for x in n]  # k_c = lcm / n_c (Python ints: lcm may be huge)
    t_obs = sum(k * (int(w) - int(lo)) for k, w, lo in zip(steps, wins, losses, strict=True))
    exact_p = _exact_stratified_p(steps, discordant, t_obs)
    return StratifiedMcNemar(
        estimate=estimate,
        se0=math.sqrt(var0),
        chi2=float(chi2),
        p=p,
        exact_p=exact_p,
        categories=names,
        n=n,
        wins=wins,
        losses=losses,
        weights=weights,
    )


@dataclass(frozen=True)
class WilcoxonResult:
    """Wilcoxon signed-rank test on paired differences d_i = x_i - y_i.

    Attributes:
        statistic: min(R+, R-) (two-sided convention of scipy).
        p: two-sided p-value.
        n: number of non-zero differences (zeros are dropped, Wilcoxon's treatment).
        r_plus: R+ = sum of the ranks of |d_i| over d_i > 0.
        method: ``"exact"``, ``"asymptotic"`` or ``"none"`` (no non-zero difference).
        z: the normal deviate (R+ - mu) / sigma of the asymptotic method; NaN otherwise.
    """

    statistic: float
    p: float
    n: int
    r_plus: float
    method: str
    z: float


def _signed_rank_null(n: int) -> np.ndarray:
    """Exact null pmf of R+ for n untied non-zero differences, shape [n(n+1)/2 + 1].

    R+ = sum_k k * e_k with e_k ~ Bernoulli(1/2) independent: the pmf is built by adding one
    rank at a time (a knapsack recursion on probabilities).
    """
    pmf = np.zeros(n * (n + 1) // 2 + 1, dtype=np.float64)
    pmf[0] = 1.0
    for k in range(1, n + 1):  # add rank k with probability 1/2 (halving keeps values finite)
        pmf[k:] = 0.5 * (pmf[k:] + pmf[:-k])
        pmf[:k] *= 0.5
    return pmf


def wilcoxon_signed_rank(x: ArrayLike, y: ArrayLike, method: str = "auto") -> WilcoxonResult:
    """Wilcoxon signed-rank test of H0: d = x - y is symmetric about 0 (two-sided).

    Zero differences are dropped; the n remaining |d_i| get average ranks; R+ sums the ranks of
    the positive d_i. ``method``:

    - ``"exact"``: the exact null of R+ (requires no tied |d_i|);
      p = min(1, 2 * min(P0(R+ <= r+), P0(R+ >= r+)));
    - ``"asymptotic"``: z = (R+ - n(n+1)/4) / sigma with the tie-corrected
      sigma^2 = n(n+1)(2n+1)/24 - sum_t (t^3 - t)/48 (t = size of each tie group), no
      continuity correction, p = 2 * Phi(-|z|);
    - ``"auto"``: exact when n <= 50 and no |d_i| are tied, else asymptotic.

    Args:
        x, y: paired scores, shape [N].
    """
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xa.ndim != 1 or xa.shape != ya.shape:
        raise ValueError(f"x and y must be 1-D of the same length, got {xa.shape} and {ya.shape}")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        raise ValueError("scores contain NaN or infinite values")
    if method not in ("auto", "exact", "asymptotic"):
        raise ValueError(f"unknown method {method!r}; valid: auto, exact, asymptotic")
    d = xa - ya
    d = d[d != 0]
    n = int(d.size)
    if n == 0:
        return WilcoxonResult(0.0, 1.0, 0, 0.0, "none", math.nan)
    ranks = sps.rankdata(np.abs(d))  # average ranks of |d|, 1..n
    r_plus = float(ranks[d > 0].sum())
    r_minus = float(ranks[d < 0].sum())
    _, tie_sizes = np.unique(np.abs(d), return_counts=True)
    tied = bool(np.any(tie_sizes > 1))
    if method == "auto":
        method = "exact" if (n <= 50 and not tied) else "asymptotic"
    if method == "exact":
        if tied:
            raise ValueError("the exact signed-rank null assumes no tied |d|; use asymptotic")
        pmf = _signed_rank_null(n)
        k = round(r_plus)
        p = min(1.0, 2.0 * min(pmf[: k + 1].sum(), pmf[k:].sum()))
        return WilcoxonResult(min(r_plus, r_minus), float(p), n, r_plus, "exact", math.nan)
    mu = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(tie_sizes**3 - tie_sizes)) / 48.0
    z = (r_plus - mu) / math.sqrt(var)
    p = float(2.0 * sps.norm.sf(abs(z)))
    return WilcoxonResult(min(r_plus, r_minus), min(1.0, p), n, r_plus, "asymptotic", float(z))


@dataclass(frozen=True)
class PairedTests:
    """All item-level tests of A vs B within one seed (fields named as in the JSON output)."""

    n_items: int
    wins: int
    losses: int
    mcnemar_chi2: float
    mcnemar_p: float
    mcnemar_exact_p: float
    stratified: StratifiedMcNemar
    wilcoxon: WilcoxonResult


def paired_tests(
    success_a: ArrayLike,
    success_b: ArrayLike,
    category: ArrayLike,
    score_a: ArrayLike,
    score_b: ArrayLike,
    wilcoxon_method: str = "auto",
) -> PairedTests:
    """McNemar (corrected and exact), stratified macro McNemar and Wilcoxon on the scores.

    All inputs shape [N], aligned item by item.
    """
    wins, losses = discordant_counts(success_a, success_b)
    chi2, p = mcnemar(wins, losses)
    return PairedTests(
        n_items=int(np.asarray(success_a).size),
        wins=wins,
        losses=losses,
        mcnemar_chi2=chi2,
        mcnemar_p=p,
        mcnemar_exact_p=mcnemar_exact(wins, losses),
        stratified=stratified_mcnemar(success_a, success_b, category),
        wilcoxon=wilcoxon_signed_rank(score_a, score_b, wilcoxon_method),
    )
