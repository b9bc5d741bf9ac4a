"""Value calibration against a Monte-Carlo reference, and the reference's own noise ceiling
(the paper's Table 17 and Fig. 5B, with the ceiling they leave implicit). Pure numpy / scipy.

Notation: N states x_n, each with K independent continuation returns G_{n,1..K} (outcomes in
[0, 1]); the reference V^MC(x_n) = (1/K) sum_k G_{n,k}; a prediction V-hat(x_n); a baseline b_n
(the state's group baseline V~(x_0): the sign of V(x_t) - V~(x_0) is the sign of TAC's credit
summed over a_0..a_{t-1}). Trajectories are the clusters of the bootstrap (a trajectory's
states share its continuations' randomness and its outcome).

- :func:`value_metrics`: MSE, MAE, bias, Pearson r, sign accuracy and spread of V-hat against
  V^MC, each with a 95% percentile interval from a bootstrap over trajectories.
- :func:`split_half_reliability`: rho_K, the reliability of the K-sample mean.
- :func:`value_ceiling`: the best r and sign accuracy any estimator can reach against V^MC.
- :func:`td_sign_ceiling`: the best sign agreement with the Monte-Carlo advantage
  A^MC = Q^MC - V^MC, each side a mean of N returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

RESAMPLES = 2000
SPLITS = 200
"""Random half-splits averaged in the split-half reliability."""


@dataclass(frozen=True)
class Interval:
    point: float
    low: float
    high: float


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _sign_accuracy(pred: np.ndarray, ref: np.ndarray, base: np.ndarray) -> float:
    """Share of states with sgn(V-hat - b) = sgn(V^MC - b), ties of the reference (V^MC = b:
    neither sign is supported) left out."""
    keep = ref != base
    if not keep.any():
        return float("nan")
    return float(np.mean(np.sign(pred[keep] - base[keep]) == np.sign(ref[keep] - base[keep])))


def _centred(x: np.ndarray, block: np.ndarray) -> np.ndarray:
    """x minus the mean of its block."""
    labels = np.unique(block, return_inverse=True)[1]
    means = np.bincount(labels, x) / np.bincount(labels)
    return x - means[labels]


def _spread(pred: np.ndarray, ref: np.ndarray, block: np.ndarray) -> float:
    """Within-block spread, sqrt(sum_n (V-hat_n - mean_B V-hat)^2 / sum_n (V^MC_n - mean_B
    V^MC)^2) with means over each state's block (a run's step: the states one target head
    valued, so the level it drifts to over training does not count). 0 for a head that predicts
    one value per step (TD credit then sits on the first and last actions whatever its r)."""
    ref_c = _centred(ref, block)
    if not (ref_c**2).sum() > 0:
        return float("nan")
    return float(np.sqrt((_centred(pred, block) ** 2).sum() / (ref_c**2).sum()))


METRICS = {
    "mse": lambda p, r, b, blk: float(np.mean((p - r) ** 2)),
    "mae": lambda p, r, b, blk: float(np.mean(np.abs(p - r))),
    "bias": lambda p, r, b, blk: float(np.mean(p - r)),
    "pearson": lambda p, r, b, blk: _pearson(p, r),
    "sign_accuracy": lambda p, r, b, blk: _sign_accuracy(p, r, b),
    "spread": lambda p, r, b, blk: _spread(p, r, blk),
}
"""(prediction [N], reference [N], baseline [N], block [N]) -> the statistic."""


def value_metrics(
    pred: np.ndarray,
    ref: np.ndarray,
    base: np.ndarray,
    cluster: np.ndarray,
    rng: np.random.Generator,
    resamples: int = RESAMPLES,
    block: np.ndarray | None = None,
) -> dict[str, Interval]:
    """Each of :data:`METRICS` of V-hat (``pred`` [N]) against V^MC (``ref`` [N]) with baselines
    ``base`` [N], with a 95% percentile interval over ``resamples`` resamplings of whole
    clusters (``cluster`` [N]: any labels, one per trajectory); NaN where undefined. ``block``
    [N] (labels; default one block) groups the states for the spread."""
    pred, ref, base = (np.asarray(a, dtype=float) for a in (pred, ref, base))
    blk = np.zeros(len(pred), dtype=int) if block is None else np.asarray(block)
    labels = np.unique(np.asarray(cluster), return_inverse=True)[1]
    members = [np.flatnonzero(labels == c) for c in range(labels.max() + 1)]
    draws = [
        np.concatenate([members[c] for c in rng.integers(0, len(members), len(members))])
        for _ in range(resamples)
    ]
    out = {}
    for name, fn in METRICS.items():
        boot = np.array([fn(pred[d], ref[d], base[d], blk[d]) for d in draws])
        boot = boot[np.isfinite(boot)]
        low, high = np.percentile(boot, [2.5, 97.5]) if len(boot) else (np.nan, np.nan)
        out[name] = Interval(fn(pred, ref, base, blk), float(low), float(high))
    return out


def split_half_reliability(
    returns: np.ndarray, rng: np.random.Generator, splits: int = SPLITS
) -> float:
    """rho_K of the K-sample mean (``returns`` [N, K], K >= 2): the Pearson correlation over
    states of the means of two disjoint random halves of each state's returns, averaged over
    ``splits`` splits, stepped up to K samples by Spearman-Brown, rho_K = 2 rho_h / (1 + rho_h).
    NaN when the halves never vary."""
    returns = np.asarray(returns, dtype=float)
    n, k = returns.shape
    if k < 2:
        raise ValueError(f"split-half reliability needs K >= 2 returns per state, got {k}")
    half = k // 2
    rhos = []
    for _ in range(splits):
        order = rng.permuted(np.tile(np.arange(k), (n, 1)), axis=1)
        a = np.take_along_axis(returns, order[:, :half], 1).mean(1)
        b = np.take_along_axis(returns, order[:, half : 2 * half], 1).mean(1)
        rho = _pearson(a, b)
        if np.isfinite(rho):
            rhos.append(rho)
    if not rhos:
        return float("nan")
    rho_h = float(np.mean(rhos))
    return 2 * rho_h / (1 + rho_h) if rho_h > -1 else float("nan")


def _beta_prior(successes: np.ndarray, trials: np.ndarray) -> tuple[float, float]:
    """(alpha, beta) of the Beta law of the true success probability over states, by maximum
    likelihood of the beta-binomial counts (empirical Bayes: the states' own spread of p)."""
    from scipy.optimize import minimize

    def nll(log_ab: np.ndarray) -> float:
        a, b = np.exp(log_ab)
        return -float(sps.betabinom.logpmf(successes, trials, a, b).sum())

    fit = minimize(nll, np.zeros(2), method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-6})
    a, b = np.exp(fit.x)
    return float(a), float(b)


