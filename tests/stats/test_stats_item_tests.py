"""Item-level tests against scipy (binomtest, wilcoxon, chi2) and brute-force enumerations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from factor_cli.stats import (
    discordant_counts,
    macro_success,
    mcnemar,
    mcnemar_exact,
    paired_tests,
    stratified_mcnemar,
    wilcoxon_signed_rank,
)

# ----------------------------------------------------------------------------- McNemar


def test_discordant_counts_hand_example() -> None:
    a = [1, 1, 0, 0, 1, 0]
    b = [0, 1, 1, 0, 0, 0]
    assert discordant_counts(a, b) == (2, 1)


def test_mcnemar_hand_values() -> None:
    # (|7 - 2| - 1)^2 / 9 = 16/9; p from chi^2_1
    chi2, p = mcnemar(7, 2)
    assert chi2 == pytest.approx(16 / 9)
    assert p == pytest.approx(math.erfc(math.sqrt(16 / 9 / 2)))  # chi^2_1 sf = erfc(sqrt(x/2))
    assert mcnemar(0, 0) == (0.0, 1.0)
    assert mcnemar(3, 0)[0] == pytest.approx(4 / 3)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60))
def test_exact_mcnemar_equals_scipy_binomtest(wins: int, losses: int) -> None:
    want = 1.0 if wins + losses == 0 else sps.binomtest(wins, wins + losses, 0.5).pvalue
    assert mcnemar_exact(wins, losses) == pytest.approx(want, rel=1e-10, abs=1e-15)


# ----------------------------------------------------------------------------- stratified


def brute_force_exact_p(wins: list[int], losses: list[int], n: list[int]) -> float:
    """Enumerate every sign assignment of every discordant pair (2^D equally likely)."""
    n_cat = len(n)
    weights = [1.0 / (n_cat * nc) for nc in n]
    pairs = [w for c, w in enumerate(weights) for _ in range(wins[c] + losses[c])]
    t_obs = sum(w * (wi - li) for w, wi, li in zip(weights, wins, losses, strict=True))
    hits = 0
    for signs in itertools.product((1, -1), repeat=len(pairs)):
        t = sum(s * w for s, w in zip(signs, pairs, strict=True))
        hits += abs(t) >= abs(t_obs) - 1e-12
    return hits / 2 ** len(pairs)


def make_items(n: list[int], wins: list[int], losses: list[int], rng: np.random.Generator):
    """Items with the given per-category counts (concordant items random), shuffled."""
    a, b, c = [], [], []
    for k, (nc, w, lo) in enumerate(zip(n, wins, losses, strict=True)):
        conc = nc - w - lo
        same = rng.integers(0, 2, size=conc).tolist()
        a += [1] * w + [0] * lo + same
        b += [0] * w + [1] * lo + same
        c += [f"cat{k}"] * nc
    order = rng.permutation(len(a))
    return np.array(a)[order], np.array(b)[order], np.array(c)[order]


def test_stratified_single_category_is_mcnemar() -> None:
    rng = np.random.default_rng(0)
    a, b, c = make_items([40], [9], [3], rng)
    res = stratified_mcnemar(a, b, c)
    # uncorrected McNemar (b - c)^2 / (b + c) and the binomial test
    assert res.chi2 == pytest.approx(36 / 12)
    assert res.p == pytest.approx(sps.chi2.sf(3.0, 1))
    assert res.exact_p == pytest.approx(sps.binomtest(9, 12).pvalue, rel=1e-12)
    assert res.estimate == pytest.approx((9 - 3) / 40)


def test_stratified_equal_sizes_is_pooled_mcnemar() -> None:
    rng = np.random.default_rng(1)
    a, b, c = make_items([20, 20, 20], [5, 1, 3], [0, 2, 1], rng)
    res = stratified_mcnemar(a, b, c)
    w, lo = discordant_counts(a, b)
    assert res.chi2 == pytest.approx((w - lo) ** 2 / (w + lo))  # Mantel-Haenszel, no correction


def test_stratified_statistic_is_the_macro_difference() -> None:
    rng = np.random.default_rng(2)
    a, b, c = make_items([22, 24, 31, 23, 21, 13], [1, 5, 1, 1, 1, 2], [0, 0, 0, 0, 1, 0], rng)
    res = stratified_mcnemar(a, b, c)
    assert res.estimate == pytest.approx(macro_success(a, c) - macro_success(b, c), abs=1e-14)
    var0 = sum(
        (1 / (6 * nc)) ** 2 * d
        for nc, d in zip([22, 24, 31, 23, 21, 13], [1, 5, 1, 1, 2, 2], strict=True)
    )
    order = np.argsort(res.categories)
    assert res.n[order].tolist() == [22, 24, 31, 23, 21, 13]  # cat0 .. cat5
    assert res.wins[order].tolist() == [1, 5, 1, 1, 1, 2]
    assert res.losses[order].tolist() == [0, 0, 0, 0, 1, 0]
    assert res.se0 == pytest.approx(math.sqrt(var0))
    assert res.chi2 == pytest.approx(res.estimate**2 / var0)
    assert res.exact_p == pytest.approx(
        brute_force_exact_p([1, 5, 1, 1, 1, 2], [0, 0, 0, 0, 1, 0], [22, 24, 31, 23, 21, 13])
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 12), st.integers(0, 3), st.integers(0, 3)),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 2**16),
)
def test_stratified_exact_p_matches_brute_force(
    cells: list[tuple[int, int, int]], seed: int
) -> None:
    n = [max(nc, w + lo) for nc, w, lo in cells]
    wins = [w for _, w, _ in cells]
    losses = [lo for _, _, lo in cells]
    a, b, c = make_items(n, wins, losses, np.random.default_rng(seed))
    res = stratified_mcnemar(a, b, c)
    assert res.exact_p == pytest.approx(brute_force_exact_p(wins, losses, n), abs=1e-12)
    assert 0.0 <= res.p <= 1.0


def test_stratified_no_discordant_pairs() -> None:
    res = stratified_mcnemar([1, 0, 1], [1, 0, 1], ["x", "y", "y"])
    assert (res.estimate, res.chi2, res.p, res.exact_p) == (0.0, 0.0, 1.0, 1.0)


def test_stratified_large_case_uses_meet_in_the_middle() -> None:
    """Many discordant pairs in categories of unequal sizes: the exact p is finite and close to
    the normal approximation (a large-sample check of the enumeration)."""
    rng = np.random.default_rng(3)
    n = [45, 39, 58, 50, 43, 65]
    a, b, c = make_items(n, [11, 6, 13, 14, 14, 16], [9, 8, 16, 14, 10, 21], rng)
    res = stratified_mcnemar(a, b, c)
    assert math.isfinite(res.exact_p)
    assert res.exact_p == pytest.approx(res.p, abs=0.02)


# ----------------------------------------------------------------------------- Wilcoxon


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 45))
def test_wilcoxon_exact_equals_scipy(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = rng.normal(size=n) + 0.3
    got = wilcoxon_signed_rank(x, y, method="exact")
    want = sps.wilcoxon(x, y, method="exact")
    assert got.statistic == pytest.approx(want.statistic)
    assert got.p == pytest.approx(want.pvalue, rel=1e-9)
    assert got.method == "exact"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(5, 400), st.sampled_from(["ties", "binary"]))
def test_wilcoxon_asymptotic_equals_scipy(seed: int, n: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    if kind == "binary":
        x, y = rng.integers(0, 2, size=n), rng.integers(0, 2, size=n)
    else:
        x, y = rng.integers(0, 6, size=n), rng.integers(0, 6, size=n)
    if np.all(x == y):
        x[0] = 1 - y[0] if kind == "binary" else y[0] + 1
    got = wilcoxon_signed_rank(x, y, method="asymptotic")
    want = sps.wilcoxon(x, y, method="asymptotic", correction=False, zero_method="wilcox")
    assert got.statistic == pytest.approx(want.statistic)
    assert got.p == pytest.approx(want.pvalue, rel=1e-9)


def test_wilcoxon_auto_choice_and_scipy_defaults() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=30), rng.normal(size=30)
    assert wilcoxon_signed_rank(x, y).method == "exact"
    assert wilcoxon_signed_rank(x, y).p == pytest.approx(sps.wilcoxon(x, y).pvalue)
    big_x, big_y = rng.normal(size=80), rng.normal(size=80)
    auto = wilcoxon_signed_rank(big_x, big_y)
    assert auto.method == "asymptotic"
    assert auto.p == pytest.approx(sps.wilcoxon(big_x, big_y).pvalue, rel=1e-9)  # n > 50
    ties = wilcoxon_signed_rank([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 0])
    assert ties.method == "asymptotic"


def test_wilcoxon_binary_hand_example() -> None:
    # 6 wins, 2 losses, rest ties: |d| all 1 -> ranks all 4.5; R+ = 27, R- = 9
    x = [1] * 6 + [0] * 2 + [1] * 5
    y = [0] * 6 + [1] * 2 + [1] * 5
    res = wilcoxon_signed_rank(x, y)
    assert (res.statistic, res.r_plus, res.n) == (9.0, 27.0, 8)
    sigma = math.sqrt(8 * 9 * 17 / 24 - (8**3 - 8) / 48)
    assert res.z == pytest.approx((27 - 18) / sigma)


def test_wilcoxon_edge_cases() -> None:
    res = wilcoxon_signed_rank([1.0, 2.0], [1.0, 2.0])
    assert (res.statistic, res.p, res.n, res.method) == (0.0, 1.0, 0, "none")
    with pytest.raises(ValueError, match="no tied"):
        wilcoxon_signed_rank([1, 2, 3], [0, 1, 0], method="exact")
    with pytest.raises(ValueError, match="unknown method"):
        wilcoxon_signed_rank([1], [0], method="perm")
    with pytest.raises(ValueError, match="same length"):
        wilcoxon_signed_rank([1, 2], [0])


def test_paired_tests_bundle() -> None:
    rng = np.random.default_rng(5)
    a, b, c = make_items([30, 30], [6, 2], [1, 1], rng)
    score_a, score_b = a * 100.0, b * 100.0
    res = paired_tests(a, b, c, score_a, score_b)
    assert (res.wins, res.losses, res.n_items) == (8, 2, 60)
    assert res.mcnemar_exact_p == pytest.approx(sps.binomtest(8, 10).pvalue)
    assert res.mcnemar_chi2 == pytest.approx((6 - 1) ** 2 / 10)
    want = sps.wilcoxon(score_a, score_b, method="asymptotic", correction=False)
    assert res.wilcoxon.p == pytest.approx(want.pvalue)


def test_non_binary_success_is_rejected() -> None:
    with pytest.raises(ValueError, match="0/1"):
        discordant_counts([0.5, 1], [0, 1])


def test_stratified_follows_the_macro_sign_where_pooled_mcnemar_does_not() -> None:
    """Large category: A wins 10 of 100; small category: B wins both of 2 items.
    Pooled: 10 wins vs 2 losses (favours A); macro: (0.10 - 1.00) / 2 = -0.45 (favours B)."""
    a = [1] * 10 + [0] * 90 + [0, 0]
    b = [0] * 10 + [0] * 90 + [1, 1]
    c = ["big"] * 100 + ["small"] * 2
    res = stratified_mcnemar(a, b, c)
    assert discordant_counts(a, b) == (10, 2)
    assert res.estimate == pytest.approx(-0.45)
    assert res.estimate == pytest.approx(macro_success(a, c) - macro_success(b, c))
    # T / se0 is negative: the test points the way of the macro difference
    assert res.estimate / res.se0 < 0


def test_stratified_exact_p_gives_up_cleanly_on_a_huge_lattice() -> None:
    """25 categories of prime sizes: lcm ~ 2e36 overflows int64, so exact_p is NaN, not wrong."""
    primes = [
        2,
        3,
        5,
        7,
        11,
        13,
        17,
        19,
        23,
        29,
        31,
        37,
        41,
        43,
        47,
        53,
        59,
        61,
        67,
        71,
        73,
        79,
        83,
        89,
        97,
    ]
    rng = np.random.default_rng(6)
    c = np.repeat(np.arange(len(primes)), primes)
    a, b = rng.integers(0, 2, c.size), rng.integers(0, 2, c.size)
    res = stratified_mcnemar(a, b, c)
    assert math.isnan(res.exact_p)
    assert 0.0 < res.p <= 1.0
    assert res.estimate == pytest.approx(macro_success(a, c) - macro_success(b, c))
