"""rliable-style aggregates on hand-computable matrices; batching; the stratified bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats as sps

from factor_cli.registry import Registry
from factor_cli.stats import (
    AGGREGATES,
    interval_estimate,
    iqm,
    mean,
    median,
    optimality_gap,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap,
)

X = np.array([[0.1, 0.9], [0.2, 0.8], [0.3, 0.7], [0.4, 0.6]])  # 4 runs x 2 tasks


def test_hand_values() -> None:
    assert mean(X) == pytest.approx(0.5)
    assert median(X) == pytest.approx(0.5)
    # 8 values sorted 0.1 .. 0.9 (0.5 missing); drop 2 lowest, 2 highest -> mean(0.3,0.4,0.6,0.7)
    assert iqm(X) == pytest.approx(0.5)
    assert iqm(np.array([[0.0, 0.0, 1.0, 10.0]])) == pytest.approx(0.5)
    assert optimality_gap(X) == pytest.approx(0.5)
    assert optimality_gap(np.array([[1.0, 0.5]]), gamma=0.8) == pytest.approx(0.15)


# 2 runs x 3 tasks with six distinct values, sorted 0.0 0.2 0.4 0.6 0.9 1.0, so every aggregate
# has its own answer (X above gives 0.5 for all of them); and a constant 3 x 2 matrix of 0.25.
Y = np.array([[0.0, 0.2, 0.9], [0.4, 0.6, 1.0]])
CONST = np.full((3, 2), 0.25)
EVERY_AGGREGATE = {  # name -> (value on Y, value on CONST)
    "iqm": ((0.2 + 0.4 + 0.6 + 0.9) / 4, 0.25),  # K = 6, g = 1: drop 0.0 and 1.0
    "mean": (3.1 / 6, 0.25),
    "median": ((0.4 + 0.6) / 2, 0.25),
    "optimality_gap": (1 - 3.1 / 6, 0.75),  # every score <= 1, so the gap is 1 - mean
}


@pytest.mark.parametrize("name", AGGREGATES.names())
def test_every_aggregate_hand_value(name: str) -> None:
    on_y, on_const = EVERY_AGGREGATE[name]
    assert AGGREGATES.get(name)(Y) == pytest.approx(on_y, abs=1e-15)
    assert AGGREGATES.get(name)(CONST) == pytest.approx(on_const, abs=1e-15)


def test_aggregates_are_reported_iqm_first() -> None:
    # the order of the registry is the order of the report's columns and of the CI draws
    assert AGGREGATES.names() == ["iqm", "mean", "median", "optimality_gap"]


@settings(max_examples=50, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 6), st.integers(1, 5)),
        elements=st.floats(0, 1, allow_nan=False),
    )
)
def test_iqm_equals_scipy_trim_mean(x: np.ndarray) -> None:
    assert iqm(x) == pytest.approx(sps.trim_mean(x, 0.25, axis=None), abs=1e-12)


def test_probability_of_improvement_hand_values() -> None:
    x = np.array([[1.0, 0.2], [2.0, 0.2]])  # 2 runs x 2 tasks
    y = np.array([[1.5, 0.2]])  # 1 run
    # task 0: (0 + 1) / 2 = 0.5; task 1: ties -> 0.5; mean 0.5
    assert probability_of_improvement(x, y) == pytest.approx(0.5)
    assert probability_of_improvement(x + 10, y) == pytest.approx(1.0)
    # P(X > Y) + P(Y > X) = 1 (ties split)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 3, (3, 4)) / 2, rng.integers(0, 3, (5, 4)) / 2
    assert probability_of_improvement(a, b) + probability_of_improvement(b, a) == pytest.approx(1)


def test_probability_of_improvement_equals_mann_whitney_per_task() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.random((5, 3)), rng.random((4, 3))
    want = np.mean([sps.mannwhitneyu(x[:, m], y[:, m]).statistic / 20 for m in range(3)])
    assert probability_of_improvement(x, y) == pytest.approx(want)


def test_performance_profile_hand_values() -> None:
    prof = performance_profile(X, [0.0, 0.25, 0.5, 0.9])
    np.testing.assert_allclose(prof, [1.0, 6 / 8, 4 / 8, 0.0])


@pytest.mark.parametrize("name", AGGREGATES.names())
def test_every_aggregate_batches_like_a_loop(name: str) -> None:
    fn = AGGREGATES.get(name)
    batch = np.random.default_rng(2).random((7, 3, 4))
    np.testing.assert_allclose(fn(batch), [fn(b) for b in batch], atol=1e-14)
    assert isinstance(fn(batch[0]), float)


def test_batched_probability_and_profile() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.random((6, 3, 2)), rng.random((6, 4, 2))
    np.testing.assert_allclose(
        probability_of_improvement(x, y), [probability_of_improvement(a, b) for a, b in zip(x, y)]
    )
    taus = np.linspace(0, 1, 5)
    np.testing.assert_allclose(
        performance_profile(x, taus), [performance_profile(a, taus) for a in x]
    )


def test_stratified_bootstrap_resamples_within_each_task() -> None:
    """Every resampled column m holds only values of column m (tasks keep their identity)."""
    x = np.array([[0.0, 10.0, 20.0], [1.0, 11.0, 21.0], [2.0, 12.0, 22.0]])
    seen = stratified_bootstrap([x], lambda s: s.reshape(s.shape[0], -1), 200, 0)
    resampled = seen.reshape(200, 3, 3)
    for m in range(3):
        assert set(np.unique(resampled[:, :, m])) <= set(x[:, m])
    # each run draw is uniform: every value appears about 1/3 of the time
    counts = np.unique(resampled[:, :, 0], return_counts=True)[1] / (200 * 3)
    np.testing.assert_allclose(counts, 1 / 3, atol=0.05)


def test_interval_of_the_mean_matches_slow_loop() -> None:
    rng = np.random.default_rng(4)
    x = rng.random((5, 3))
    est = interval_estimate([x], mean, 20_000, np.random.default_rng(5))
    loop = np.empty(10_000)
    gen = np.random.default_rng(6)
    for r in range(loop.size):
        cols = [x[gen.integers(0, 5, size=5), m] for m in range(3)]
        loop[r] = np.mean(cols)
    lo, hi = np.quantile(loop, [0.025, 0.975])
    sd = loop.std()
    assert est.point == pytest.approx(x.mean())
    assert est.low == pytest.approx(lo, abs=0.15 * sd)  # ~4.5 Monte-Carlo SE
    assert est.high == pytest.approx(hi, abs=0.15 * sd)
    # the stratified bootstrap variance of the mean is sum_m var_m / (N M^2) (population var)
    reps = stratified_bootstrap([x], mean, 20_000, 7)
    assert reps.var() == pytest.approx((x.var(axis=0) / 5).sum() / 9, rel=0.05)


def test_interval_for_probability_and_profile() -> None:
    rng = np.random.default_rng(8)
    x, y = rng.random((4, 3)) + 0.5, rng.random((4, 3))
    est = interval_estimate([x, y], probability_of_improvement, 2_000, 9)
    assert est.low <= est.point <= est.high <= 1.0
    taus = np.linspace(0, 1.5, 7)
    prof = interval_estimate([x], lambda s: performance_profile(s, taus), 500, 10)
    assert prof.point.shape == prof.low.shape == prof.high.shape == (7,)
    assert np.all(prof.low <= prof.point + 1e-12) and np.all(prof.point <= prof.high + 1e-12)


def test_validation_and_registry() -> None:
    with pytest.raises(ValueError, match=r"\[..., N_runs, N_tasks\]"):
        iqm(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="tasks must match"):
        probability_of_improvement(np.ones((2, 2)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        mean(np.array([[np.nan]]))
    with pytest.raises(ValueError, match="replicates must be a positive integer"):
        stratified_bootstrap([X], mean, 0, 0)
    with pytest.raises(ValueError, match="unknown aggregate 'iq'; valid: iqm, mean, median"):
        AGGREGATES.get("iq")
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.add("a", 2)