def _counts(mean: np.ndarray, k: np.ndarray) -> np.ndarray:
    """X = K * mean, the successes behind a K-sample mean of outcomes in {0, 1} (rounded: an
    outcome between 0 and 1 counts as its nearest share)."""
    return np.rint(np.asarray(mean, dtype=float) * k).astype(int)


@dataclass(frozen=True)
class Ceiling:
    """What a perfect estimator would score against the noisy reference."""

    reliability: float
    """rho_K (:func:`split_half_reliability`); NaN for the TD ceiling."""
    pearson: float
    """sqrt(rho_K): the correlation of the true value with its K-sample mean."""
    sign_accuracy: float
    spread: float = float("nan")
    """The true values' within-block spread against the reference (:func:`spread_ceiling`)."""


def spread_ceiling(returns: np.ndarray, block: np.ndarray) -> float:
    """The within-block spread (:func:`_spread`) of the true values against their K-sample
    means: sqrt(1 - e / w), where w = sum_n (V^MC_n - mean_B V^MC)^2 / (N - blocks) is the
    reference's within-block variance and e = mean_n s_n^2 / K its noise (s_n^2 the unbiased
    variance of state n's K returns): classical test theory's true-score share of the variance."""
    returns = np.asarray(returns, dtype=float)
    n, k = returns.shape
    blocks = len(np.unique(block))
    if n <= blocks:
        return float("nan")
    w = (_centred(returns.mean(1), np.asarray(block)) ** 2).sum() / (n - blocks)
    e = float(np.mean(returns.var(axis=1, ddof=1) / k))
    return float(np.sqrt(max(1.0 - e / w, 0.0))) if w > 0 else float("nan")


