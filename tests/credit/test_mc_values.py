"""VinePPO's Monte-Carlo values (``monte_carlo_values``) and the methods that read them
(``vineppo``, ``factor-mc``): loop oracles, telescoping to A^seq, a pinned small case."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import (
    as_packed,
    loo_oracle,
    mc_values_oracle,
    random_batch,
    segments,
    standardize_oracle,
    td_oracle,
)

from factor_cli.credit import (
    CONVENTIONS,
    METHODS,
    PackedBatch,
    assign_credit,
    monte_carlo_values,
    td_action_credit,
)

CONVENTION_NAMES = ["leave-one-out", "group-standardize", "raw"]
MC_METHODS = ["vineppo", "factor-mc"]


def random_continuations(
    n_act: int, seed: int, max_k: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """(returns [N_c], state_index [N_c]): 0..max_k continuations from each action's state, in
    a shuffled order, so some states have none (and some start at x_0, which is ignored)."""
    g = torch.Generator().manual_seed(seed)
    per_state = torch.randint(0, max_k + 1, (n_act,), generator=g)
    state_index = torch.repeat_interleave(torch.arange(n_act), per_state)
    state_index = state_index[torch.randperm(state_index.numel(), generator=g)]
    returns = torch.randn(state_index.numel(), generator=g, dtype=torch.float64)
    return returns, state_index


def convention_oracle(
    convention: str, outcome: torch.Tensor, group: torch.Tensor
) -> tuple[list[float], list[float], list[float]]:
    """(A^seq_i, r_{T-1}, V~(x_0)) per trajectory, from docs/design.md section 4.2's table."""
    if convention == "leave-one-out":
        a_seq, base = loo_oracle(outcome, group)
        return a_seq, [float(x) for x in outcome], base
    if convention == "group-standardize":
        a_seq = standardize_oracle(outcome, group)
        return a_seq, a_seq, [0.0] * len(a_seq)
    return [float(x) for x in outcome], [float(x) for x in outcome], [0.0] * len(outcome)


@pytest.mark.parametrize("seed", range(8))
def test_monte_carlo_values_match_the_loop_oracle(seed: int) -> None:
    b = random_batch(seed)
    returns, state_index = random_continuations(b.traj_index.numel(), seed)
    got, counts = monte_carlo_values(returns, state_index, b.traj_index, b.v0)
    want = mc_values_oracle(returns, state_index, b.traj_index, b.v0)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)
    firsts = [idx[0] for idx in segments(b.traj_index.tolist()).values()]
    for a in range(b.traj_index.numel()):
        expected = 0 if a in firsts else int((state_index == a).sum())
        assert int(counts[a]) == expected


def packed_with_mc_values(seed: int, convention: str) -> tuple[PackedBatch, list[float]]:
    """A random batch whose values are Monte-Carlo means of random continuations, and the
    oracle's V-hat over the convention's V~(x_0)."""
    b = random_batch(seed)
    _, _, v0 = convention_oracle(convention, b.outcome, b.group_index)
    returns, state_index = random_continuations(b.traj_index.numel(), seed + 1)
    v0_t = CONVENTIONS.get(convention)(b.outcome, b.group_index).v0
    values, _ = monte_carlo_values(returns, state_index, b.traj_index, v0_t)
    batch = dataclasses.replace(as_packed(b, convention), values=values)
    return batch, mc_values_oracle(returns, state_index, b.traj_index, v0)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    convention=st.sampled_from(CONVENTION_NAMES),
    method=st.sampled_from(MC_METHODS),
    step=st.sampled_from([1, 2, 11, 60]),
)
def test_mc_credit_telescopes_to_a_seq_against_the_loop_oracle(
    seed: int, convention: str, method: str, step: int
) -> None:
    """A_t = r_t + V-hat(x_{t+1}) - V-hat(x_t) with V-hat(x_0) = V~(x_0) and V-hat(x_T) = 0, all
    from the loop oracles; summed over each trajectory it is A^seq_i, whatever the
    continuations returned, at every step (neither method has a warm-up)."""
    batch, v_hat = packed_with_mc_values(seed, convention)
    a_seq, terminal, v0 = convention_oracle(convention, batch.outcome, batch.group_index)
    trajs = segments(batch.traj_index.tolist())
    rewards = [0.0] * batch.num_actions
    for i, idx in trajs.items():
        rewards[idx[-1]] = terminal[i]
    want = td_oracle(rewards, v_hat, batch.traj_index, v0)
    out = assign_credit(batch, method, step)
    assert not out.warmup
    torch.testing.assert_close(
        out.credit, torch.tensor(want, dtype=torch.float64), atol=1e-9, rtol=0
    )
    for i, idx in trajs.items():
        assert sum(float(out.credit[a]) for a in idx) == pytest.approx(a_seq[i], abs=1e-9)


