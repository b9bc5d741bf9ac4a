"""Value calibration and the noise ceiling of a Monte-Carlo reference (stats/calibration.py):
exact answers on hand-sized inputs, and the ceilings against simulations whose truth is known."""

from __future__ import annotations

import numpy as np
import pytest

from factor_cli.stats.calibration import (
    split_half_reliability,
    td_sign_ceiling,
    value_ceiling,
    value_metrics,
)


def test_value_metrics_exact_on_a_hand_case() -> None:
    pred, ref, base = np.array([0.2, 0.8, 0.6]), np.array([0.0, 1.0, 0.5]), np.full(3, 0.5)
    got = value_metrics(pred, ref, base, np.array([0, 1, 2]), np.random.default_rng(0), 200)
    assert got["mse"].point == pytest.approx((0.04 + 0.04 + 0.01) / 3)
    assert got["mae"].point == pytest.approx(0.5 / 3)
    assert got["bias"].point == pytest.approx(0.1 / 3)
    assert got["pearson"].point == pytest.approx(np.corrcoef(pred, ref)[0, 1])
    assert got["sign_accuracy"].point == 1.0  # the tie (ref = b) is left out
    assert got["spread"].point == pytest.approx(np.std(pred) / np.std(ref))
    for iv in got.values():
        assert iv.low <= iv.point + 1e-12 and iv.point <= iv.high + 1e-12


def test_one_cluster_gives_a_degenerate_interval_and_clusters_resample_whole() -> None:
    rng = np.random.default_rng(1)
    pred, ref = rng.random(6), rng.random(6)
    one = value_metrics(pred, ref, np.full(6, 0.5), np.zeros(6), rng, 100)
    assert one["mse"].low == one["mse"].high == pytest.approx(one["mse"].point)
    # Two trajectories, each a constant error: the resampled MSE takes only 3 values.
    pred2, ref2 = np.array([1.0, 1.0, 0.0, 0.0]), np.zeros(4)
    two = value_metrics(pred2, ref2, np.full(4, 0.5), np.array([7, 7, 9, 9]), rng, 300)
    assert {two["mse"].low, two["mse"].high} <= {0.0, 0.5, 1.0}


def _simulated(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """True p ~ U(0, 1) per state and K Bernoulli(p) returns each."""
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    return p, (rng.random((n, k)) < p[:, None]).astype(float)


def test_split_half_reliability_recovers_the_true_reliability() -> None:
    # var(p) = 1/12, noise var of a 16-mean E[p(1-p)]/16 = 1/96: rho_16 = (1/12)/(1/12 + 1/96).
    _, returns = _simulated(4000, 16, 0)
    got = split_half_reliability(returns, np.random.default_rng(0), splits=50)
    assert got == pytest.approx(8 / 9, abs=0.02)


def test_reliability_is_one_without_noise_and_near_zero_without_signal() -> None:
    rng = np.random.default_rng(2)
    fixed = np.repeat(rng.random((500, 1)), 8, axis=1)
    assert split_half_reliability(fixed, rng, 10) == pytest.approx(1.0)
    noise = (rng.random((3000, 8)) < 0.5).astype(float)
    assert abs(split_half_reliability(noise, rng, 20)) < 0.05


def test_value_ceiling_matches_what_the_truth_scores_against_the_reference() -> None:
    p, returns = _simulated(4000, 16, 3)
    base = np.full(len(p), 0.5)
    ceiling = value_ceiling(returns, base, np.random.default_rng(0), splits=50)
    ref = returns.mean(1)
    assert ceiling.pearson == pytest.approx(np.corrcoef(p, ref)[0, 1], abs=0.02)
    keep = ref != base
    truth_sign = np.mean(np.sign(p - base)[keep] == np.sign(ref - base)[keep])
    assert ceiling.sign_accuracy == pytest.approx(truth_sign, abs=0.03)
    assert ceiling.sign_accuracy < 1.0


def test_spread_is_within_blocks_zero_for_a_flat_head_and_the_ceiling_for_the_truth() -> None:
    p, returns = _simulated(4000, 16, 5)
    ref, base, traj = returns.mean(1), np.full(len(p), 0.5), np.arange(len(p))
    block = np.arange(len(p)) // 8  # steps of 8 states
    rng = np.random.default_rng(0)
    # A head that predicts one value per step, whatever level it drifted to: no spread.
    flat = np.repeat(rng.random(len(p) // 8), 8)
    assert value_metrics(flat, ref, base, traj, rng, 20, block)["spread"].point < 1e-9
    # Within blocks only: adding a level per block changes nothing.
    truth = value_metrics(p, ref, base, traj, rng, 20, block)["spread"].point
    shifted = value_metrics(p + flat, ref, base, traj, rng, 20, block)["spread"].point
    assert shifted == pytest.approx(truth)
    ceiling = value_ceiling(returns, base, rng, splits=20, block=block)
    assert ceiling.spread == pytest.approx(truth, abs=0.02)
    # One block: the pooled spread, which for the truth is sqrt(rho_K) (= the r ceiling).
    assert value_ceiling(returns, base, rng, splits=50).spread == pytest.approx(
        ceiling.pearson, abs=0.02
    )


def test_spread_matches_a_loop_oracle() -> None:
    rng = np.random.default_rng(6)
    pred, ref, block = rng.random(30), rng.random(30), rng.integers(0, 4, 30)
    num = den = 0.0
    for blk in set(block.tolist()):
        m = block == blk
        num += sum((x - pred[m].mean()) ** 2 for x in pred[m])
        den += sum((x - ref[m].mean()) ** 2 for x in ref[m])
    got = value_metrics(pred, ref, np.full(30, 0.5), np.arange(30), rng, 10, block)
    assert got["spread"].point == pytest.approx((num / den) ** 0.5)


def test_td_sign_ceiling_matches_a_simulation() -> None:
    rng = np.random.default_rng(4)
    m, n = 1200, 16
    pq, pv = rng.random(m), rng.random(m)
    q = (rng.random((m, n)) < pq[:, None]).mean(1)
    v = (rng.random((m, n)) < pv[:, None]).mean(1)
    keep = q != v
    truth = np.mean(np.sign(pq - pv)[keep] == np.sign(q - v)[keep])
    assert td_sign_ceiling(q, v, np.full(m, n)) == pytest.approx(truth, abs=0.04)


def test_split_half_needs_two_returns() -> None:
    with pytest.raises(ValueError, match="K >= 2"):
        split_half_reliability(np.zeros((3, 1)), np.random.default_rng(0))
