"""TAC and the TD-family estimators against loop oracles; telescoping; pinned small cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import (
    broadcast_oracle,
    gae_oracle,
    gigpo_oracle,
    hgpo_oracle,
    n_step_oracle,
    random_batch,
    segments,
    td_oracle,
    uniform_credit_oracle,
)

from factor_cli.credit import (
    ESTIMATORS,
    CreditConfig,
    CreditInputs,
    conservation_drift,
    gae_credit,
    reverse_discounted_sum,
    td_action_credit,
    td_n_step_credit,
    terminal_rewards,
)
from factor_cli.credit.segments import segment_sum


@pytest.mark.parametrize("seed", range(8))
def test_td_matches_loop_oracle(seed: int) -> None:
    b = random_batch(seed)
    got = td_action_credit(b.rewards, b.values, b.traj_index, b.v0)
    want = torch.tensor(td_oracle(b.rewards, b.values, b.traj_index, b.v0), dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("seed", range(4))
def test_n_step_matches_loop_oracle(seed: int, n: int) -> None:
    b = random_batch(seed)
    got = td_n_step_credit(b.rewards, b.values, b.traj_index, b.v0, n)
    want = torch.tensor(
        n_step_oracle(b.rewards, b.values, b.traj_index, b.v0, n), dtype=torch.float64
    )
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.9, 0.95, 1.0])
@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_loop_oracle(seed: int, lam: float) -> None:
    b = random_batch(seed)
    got = gae_credit(b.rewards, b.values, b.traj_index, b.v0, lam)
    want = torch.tensor(
        gae_oracle(b.rewards, b.values, b.traj_index, b.v0, lam), dtype=torch.float64
    )
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_one_step_n_and_gae_zero_are_tac() -> None:
    b = random_batch(11)
    tac = td_action_credit(b.rewards, b.values, b.traj_index, b.v0)
    torch.testing.assert_close(td_n_step_credit(b.rewards, b.values, b.traj_index, b.v0, 1), tac)
    torch.testing.assert_close(gae_credit(b.rewards, b.values, b.traj_index, b.v0, 0.0), tac)


def test_pinned_small_case() -> None:
    # One trajectory, T = 3, terminal reward G = 1, baseline b = 0.25, V = (ignored, 0.5, 0.8).
    r = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    v = torch.tensor([9.0, 0.5, 0.8], dtype=torch.float64)
    idx = torch.tensor([0, 0, 0])
    v0 = torch.tensor([0.25], dtype=torch.float64)
    torch.testing.assert_close(
        td_action_credit(r, v, idx, v0), torch.tensor([0.25, 0.3, 0.2], dtype=torch.float64)
    )
    # 3-step: A_0 = 1 - 0.25; A_1 = 1 - 0.5; A_2 = 1 - 0.8 (V~ = 0 past T): sum 1.45 != 0.75.
    three = td_n_step_credit(r, v, idx, v0, 3)
    torch.testing.assert_close(three, torch.tensor([0.75, 0.5, 0.2], dtype=torch.float64))
    # GAE(0.5): A_2 = 0.2, A_1 = 0.3 + 0.1 = 0.4, A_0 = 0.25 + 0.15 + 0.05 = 0.45.
    gae = gae_credit(r, v, idx, v0, 0.5)
    torch.testing.assert_close(gae, torch.tensor([0.45, 0.4, 0.2], dtype=torch.float64))


def test_single_action_trajectory() -> None:
    got = td_action_credit(
        torch.tensor([1.0]), torch.tensor([0.7]), torch.tensor([0]), torch.tensor([0.4])
    )
    torch.testing.assert_close(got, torch.tensor([0.6]))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    max_t=st.integers(1, 12),
    scale=st.floats(1e-3, 1e3),
)
def test_property_telescoping(seed: int, max_t: int, scale: float) -> None:
    """Property 1: sum_t A*_t = sum_t r_t - V~(x_0) for any value head (= A^seq by convention)."""
    b = random_batch(seed, max_t=max_t, dtype=torch.float32)
    values = b.values * scale
    credit = td_action_credit(b.rewards, values, b.traj_index, b.v0)
    n = len(b.lengths_T)
    want = segment_sum(b.rewards, b.traj_index, n) - b.v0
    # float32 rounding of T residuals and two sums of up to T terms: each of the ~2T roundings
    # errs by at most eps times a partial sum, itself at most T times the largest term.
    magnitude = float(b.rewards.abs().max()) + float(values.abs().max()) + float(b.v0.abs().max())
    bound = 2 * max_t**2 * torch.finfo(torch.float32).eps * magnitude
    torch.testing.assert_close(segment_sum(credit, b.traj_index, n), want, atol=bound, rtol=0)


def test_n_step_and_gae_do_not_conserve_in_general() -> None:
    b = random_batch(3, max_t=8)
    n = len(b.lengths_T)
    want = segment_sum(b.rewards, b.traj_index, n) - b.v0
    for credit in (
        td_n_step_credit(b.rewards, b.values, b.traj_index, b.v0, 3),
        gae_credit(b.rewards, b.values, b.traj_index, b.v0, 0.9),
    ):
        assert (segment_sum(credit, b.traj_index, n) - want).abs().max() > 1e-3


def test_reverse_discounted_sum_long_horizon_stable() -> None:
    # 200 steps with a tiny factor would overflow a factor^{-t} rescaling; the matrix form is exact.
    x = torch.ones(200, dtype=torch.float64)
    idx = torch.zeros(200, dtype=torch.long)
    y = reverse_discounted_sum(x, idx, 1, 0.1)
    assert torch.isfinite(y).all()
    assert math.isclose(float(y[0]), (1 - 0.1**200) / 0.9, rel_tol=1e-12)
    assert float(y[-1]) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rewards": torch.tensor([])}, "rewards is empty"),
        ({"values": torch.tensor([0.0, 1.0])}, "values has length 2"),
        ({"rewards": torch.tensor([0.0, float("nan"), 1.0])}, "rewards contains NaN"),
        ({"traj_index": torch.tensor([0, 1, 0])}, "traj_index is not contiguous"),
        ({"traj_index": torch.tensor([0, 0, 2])}, "traj_index values must lie in"),
        ({"v0": torch.tensor([0.0, 0.0, 0.0])}, "traj_index leaves trajectory 2"),
        ({"traj_index": torch.tensor([0.0, 0.0, 1.0])}, "traj_index must be an integer tensor"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, message: str) -> None:
    args = {
        "rewards": torch.tensor([0.0, 0.0, 1.0]),
        "values": torch.tensor([0.1, 0.2, 0.3]),
        "traj_index": torch.tensor([0, 0, 1]),
        "v0": torch.tensor([0.0, 0.5]),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        td_action_credit(**args)


def test_monte_carlo_credit_pinned_and_not_conserving() -> None:
    from factor_cli.credit import CreditInputs, broadcast_credit, conservation_drift

    traj = torch.tensor([0, 0, 0, 1])
    a_seq = torch.tensor([0.5, -1.0])
    inp = CreditInputs(
        rewards=torch.zeros(4),
        values=torch.zeros(4),
        traj_index=traj,
        v0=torch.zeros(2),
        a_seq=a_seq,
        group_index=torch.tensor([0, 0]),
    )
    credit = broadcast_credit(inp, None)  # type: ignore[arg-type]
    torch.testing.assert_close(credit, torch.tensor([0.5, 0.5, 0.5, -1.0]))
    # Every action gets A^seq: the sum is T_i A^seq_i, a drift of (T_i - 1) A^seq_i.
    torch.testing.assert_close(conservation_drift(credit, traj, a_seq), torch.tensor([1.0, 0.0]))


def _consistent_inputs(seed: int) -> CreditInputs:
    """Estimator inputs as assign_credit builds them: r_t = 0 except r_{T-1} = terminal_i, and
    A^seq_i = terminal_i - V~(x_0) (so one-step TD telescopes to A^seq_i)."""
    b = random_batch(seed)
    terminal = torch.randn(b.v0.numel(), generator=torch.Generator().manual_seed(seed))
    terminal = terminal.to(torch.float64)
    return CreditInputs(
        rewards=terminal_rewards(terminal, b.traj_index),
        values=b.values,
        traj_index=b.traj_index,
        v0=b.v0,
        a_seq=terminal - b.v0,
        group_index=b.group_index,
        state_key=b.state_key,
    )


def _td_args(inp: CreditInputs) -> tuple:
    return inp.rewards, inp.values, inp.traj_index, inp.v0


CFG = CreditConfig()
# Loop oracle of every estimator; "td-shuffled" is checked as a permutation of "td" below.
ESTIMATOR_ORACLES = {
    "td": lambda inp: td_oracle(*_td_args(inp)),
    "td-3": lambda inp: n_step_oracle(*_td_args(inp), 3),
    "td-5": lambda inp: n_step_oracle(*_td_args(inp), 5),
    "gae-0.9": lambda inp: gae_oracle(*_td_args(inp), 0.9),
    "gae-0.95": lambda inp: gae_oracle(*_td_args(inp), 0.95),
    "broadcast": lambda inp: broadcast_oracle(inp.a_seq, inp.traj_index),
    "mc": lambda inp: broadcast_oracle(inp.a_seq, inp.traj_index),
    "uniform": lambda inp: uniform_credit_oracle(inp.a_seq, inp.traj_index),
    "td-shuffled": lambda inp: td_oracle(*_td_args(inp)),
    "gigpo": lambda inp: gigpo_oracle(
        inp.rewards,
        inp.traj_index,
        inp.group_index,
        inp.state_key,
        inp.a_seq,
        CFG.gigpo_gamma,
        CFG.gigpo_omega,
        CFG.gigpo_norm,
    ),
    "hgpo": lambda inp: hgpo_oracle(
        inp.rewards,
        inp.traj_index,
        inp.group_index,
        inp.state_key,
        inp.a_seq,
        CFG.hgpo_depth,
        CFG.hgpo_gamma,
        CFG.hgpo_alpha,
        CFG.hgpo_norm,
        CFG.hgpo_base_group,
    ),
}
PERMUTED = {"td-shuffled"}


def test_every_estimator_has_an_oracle() -> None:
    assert set(ESTIMATOR_ORACLES) == set(ESTIMATORS.names())


@pytest.mark.parametrize("name", ESTIMATORS.names())
@pytest.mark.parametrize("seed", range(3))
def test_every_estimator_matches_its_oracle_and_flags(name: str, seed: int) -> None:
    """Each registry entry against its loop oracle; its ``conserves`` flag holds exactly (and
    its absence means drift on this batch); ``uses_values`` iff the value head moves it."""
    est = ESTIMATORS.get(name)
    inp = _consistent_inputs(seed)
    got = est(inp, CFG, torch.Generator().manual_seed(0))
    want = torch.tensor(ESTIMATOR_ORACLES[name](inp), dtype=torch.float64)
    if name in PERMUTED:  # the oracle's values, permuted within each trajectory
        for acts in segments(inp.traj_index.tolist()).values():
            assert sorted(got[acts].tolist()) == pytest.approx(sorted(want[acts].tolist()))
        assert not torch.allclose(got, want)
    else:
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    drift = conservation_drift(got, inp.traj_index, inp.a_seq).abs().max()
    assert (float(drift) < 1e-9) == est.conserves, float(drift)
    moved = dataclasses.replace(inp, values=inp.values + 1.0)
    again = est(moved, CFG, torch.Generator().manual_seed(0))
    assert (not torch.allclose(again, got)) == est.uses_values