def test_pinned_case() -> None:
    """Two trajectories under leave-one-out, by hand. Trajectory 0 (G = 1, b = 0): x_1 has
    returns 1, 0, 1 (V-hat = 2/3), x_2 none (V-hat = 2/3, taken from x_1). Trajectory 1
    (G = 0, b = 1): a return at x_0 (ignored), x_1 has 0, 1 (V-hat = 1/2)."""
    traj = torch.tensor([0, 0, 0, 1, 1])
    outcome = torch.tensor([1.0, 0.0], dtype=torch.float64)
    v0 = CONVENTIONS.get("leave-one-out")(outcome, torch.tensor([0, 0])).v0
    returns = torch.tensor([1.0, 0.0, 1.0, 5.0, 0.0, 1.0], dtype=torch.float64)
    state = torch.tensor([1, 1, 1, 3, 4, 4])
    values, counts = monte_carlo_values(returns, state, traj, v0)
    torch.testing.assert_close(
        values, torch.tensor([0.0, 2 / 3, 2 / 3, 1.0, 0.5], dtype=torch.float64)
    )
    assert counts.tolist() == [0, 3, 0, 0, 2]
    credit = td_action_credit(
        torch.tensor([0.0, 0, 1, 0, 0], dtype=torch.float64), values, traj, v0
    )
    torch.testing.assert_close(
        credit, torch.tensor([2 / 3, 0.0, 1 / 3, -0.5, -0.5], dtype=torch.float64)
    )
    batch = PackedBatch(
        action_index=torch.arange(5),
        logp_old=torch.zeros(5, dtype=torch.float64),
        traj_index=traj,
        group_index=torch.tensor([0, 0]),
        outcome=outcome,
        values=values,
    )
    out = assign_credit(batch, "vineppo", 1)
    torch.testing.assert_close(out.credit, credit)
    torch.testing.assert_close(out.coef, credit)  # uniform allocation: C_{t,j} = A_t


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"state_index": torch.tensor([0, 5])}, r"state_index values must lie in \[0, 5\)"),
        ({"state_index": torch.tensor([1])}, "state_index has length 1, expected 2"),
        ({"returns": torch.tensor([1.0, float("nan")])}, "returns contains NaN"),
        ({"traj_index": torch.tensor([0, 1, 0, 1, 1])}, "traj_index is not contiguous"),
    ],
)
def test_bad_inputs_name_the_argument(change: dict, message: str) -> None:
    args = {
        "returns": torch.tensor([1.0, 0.0]),
        "state_index": torch.tensor([1, 2]),
        "traj_index": torch.tensor([0, 0, 0, 1, 1]),
        "v0": torch.tensor([0.5, 0.5]),
    }
    args.update(change)
    with pytest.raises(ValueError, match=message):
        monte_carlo_values(**args)


def test_the_mc_methods_are_data() -> None:
    """vineppo: TD on V-hat, uniform allocation, no teacher, action-mean forced, no value head;
    factor-mc: FACTOR but for its values (and so no value-head warm-up)."""
    vine, factor, factor_mc = (METHODS.get(m) for m in ("vineppo", "factor", "factor-mc"))
    assert (vine.estimator, vine.allocation, vine.schedule, vine.kl) == (
        "td",
        "uniform",
        "none",
        False,
    )
    assert vine.reduction == "action-mean" and not vine.uses_teacher and not vine.warmup
    same = {"name": "factor-mc", "values": "mc", "warmup": False, "summary": factor_mc.summary}
    assert dataclasses.replace(factor, **same) == factor_mc
    for spec in (vine, factor_mc):
        assert spec.values == "mc" and spec.continuations and not spec.uses_value_head
        assert spec.continuation_use == "mc"
    assert factor.continuation_use == "head" and METHODS.get("grpo").continuation_use == "-"


def test_missing_mc_values_are_named() -> None:
    batch = dataclasses.replace(packed_with_mc_values(0, "raw")[0], values=None)
    with pytest.raises(ValueError, match=r"method 'vineppo' .* needs the Monte-Carlo values"):
        assign_credit(batch, "vineppo", 1)


def test_registration_refuses_mc_values_without_continuations() -> None:
    from factor_cli.credit.methods import _add

    spec = dataclasses.replace(METHODS.get("vineppo"), name="vine-nothing", continuations=False)
    with pytest.raises(ValueError, match="Monte-Carlo values need continuations"):
        _add(spec)
    assert "vine-nothing" not in METHODS
