"""Monte-Carlo state values from continuations: VinePPO's V-hat (Kazemnejad et al., 2024,
arXiv 2410.01679), on FACTOR's boundary conventions (docs/design.md section 4.4).

VinePPO replaces the value network by the mean return of K continuations played from each
step boundary. Here that mean is the potential of every interior state, 0 < t < T_i, while
x_0 and x_T keep the conventions TAC uses:

    V-hat(x_0) = V~(x_0) (the convention's baseline),
    V-hat(x_t) = (1/K_t) sum_{c : s_c = t} G_c              for 0 < t < T_i,
    V-hat(x_T) = 0,

with G_c the return of continuation c on the scale of r_{T-1} (``terminal_targets``) and
K_t the number of continuations that started from x_t. One-step TD on V-hat (``td_action_credit``)
then telescopes to A^seq_i for every trajectory, whatever the continuations returned.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import checks
from .segments import segment_count, segment_sum
from .tac import first_last, validate_layout


def monte_carlo_values(
    returns: Tensor, state_index: Tensor, traj_index: Tensor, v0: Tensor
) -> tuple[Tensor, Tensor]:
    """V-hat(x_t) of every action's state: the mean continuation return there (module docstring).

    Args:
        returns: G_c of every continuation that ran, shape [N_c] (continuations whose start
            failed are left out by the caller).
        state_index: the action whose state x_t (before the action) continuation c started
            from, shape [N_c], int, values in [0, N_act).
        traj_index: trajectory of each action, shape [N_act], contiguous in turn order.
        v0: V~(x_0) per trajectory, shape [N_traj].

    Returns:
        (values[N_act], counts[N_act]): ``values`` is V-hat(x_t), in the layout of
        ``PackedBatch.values``; a trajectory's first entry is V~(x_0) (continuations from x_0 are
        ignored: the baseline fixes it). A state no continuation started from takes V-hat of the
        nearest earlier state, so that boundary splits no credit (the action before it gets
        r_t + 0). ``counts`` is K_t, the continuations averaged at each state (0 at x_0).
    """
    checks.vector("returns", returns)
    n_act = traj_index.numel()
    traj_index = validate_layout(traj_index, v0, n_act)
    state_index = checks.index("state_index", state_index, n_act, length=returns.numel())
    is_first, _ = first_last(traj_index)
    counts = torch.where(is_first, 0, segment_count(state_index, n_act))
    sums = segment_sum(returns.to(v0.dtype), state_index, n_act)
    own = torch.where(is_first, v0[traj_index], sums / counts.clamp_min(1).to(v0.dtype))
    # The nearest estimated state at or before t. Every trajectory's first action holds V~(x_0)
    # and trajectories are contiguous, so the running max of the estimated positions never
    # reaches back into the trajectory before.
    position = torch.arange(n_act, device=traj_index.device)
    estimated = torch.where(is_first | (counts > 0), position, torch.zeros_like(position))
    return own[estimated.cummax(0).values], counts
