"""Trajectory advantages A^seq_i per environment convention (paper Appendix C).

Each convention (``CONVENTIONS``) maps the group's outcomes to three per-trajectory tensors:

* ``a_seq[N_traj]``      A^seq_i, the trajectory advantage;
* ``terminal[N_traj]``   r_{T-1}, the reward placed on the last action;
* ``v0[N_traj]``         V~(x_0), the boundary potential of the first context.

They satisfy ``terminal - v0 = a_seq`` so one-step TD credit telescopes to A^seq_i exactly
(V~(x_T) = 0 always). ``group_index[N_traj]`` names each trajectory's group (the K rollouts of
one task instance).

A convention also says how an outcome reached from one of the group's intermediate states (a
continuation, docs/design.md section 5.2) maps onto the scale of r_{T-1}:
:func:`terminal_targets`, the value head's Monte-Carlo target. Both live here so the scale the
value head learns is, by construction, the scale TAC's potential V~ telescopes against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from factor_cli.registry import Registry

from . import checks
from .segments import segment_count, segment_mean, segment_standardize, segment_sum

STD_EPS = 1e-8
"""eps of group standardisation: A^seq = (G~ - mean) / (std + eps) (docs/design.md section 4.2)."""
MIN_STD = 1e-6
"""A group whose outcome std is below this has A^seq = 0 (all members did equally well)."""


@dataclass(frozen=True)
class TrajectoryAdvantage:
    a_seq: Tensor
    terminal: Tensor
    v0: Tensor


AdvantageFn = Callable[[Tensor, Tensor], TrajectoryAdvantage]
TargetFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Convention:
    """One environment convention: the group's advantages and the continuation-target scale.

    ``advantage(outcome[N_traj], group_index[N_traj]) -> TrajectoryAdvantage``;
    ``target(outcome[N_c], group_index[N_c], root_outcome[N_traj], root_group_index[N_traj])
    -> [N_c]`` (see :func:`terminal_targets`). Calling the convention calls ``advantage``.
    """

    advantage: AdvantageFn
    target: TargetFn

    def __call__(self, outcome: Tensor, group_index: Tensor) -> TrajectoryAdvantage:
        return self.advantage(outcome, group_index)


CONVENTIONS: Registry[Convention] = Registry("outcome convention")


def _groups(outcome: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, int]:
    checks.vector("outcome", outcome)
    checks.non_empty("outcome", outcome)
    num_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    group_index = checks.index("group_index", group_index, num_groups, length=outcome.numel())
    return outcome, group_index, num_groups


def group_moments(outcome: Tensor, group_index: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """(mean_g, std_g), each [num_groups]: the mean and population std of each group's outcomes.

    ``outcome[N]`` and ``group_index[N]`` (int64, in [0, num_groups)) are not re-checked.
    """
    mean = segment_mean(outcome, group_index, num_groups)
    var = segment_mean((outcome - mean[group_index]) ** 2, group_index, num_groups)
    return mean, var.sqrt()


def standardize(
    x: Tensor, mean: Tensor, std: Tensor, eps: float = STD_EPS, min_std: float = MIN_STD
) -> Tensor:
    """(x - mean) / (std + eps), 0 where std < min_std; all arguments of one shape."""
    z = (x - mean) / (std + eps)
    return torch.where(std < min_std, torch.zeros_like(z), z)


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


def group_standardize(
    outcome: Tensor, group_index: Tensor, eps: float = STD_EPS, min_std: float = MIN_STD
) -> TrajectoryAdvantage:
    """WebShop: A^seq_i = (G~_i - mean_g) / (std_g + eps), 0 where std_g < min_std.

    std is the population standard deviation over the group; r_{T-1} = A^seq_i; V~(x_0) = 0
    (:func:`~factor_cli.credit.segments.segment_standardize`, rule ``min-std``).
    """
    outcome, group_index, n = _groups(outcome, group_index)
    a_seq, _ = segment_standardize(outcome, group_index, n, "min-std", eps, min_std=min_std)
    return TrajectoryAdvantage(a_seq=a_seq, terminal=a_seq, v0=torch.zeros_like(a_seq))


def raw_outcome(outcome: Tensor, group_index: Tensor) -> TrajectoryAdvantage:
    """ScienceWorld: A^seq_i = G_i,  r_{T-1} = G_i,  V~(x_0) = 0 (no group baseline)."""
    outcome, _, _ = _groups(outcome, group_index)
    return TrajectoryAdvantage(
        a_seq=outcome.clone(), terminal=outcome.clone(), v0=torch.zeros_like(outcome)
    )


def _outcome_scale(
    outcome: Tensor, group_index: Tensor, root_outcome: Tensor, root_group_index: Tensor
) -> Tensor:
    """r_{T-1} = G: the continuation's own outcome is already on the terminal scale."""
    return outcome.clone()


def _standardized_scale(
    outcome: Tensor, group_index: Tensor, root_outcome: Tensor, root_group_index: Tensor
) -> Tensor:
    """r_{T-1} = (G~_c - mean_g) / (std_g + eps) with the ROOT group's mean and std (0 when
    std_g < min_std): the scale the group's own terminal rewards were put on."""
    mean, std = group_moments(root_outcome, root_group_index, int(root_group_index.max()) + 1)
    return standardize(outcome, mean[group_index], std[group_index])


CONVENTIONS.add("leave-one-out", Convention(leave_one_out, _outcome_scale))
CONVENTIONS.add("group-standardize", Convention(group_standardize, _standardized_scale))
CONVENTIONS.add("raw", Convention(raw_outcome, _outcome_scale))


def terminal_targets(
    convention: str,
    outcome: Tensor,
    group_index: Tensor,
    root_outcome: Tensor,
    root_group_index: Tensor,
) -> Tensor:
    """Monte-Carlo value targets on the scale of r_{T-1}, shape [N_c].

    A continuation c restarted from a state of a root trajectory in group g ends with outcome
    G_c; its target is the terminal reward r_{T-1} that outcome would have earned in that group:

        leave-one-out, raw:   target_c = G_c
        group-standardize:    target_c = (G~_c - mean_g) / (std_g + eps), 0 if std_g < min_std

    with mean_g, std_g over the root outcomes of group g (the continuations do not move them).

    Args:
        convention: a name in ``CONVENTIONS``.
        outcome: G_c of each continuation, [N_c].
        group_index: root group of each continuation, [N_c], in [0, N_groups).
        root_outcome: G_i of the root trajectories, [N_traj].
        root_group_index: group of each root trajectory, [N_traj], dense in [0, N_groups).
    """
    conv = CONVENTIONS.get(convention)
    root_outcome, root_group_index, n = _groups(root_outcome, root_group_index)
    checks.vector("outcome", outcome)
    group_index = checks.index("group_index", group_index, n, length=outcome.numel())
    return conv.target(outcome, group_index, root_outcome, root_group_index)


def terminal_rewards(terminal: Tensor, traj_index: Tensor) -> Tensor:
    """r[N_act]: r_{T-1} = terminal[i] on each trajectory's last action, 0 elsewhere.

    ``traj_index`` must be contiguous (actions of a trajectory in turn order).
    """
    is_last = torch.ones_like(traj_index, dtype=torch.bool)
    is_last[:-1] = traj_index[1:] != traj_index[:-1]
    return torch.where(is_last, terminal[traj_index], torch.zeros((), dtype=terminal.dtype))
