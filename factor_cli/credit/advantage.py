"""Trajectory advantages A^seq_i per environment convention (paper Appendix C).

Each convention maps the group's outcomes to three per-trajectory tensors:

* ``a_seq[N_traj]``      A^seq_i, the trajectory advantage;
* ``terminal[N_traj]``   r_{T-1}, the reward placed on the last action;
* ``v0[N_traj]``         V~(x_0), the boundary potential of the first context.

They satisfy ``terminal - v0 = a_seq`` so one-step TD credit telescopes to A^seq_i exactly
(V~(x_T) = 0 always). ``group_index[N_traj]`` names each trajectory's group (the K rollouts of
one task instance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from factor_cli.registry import Registry

from . import checks
from .segments import segment_count, segment_mean, segment_sum


@dataclass(frozen=True)
class TrajectoryAdvantage:
    a_seq: Tensor
    terminal: Tensor
    v0: Tensor


Convention = Callable[[Tensor, Tensor], TrajectoryAdvantage]
CONVENTIONS: Registry[Convention] = Registry("outcome convention")


def _groups(outcome: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, int]:
    checks.vector("outcome", outcome)
    checks.non_empty("outcome", outcome)
    num_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    group_index = checks.index("group_index", group_index, num_groups, length=outcome.numel())
    return outcome, group_index, num_groups


@CONVENTIONS.register("leave-one-out")
def leave_one_out(outcome: Tensor, group_index: Tensor) -> TrajectoryAdvantage:
    """ALFWorld / TWX: b_i = 1/(K-1) sum_{j != i} G_j,  A^seq_i = G_i - b_i,
    r_{T-1} = G_i,  V~(x_0) = b_i.

    Shapes: outcome G[N_traj], group_index[N_traj]. Every group needs K >= 2 members.
    """
    outcome, group_index, n = _groups(outcome, group_index)
    size = segment_count(group_index, n)
    if bool((size[size > 0] < 2).any()):
        raise ValueError(
            "group_index has a group of size 1: the leave-one-out baseline needs K >= 2"
        )
    total = segment_sum(outcome, group_index, n)[group_index]
    baseline = (total - outcome) / (size[group_index] - 1).to(outcome.dtype)
    return TrajectoryAdvantage(a_seq=outcome - baseline, terminal=outcome, v0=baseline)


@CONVENTIONS.register("group-standardize")
def group_standardize(
    outcome: Tensor, group_index: Tensor, eps: float = 1e-8, min_std: float = 1e-6
) -> TrajectoryAdvantage:
    """WebShop: A^seq_i = (G~_i - mean_g) / (std_g + eps), 0 where std_g < min_std.

    std is the population standard deviation over the group; r_{T-1} = A^seq_i; V~(x_0) = 0.
    """
    outcome, group_index, n = _groups(outcome, group_index)
    mean = segment_mean(outcome, group_index, n)
    var = segment_mean((outcome - mean[group_index]) ** 2, group_index, n)
    std = var.sqrt()[group_index]
    a_seq = (outcome - mean[group_index]) / (std + eps)
    a_seq = torch.where(std < min_std, torch.zeros_like(a_seq), a_seq)
    return TrajectoryAdvantage(a_seq=a_seq, terminal=a_seq, v0=torch.zeros_like(a_seq))


@CONVENTIONS.register("raw")
def raw_outcome(outcome: Tensor, group_index: Tensor) -> TrajectoryAdvantage:
    """ScienceWorld: A^seq_i = G_i,  r_{T-1} = G_i,  V~(x_0) = 0 (no group baseline)."""
    outcome, _, _ = _groups(outcome, group_index)
    return TrajectoryAdvantage(
        a_seq=outcome.clone(), terminal=outcome.clone(), v0=torch.zeros_like(outcome)
    )


def terminal_rewards(terminal: Tensor, traj_index: Tensor) -> Tensor:
    """r[N_act]: r_{T-1} = terminal[i] on each trajectory's last action, 0 elsewhere.

    ``traj_index`` must be contiguous (actions of a trajectory in turn order).
    """
    is_last = torch.ones_like(traj_index, dtype=torch.bool)
    is_last[:-1] = traj_index[1:] != traj_index[:-1]
    return torch.where(is_last, terminal[traj_index], torch.zeros((), dtype=terminal.dtype))