def value_ceiling(
    returns: np.ndarray,
    base: np.ndarray,
    rng: np.random.Generator,
    splits: int = SPLITS,
    block: np.ndarray | None = None,
) -> Ceiling:
    """The noise ceiling of the K-sample reference (``returns`` [N, K], ``base`` [N]).

    r: sqrt(rho_K), the correlation between the true V(x) and a measurement of it with
    reliability rho_K. Sign accuracy: the expected share of states whose reference sign
    sgn(V^MC - b) equals the true sgn(V - b), ties of the reference left out. Returns are
    treated as Bernoulli(p_n) with p_n ~ Beta(alpha, beta) over states (fitted to the counts:
    :func:`_beta_prior`); each state's posterior Beta(alpha + X_n, beta + K - X_n) gives the
    probability that its true value lies on the reference's side of b_n:

        ceiling = mean over states with X_n / K != b_n of P(sgn(p_n - b_n) = sgn(X_n/K - b_n) | X_n)

    Spread: :func:`spread_ceiling` over ``block`` (default one block).
    """
    returns = np.asarray(returns, dtype=float)
    base = np.asarray(base, dtype=float)
    k = returns.shape[1]
    rho = split_half_reliability(returns, rng, splits)
    x = _counts(returns.mean(1), np.full(len(returns), k))
    a, b = _beta_prior(x, np.full(len(x), k))
    above = sps.beta.sf(base, a + x, b + k - x)  # P(p_n > b_n | X_n)
    side = np.sign(x / k - base)
    keep = side != 0
    agree = np.where(side > 0, above, 1.0 - above)[keep]
    sign = float(agree.mean()) if keep.any() else float("nan")
    blk = np.zeros(len(returns), dtype=int) if block is None else np.asarray(block)
    r = float(np.sqrt(rho)) if rho >= 0 else float("nan")
    return Ceiling(rho, r, sign, spread_ceiling(returns, blk))


GRID = np.linspace(0.0, 1.0, 2001)
MIDS = (GRID[1:] + GRID[:-1]) / 2


def td_sign_ceiling(q: np.ndarray, v: np.ndarray, n: np.ndarray) -> float:
    """The best sign agreement with A^MC = Q^MC - V^MC (paper Fig. 5B), each side the mean of
    ``n`` [M] Bernoulli returns (``q`` [M], ``v`` [M]): the expected share of compared actions
    (Q^MC != V^MC, as :func:`~.diagnose.td_sign` compares) whose sgn(A^MC) equals the true
    sgn(p_q - p_v), with the sides' true p from their posteriors under one Beta prior fitted to
    all counts (:func:`value_ceiling`). (Where a_t ended the episode, Q is the recorded outcome,
    known exactly; treating it as an n-sample mean lowers the ceiling slightly.)"""
    n = np.asarray(n, dtype=int)
    xq, xv = _counts(q, n), _counts(v, n)
    a, b = _beta_prior(np.concatenate([xq, xv]), np.concatenate([n, n]))
    keep = xq != xv
    agree = []
    for i in np.flatnonzero(keep):
        # P(p_q > p_v) = integral of F_v dF_q, over the grid's cells (the densities may be
        # infinite at 0 or 1; their distribution functions are not).
        mass_q = np.diff(sps.beta.cdf(GRID, a + xq[i], b + n[i] - xq[i]))
        cv = sps.beta.cdf(MIDS, a + xv[i], b + n[i] - xv[i])
        p_q_above = float(mass_q @ cv)
        agree.append(p_q_above if xq[i] > xv[i] else 1.0 - p_q_above)
    return float(np.mean(agree)) if agree else float("nan")
