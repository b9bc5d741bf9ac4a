"""TAC: TD action credit and the TD-family alternatives (n-step TD, GAE), gamma = 1.

All of them share the boundary-adjusted potential of one trajectory i with T_i actions

    V~(x_0) = v0[i],   V~(x_t) = V_target(x_t) for 0 < t < T_i,   V~(x_T) = 0,

given packed as ``values[N_act]`` (V_target at the context before each action; the entry of a
trajectory's first action is replaced by ``v0``) and ``traj_index[N_act]`` (each trajectory's
actions contiguous, in turn order). One-step TD telescopes: sum_t A*_t = sum_t r_t - v0[i].
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import checks
from .segments import Ragged, segment_count


def _validate(rewards: Tensor, values: Tensor, traj_index: Tensor, v0: Tensor) -> Tensor:
    checks.vector("rewards", rewards)
    checks.non_empty("rewards", rewards)
    checks.vector("values", values)
    checks.same_length("values", values, rewards.numel(), "action")
    return validate_layout(traj_index, v0, rewards.numel())


def validate_layout(traj_index: Tensor, v0: Tensor, num_actions: int) -> Tensor:
    """Check v0[N_traj] and traj_index[N_act] (every trajectory present, contiguous); returns
    traj_index as int64."""
    checks.vector("v0", v0)
    checks.non_empty("v0", v0)
    traj_index = checks.index("traj_index", traj_index, v0.numel(), length=num_actions)
    checks.every_segment_present("traj_index", segment_count(traj_index, v0.numel()), "trajectory")
    checks.contiguous("traj_index", traj_index, v0.numel())
    return traj_index


def first_last(traj_index: Tensor) -> tuple[Tensor, Tensor]:
    """(is_first, is_last)[N_act]: whether each action opens / closes its trajectory."""
    is_first = torch.ones_like(traj_index, dtype=torch.bool)
    is_first[1:] = traj_index[1:] != traj_index[:-1]
    is_last = torch.ones_like(traj_index, dtype=torch.bool)
    is_last[:-1] = is_first[1:]
    return is_first, is_last


def boundary_potential(values: Tensor, traj_index: Tensor, v0: Tensor) -> tuple[Tensor, Tensor]:
    """(V~(x_t), V~(x_{t+1})) for every action, both shape [N_act]."""
    is_first, is_last = first_last(traj_index)
    v_now = torch.where(is_first, v0.to(values.dtype)[traj_index], values)
    v_next = torch.zeros_like(v_now)
    v_next[:-1] = v_now[1:]
    v_next = torch.where(is_last, torch.zeros_like(v_next), v_next)
    return v_now, v_next


def td_action_credit(
    rewards: Tensor, values: Tensor, traj_index: Tensor, v0: Tensor, *, check: bool = True
) -> Tensor:
    """One-step TAC:  A*_t = r_t + V~(x_{t+1}) - V~(x_t),  gamma = 1.

    Args:
        rewards: r_t, shape [N_act].
        values: V_target(x_t), shape [N_act]; the first action's entry of each trajectory is unused.
        traj_index: trajectory of each action, shape [N_act], int, contiguous in turn order.
        v0: V~(x_0) per trajectory (b_i or 0 by convention), shape [N_traj].
        check: validate the inputs (False only for inputs already validated, e.g. a PackedBatch).

    Returns:
        A*[N_act], with sum_t A*_t = sum_t r_t - v0[i] exactly (telescoping).
    """
    traj_index = _validate(rewards, values, traj_index, v0) if check else traj_index.long()
    v_now, v_next = boundary_potential(values, traj_index, v0)
    return rewards + v_next - v_now


def td_n_step_credit(
    rewards: Tensor, values: Tensor, traj_index: Tensor, v0: Tensor, n: int
) -> Tensor:
    """n-step TD:  A_t = sum_{i<n} r_{t+i} + V~(x_{t+n}) - V~(x_t),  with r = V~ = 0 past T.

    Shapes as :func:`td_action_credit`; n >= 1 (n = 1 is one-step TAC).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    traj_index = _validate(rewards, values, traj_index, v0)
    lay = Ragged.of(traj_index, v0.numel())
    v_now, _ = boundary_potential(values, traj_index, v0)
    # Pad n columns of zeros past the longest trajectory: r and V~ vanish from x_T on.
    r = torch.nn.functional.pad(lay.pad(rewards, traj_index), (0, n))
    v = torch.nn.functional.pad(lay.pad(v_now, traj_index), (0, n))
    width = lay.max_length
    ret = sum(r[:, i : i + width] for i in range(n)) + v[:, n : n + width]
    return lay.unpad(ret, traj_index) - v_now


def reverse_discounted_sum(x: Tensor, traj_index: Tensor, num_traj: int, factor: float) -> Tensor:
    """y_t = sum_{s=t}^{T-1} factor^{s-t} x_s within each trajectory (truncated at T), [N_act].

    Computed as one [N_traj, T_max] x [T_max, T_max] product with the upper-triangular matrix of
    powers, which is exact and stable where a factor^{-t} rescaling trick would overflow.
    """
    lay = Ragged.of(traj_index, num_traj)
    dense = lay.pad(x, traj_index)
    steps = torch.arange(lay.max_length, device=x.device, dtype=torch.float64)
    lag = steps[:, None] - steps[None, :]  # lag[s, t] = s - t
    powers = torch.where(lag >= 0, float(factor) ** lag.clamp_min(0), torch.zeros_like(lag))
    return lay.unpad(dense @ powers.to(x.dtype), traj_index)


def gae_credit(
    rewards: Tensor, values: Tensor, traj_index: Tensor, v0: Tensor, lam: float
) -> Tensor:
    """GAE(lambda), gamma = 1, truncated at T:  A_t = sum_{l=0}^{T-1-t} lambda^l delta_{t+l},

    where delta_t = r_t + V~(x_{t+1}) - V~(x_t) is the one-step TAC residual. lambda in [0, 1];
    lambda = 0 is TAC, lambda = 1 is the Monte-Carlo return minus V~(x_t).
    """
    checks.unit_interval("lam", lam)
    delta = td_action_credit(rewards, values, traj_index, v0)
    return reverse_discounted_sum(delta, traj_index.long(), v0.numel(), lam)
