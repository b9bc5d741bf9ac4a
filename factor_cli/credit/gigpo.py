"""GiGPO's step-level advantage under our protocol (Feng et al. 2025).

Anchor-state groups collect the actions, across the K trajectories of one group, taken from an
identical observation (``state_key[N_act]``: equal integers for identical observation text, as
:func:`~factor_cli.credit.states.anchor_state_keys` assigns them). The anchor group is level 0
of :func:`~factor_cli.credit.states.context_groups`, the one definition whose deeper levels HGPO
uses. Within each anchor group the discounted step return

    R_t = sum_{s >= t} gamma^{s-t} r_s

is normalised, and the action's advantage adds it to the episode term:

    A_t = A^E_i + omega * (R_t - mean_g R) / (std_g R + eps)      ("std" normalisation)
    A_t = A^E_i + omega * (R_t - mean_g R)                         ("mean" normalisation)

std is the unbiased sample std of the anchor group. An anchor group with a single member has
nothing to be compared with and gets step term 0 (``segment_standardize``'s rule
``singleton``). Our protocol's episode term A^E_i is the environment convention's A^seq_i, so
GiGPO differs from GRPO only by the step term.
"""

from __future__ import annotations

from torch import Tensor

from . import checks
from .config import DEFAULTS
from .segments import segment_standardize
from .states import anchor_state_keys, context_groups
from .tac import reverse_discounted_sum

__all__ = ["anchor_state_keys", "check_step_inputs", "gigpo_advantage"]


def check_step_inputs(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    state_key: Tensor,
    a_episode: Tensor,
    gamma: float,
) -> tuple[Tensor, Tensor]:
    """Validate the inputs GiGPO and HGPO share; returns (traj_index, group_index) as int64."""
    checks.vector("rewards", rewards)
    checks.non_empty("rewards", rewards)
    checks.vector("a_episode", a_episode)
    n_traj = a_episode.numel()
    traj_index = checks.index("traj_index", traj_index, n_traj, length=rewards.numel())
    checks.contiguous("traj_index", traj_index, n_traj)
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    group_index = checks.index("group_index", group_index, n_groups, length=n_traj)
    if not isinstance(state_key, Tensor) or state_key.is_floating_point() or state_key.dim() != 1:
        raise ValueError("state_key must be a 1-D integer tensor (one observation id per action)")
    checks.same_length("state_key", state_key, rewards.numel(), "action")
    checks.unit_interval("gamma", gamma)
    return traj_index, group_index


def gigpo_advantage(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    state_key: Tensor,
    a_episode: Tensor,
    gamma: float = DEFAULTS.gigpo_gamma,
    omega: float = DEFAULTS.gigpo_omega,
    norm: str = DEFAULTS.gigpo_norm,
    eps: float = 1e-6,
) -> Tensor:
    """GiGPO per-action advantage, shape [N_act].

    Args:
        rewards: r_t per action, [N_act].
        traj_index: trajectory of each action, [N_act], contiguous in turn order.
        group_index: group (task instance) of each trajectory, [N_traj].
        state_key: observation id before each action, [N_act]; equal ids = identical states.
        a_episode: episode-level advantage A^E_i, [N_traj].
        gamma: discount of the step return; omega: weight of the step term.
        norm: "std" or "mean" (see module docstring).
    """
    traj_index, group_index = check_step_inputs(
        rewards, traj_index, group_index, state_key, a_episode, gamma
    )
    if norm not in ("std", "mean"):
        raise ValueError(f"norm must be 'std' or 'mean', got {norm!r}")
    n_traj = a_episode.numel()

    ret = reverse_discounted_sum(rewards, traj_index, n_traj, gamma)
    # Level 0 of the shared context groups is the anchor group (same task, same state).
    anchor = context_groups(group_index[traj_index], state_key, traj_index, n_traj, 0)[0]
    n_anchor = int(anchor.max()) + 1
    step, _ = segment_standardize(
        ret, anchor, n_anchor, "singleton", eps, ddof=1, divide=norm == "std"
    )
    return a_episode[traj_index] + omega * step
