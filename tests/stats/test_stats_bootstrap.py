"""The hierarchical bootstrap against independent references.

- a slow loop that performs the paper's procedure literally (agreement within Monte-Carlo error);
- the exact replicate distribution of tiny cases, enumerated by brute force;
- the exact mean and variance of the replicate distribution (law of total variance);
- hand-derived special cases (stratification keeps category sizes; seed-level resampling).
"""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from factor_cli.stats import bootstrap_replicates, hierarchical_bootstrap, seed_differences

METHODS = ("counts", "items")


def random_case(seed: int, n_seeds: int = 3, n_items: int = 40, n_cat: int = 4):
    """Paired binary successes with unequal category sizes, per seed."""
    rng = np.random.default_rng(seed)
    diffs, strata = [], []
    for _ in range(n_seeds):
        cat = rng.integers(0, n_cat, size=n_items)
        cat[:n_cat] = np.arange(n_cat)  # every category present
        a = rng.random(n_items) < rng.uniform(0.4, 0.9)
        b = rng.random(n_items) < rng.uniform(0.3, 0.8)
        diffs.append(a.astype(float) - b)
        strata.append(cat)
    return diffs, strata


def loop_bootstrap(diffs, strata, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """The procedure written out with Python loops, one draw at a time (the oracle)."""
    n_seeds = len(diffs)
    out = np.empty(replicates)
    for r in range(replicates):
        total = 0.0
        for _ in range(n_seeds):
            s = int(rng.integers(n_seeds))
            d, c = diffs[s], strata[s]
            cats = sorted(set(c.tolist()))
            macro = 0.0
            for cat in cats:
                members = [i for i in range(len(d)) if c[i] == cat]
                draws = [d[members[int(rng.integers(len(members)))]] for _ in members]
                macro += sum(draws) / len(members)
            total += macro / len(cats)
        out[r] = total / n_seeds
    return out


def exact_moments(diffs, strata) -> tuple[float, float]:
    """E and Var of one replicate: mean of S iid slot values X (seed uniform, then items).

    E[X] = mean_s Delta_s;
    Var X = pop-var_s(Delta_s) + mean_s sum_c sigma^2_{s,c} / (C_s^2 n_{s,c}).
    """
    deltas, within = [], []
    for d, c in zip(diffs, strata, strict=True):
        cats = sorted(set(c.tolist()))
        deltas.append(np.mean([d[c == k].mean() for k in cats]))
        within.append(sum(d[c == k].var() / (len(cats) ** 2 * (c == k).sum()) for k in cats))
    deltas = np.array(deltas)
    var_x = deltas.var() + np.mean(within)
    return float(deltas.mean()), float(var_x / len(diffs))


def exact_distribution(diffs, strata) -> dict[Fraction, Fraction]:
    """Brute force: every seed draw and every item multiset, with exact rational weights."""
    per_seed = []
    for d, c in zip(diffs, strata, strict=True):
        cats = sorted(set(c.tolist()))
        dist: dict[Fraction, Fraction] = {Fraction(0): Fraction(1)}
        for k in cats:
            vals = [Fraction(int(v)) for v in d[c == k]]
            n = len(vals)
            means = Counter(sum(t, Fraction(0)) / n for t in itertools.product(vals, repeat=n))
            step = {m: Fraction(cnt, n**n) for m, cnt in means.items()}
            dist = _convolve(dist, {m / len(cats): p for m, p in step.items()})
        per_seed.append(dist)
    n_seeds = len(diffs)
    total: dict[Fraction, Fraction] = {}
    for draw in itertools.product(range(n_seeds), repeat=n_seeds):
        dist = {Fraction(0): Fraction(1, n_seeds**n_seeds)}
        for s in draw:
            dist = _convolve(dist, {v / n_seeds: p for v, p in per_seed[s].items()})
        for v, p in dist.items():
            total[v] = total.get(v, Fraction(0)) + p
    return total


def _convolve(a: dict, b: dict) -> dict:
    out: dict = {}
    for va, pa in a.items():
        for vb, pb in b.items():
            out[va + vb] = out.get(va + vb, Fraction(0)) + pa * pb
    return out


# ----------------------------------------------------------------------------- point estimate


def test_point_estimate_and_per_seed_hand_example() -> None:
    # seed 1: category x d = [1, 1], y d = [-1]  -> (1 + -1) / 2 = 0
    # seed 2: category x d = [0, -1], y d = [1] -> (-0.5 + 1) / 2 = 0.25
    diffs = [np.array([1.0, 1.0, -1.0]), np.array([0.0, -1.0, 1.0])]
    strata = [np.array(["x", "x", "y"]), np.array(["x", "x", "y"])]
    res = hierarchical_bootstrap(diffs, strata, 100, 0)
    np.testing.assert_allclose(res.per_seed, [0.0, 0.25], atol=1e-15)
    assert res.point == pytest.approx(0.125)


def test_exact_distribution_of_tiny_case() -> None:
    """MC replicate frequencies match the brute-force distribution (the hand case above)."""
    diffs = [np.array([1.0, 1.0, -1.0]), np.array([0.0, -1.0, 1.0])]
    strata = [np.array(["x", "x", "y"]), np.array(["x", "x", "y"])]
    exact = exact_distribution(diffs, strata)
    # P(Delta* > 0) by hand: 1/4 * 0 + 2 * 1/4 * 3/4 + 1/4 * 15/16 = 39/64.
    assert sum(p for v, p in exact.items() if v > 0) == Fraction(39, 64)
    r = 40_000
    for method in METHODS:
        dist = bootstrap_replicates(diffs, strata, r, np.random.default_rng(1), method)
        freq = Counter(np.round(dist, 12).tolist())
        assert set(freq) <= {round(float(v), 12) for v in exact}
        for v, p in exact.items():
            got = freq.get(round(float(v), 12), 0) / r
            se = float(np.sqrt(float(p) * (1 - float(p)) / r))
            assert abs(got - float(p)) < 5 * se + 1e-9, (method, v, got, p)


def test_exact_distribution_three_seeds_unequal_categories() -> None:
    diffs = [np.array([1.0, 0, -1, 1]), np.array([0.0, 1, 1]), np.array([-1.0, 0, 1, 0])]
    strata = [np.array([0, 0, 0, 1]), np.array([0, 1, 1]), np.array([0, 1, 1, 1])]
    exact = exact_distribution(diffs, strata)
    values = np.array([float(v) for v in exact])
    probs = np.array([float(p) for p in exact.values()])
    order = np.argsort(values)
    cdf = np.cumsum(probs[order])
    r = 40_000
    for method in METHODS:
        dist = bootstrap_replicates(diffs, strata, r, np.random.default_rng(2), method)
        emp = np.searchsorted(np.sort(dist), values[order] + 1e-12, side="right") / r
        # Kolmogorov distance of the empirical CDF at the atoms; DKW bound at alpha ~ 1e-6.
        assert np.max(np.abs(emp - cdf)) < np.sqrt(np.log(2 / 1e-6) / (2 * r)), method


# ----------------------------------------------------------------------------- loop oracle


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", [0, 1])
def test_agrees_with_slow_loop_within_monte_carlo_error(method: str, case: int) -> None:
    diffs, strata = random_case(case)
    r = 4_000
    slow = loop_bootstrap(diffs, strata, r, np.random.default_rng(100 + case))
    fast = bootstrap_replicates(diffs, strata, r, np.random.default_rng(200 + case), method)
    mean, var = exact_moments(diffs, strata)
    se_mean = np.sqrt(var / r)
    # Both samplers centre on the exact mean and agree with each other.
    assert abs(slow.mean() - mean) < 5 * se_mean
    assert abs(fast.mean() - mean) < 5 * se_mean
    assert abs(fast.mean() - slow.mean()) < 5 * np.sqrt(2) * se_mean
    # Spreads agree (sample-variance SE ~ var * sqrt(2 / r) for near-normal data).
    assert fast.var() == pytest.approx(slow.var(), rel=6 * np.sqrt(2 / r) * np.sqrt(2))
    # Quantiles agree within a few grid steps of the discrete distribution.
    for q in (0.025, 0.5, 0.975):
        assert abs(np.quantile(fast, q) - np.quantile(slow, q)) < 0.6 * np.sqrt(var)


@pytest.mark.parametrize("method", METHODS)
def test_variance_matches_exact_formula(method: str) -> None:
    diffs, strata = random_case(7, n_seeds=3, n_items=200, n_cat=6)
    r = 30_000
    dist = bootstrap_replicates(diffs, strata, r, np.random.default_rng(3), method)
    mean, var = exact_moments(diffs, strata)
    assert dist.mean() == pytest.approx(mean, abs=5 * np.sqrt(var / r))
    assert dist.var() == pytest.approx(var, rel=5 * np.sqrt(2 / r))


# ----------------------------------------------------------------------------- special cases


@pytest.mark.parametrize("method", METHODS)
def test_stratification_keeps_category_sizes(method: str) -> None:
    """Constant d within each category but different across categories: with one seed, every
    stratified resample reproduces Delta exactly (an unstratified one would not)."""
    d = np.array([1.0] * 3 + [0.0] * 7 + [-1.0] * 2)
    c = np.array([0] * 3 + [1] * 7 + [2] * 2)
    dist = bootstrap_replicates([d], [c], 500, 4, method)
    np.testing.assert_allclose(dist, (1 + 0 - 1) / 3, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_seed_level_resampling_distribution(method: str) -> None:
    """No item variance: a replicate is the mean of 3 seed draws of Delta_s in {0, 3, 6}, so it
    takes value k with the multinomial probabilities of 27 equally likely ordered draws."""
    diffs = [np.full(5, v) for v in (0.0, 0.3, 0.6)]
    strata = [np.zeros(5, dtype=int)] * 3
    r = 27_000
    dist = bootstrap_replicates(diffs, strata, r, np.random.default_rng(5), method)
    counts = Counter(np.round(dist * 10, 9).tolist())  # sums of the three draws, in 0.1 units
    exact = Counter(sum(t) for t in itertools.product((0, 3, 6), repeat=3))
    for total, ways in exact.items():
        p = ways / 27
        got = counts.get(round(total / 3, 9), 0) / r
        assert abs(got - p) < 5 * np.sqrt(p * (1 - p) / r)


def test_summary_fields_and_reproducibility() -> None:
    diffs, strata = random_case(3)
    a = hierarchical_bootstrap(diffs, strata, 2_000, np.random.default_rng(9))
    b = hierarchical_bootstrap(diffs, strata, 2_000, 9)
    c = hierarchical_bootstrap(diffs, strata, 2_000, 10)
    np.testing.assert_array_equal(a.distribution, b.distribution)
    assert not np.array_equal(a.distribution, c.distribution)
    lo, hi = np.quantile(a.distribution, [0.025, 0.975])
    assert (a.ci_low, a.ci_high) == pytest.approx((lo, hi), abs=1e-12)
    assert a.p_positive == np.mean(a.distribution > 0)
    assert a.replicates == 2_000 and a.distribution.shape == (2_000,)
    np.testing.assert_allclose(a.per_seed, seed_differences(diffs, strata))
    narrow = hierarchical_bootstrap(diffs, strata, 2_000, 9, confidence=0.5)
    assert a.ci_low < narrow.ci_low < narrow.ci_high < a.ci_high


def test_zero_difference_is_exactly_zero() -> None:
    d = np.array([1.0, -1.0, 0.0] * 100)
    assert seed_differences([d], [np.zeros(300)])[0] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"diffs": [], "strata": []}, "at least one seed"),
        ({"diffs": [np.ones(3)], "strata": [np.zeros(2)]}, "strata has shape"),
        ({"diffs": [np.array([np.nan])], "strata": [np.zeros(1)]}, "NaN"),
        ({"replicates": 0}, "replicates must be a positive integer"),
        ({"method": "fast"}, "unknown bootstrap method 'fast'; valid: counts, items"),
    ],
)
def test_input_errors(kwargs: dict, pattern: str) -> None:
    args = {"diffs": [np.ones(3)], "strata": [np.zeros(3)], "replicates": 10, "rng": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=pattern):
        bootstrap_replicates(**args)


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5])
def test_confidence_must_be_a_level(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence must be in"):
        hierarchical_bootstrap([np.ones(3)], [np.zeros(3)], 10, 0, confidence=confidence)
