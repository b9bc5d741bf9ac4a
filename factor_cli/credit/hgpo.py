"""HGPO's step advantage: Hierarchy-of-Groups Policy Optimization (He et al., arXiv 2602.22817).

Sources: the paper's definitions as its abstract and public summaries give them (the k-step
context operator C_k, nested groups G_0 ⊇ ... ⊇ G_K, per-group advantages, adaptive weights
favouring more consistent contexts) and its public code (verl-agent ``recipe/hgpo``), read
for the exact form, which we follow where the two could differ: the weights (L^alpha below),
which groups count, the population std, the optional base group. Indices as in
docs/design.md section 4.1: trajectory i of task group g, action t with anchor state s_t; R_t
the discounted step return.

Hierarchical groups (one definition with GiGPO's anchor groups: ``states.context_groups``).
With the k-step context operator C_k(s_t) = (s_{t-k}, ..., s_t), the level-k group of action t
is

    G_k(t) = {(i', t') in group g : C_k(s_{t'}) = C_k(s_t)},    k = 0..H,

G_0 = GiGPO's anchor group and G_0 ⊇ G_1 ⊇ ... ⊇ G_H. An action with t < k is in no G_k.

Per-level advantage, over the returns R_t = sum_{s >= t} gamma^{s-t} r_s of the group:

    A_k(t) = (R_t - mean_{G_k} R) / (std_{G_k} R + eps)     norm = "std" (population std)
    A_k(t) =  R_t - mean_{G_k} R                            norm = "mean"

Adaptive weighting: level k counts for action t iff |G_k(t)| >= 2 and A_k(t) != 0 (a group of
one, or of equal returns, says nothing about this step; a return exactly at the group mean is
dropped too, as the public code does). Over the set K(t) of counted levels,

    w_k(t) = L_k^alpha / (sum_{k' in K(t)} L_{k'}^alpha + eps),    L_k = k + 2,
    A^H_t  = sum_{k in K(t)} w_k(t) A_k(t)                   (0 when K(t) is empty),

so deeper (more context-consistent) groups weigh more: L_k = k + 2 is the public code's length
weight (its window of k + 1 states, plus one), alpha = 0 gives equal weights. With
``base_group`` the episode advantage joins as one more item, A_{-1} = A^seq_i with L_{-1} = 1
(the code's "base group"), counted iff A^seq_i != 0. Unlike GiGPO, A^H_t is the whole advantage
(no episode term is added), so without the base group a step alone in every group gets 0.

"A_k != 0" is tested against rounding: a group whose returns are all equal (max = min) gives 0
exactly, and |R_t - mean| <= 8 eps_dtype max_G |R| counts as 0.

Defaults (``CreditConfig``), those of the public ALFWorld/WebShop scripts: H = 2 (the prompt's
history window there, as in our tiny model's prompt of the last 2 turns), gamma = 0.95,
alpha = 1, norm "std", no base group, eps = 1e-6.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import checks
from .config import DEFAULTS
from .gigpo import check_step_inputs
from .segments import segment_standardize
from .states import context_groups
from .tac import reverse_discounted_sum

HGPO_NORMS = ("std", "mean")


def level_advantages(ret: Tensor, groups: Tensor, norm: str, eps: float) -> tuple[Tensor, Tensor]:
    """A_k(t) and whether level k counts for t, both [H + 1, N_act].

    Args:
        ret: R_t, [N_act].
        groups: level-k group id of each action (``context_groups``; -1 = none), [H + 1, N_act].
    """
    adv = torch.zeros(groups.shape, dtype=ret.dtype, device=ret.device)
    counts = torch.zeros(groups.shape, dtype=torch.bool, device=ret.device)
    for k in range(groups.shape[0]):  # H + 1 levels, each one vectorised over actions
        idx = (groups[k] >= 0).nonzero().squeeze(1)
        gid = groups[k, idx]
        n = int(gid.max()) + 1 if gid.numel() else 0
        adv[k, idx], counts[k, idx] = segment_standardize(
            ret[idx], gid, n, "no-contrast", eps, divide=norm == "std"
        )
    return adv, counts


def hgpo_advantage(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    state_key: Tensor,
    a_episode: Tensor,
    depth: int = DEFAULTS.hgpo_depth,
    gamma: float = DEFAULTS.hgpo_gamma,
    alpha: float = DEFAULTS.hgpo_alpha,
    norm: str = DEFAULTS.hgpo_norm,
    base_group: bool = DEFAULTS.hgpo_base_group,
    eps: float = 1e-6,
) -> Tensor:
    """HGPO per-action advantage A^H_t (module docstring), shape [N_act].

    Args:
        rewards: r_t per action, [N_act].
        traj_index: trajectory of each action, [N_act], contiguous in turn order.
        group_index: group (task instance) of each trajectory, [N_traj].
        state_key: anchor-state id before each action, [N_act] (``anchor_state_keys``).
        a_episode: episode advantage A^seq_i, [N_traj] (used only with ``base_group``).
        depth: H, the deepest history level; gamma: step-return discount; alpha: weight power.
        norm: "std" or "mean"; base_group: add A^seq_i as the L = 1 item.
    """
    traj_index, group_index = check_step_inputs(
        rewards, traj_index, group_index, state_key, a_episode, gamma
    )
    if not (isinstance(depth, int) and depth >= 0):
        raise ValueError(f"depth must be an integer >= 0, got {depth!r}")
    if norm not in HGPO_NORMS:
        raise ValueError(f"norm must be 'std' or 'mean', got {norm!r}")
    checks.positive("eps", eps)
    n_traj = a_episode.numel()
    ret = reverse_discounted_sum(rewards, traj_index, n_traj, gamma)
    groups = context_groups(group_index[traj_index], state_key, traj_index, n_traj, depth)
    adv, counts = level_advantages(ret, groups, norm, eps)
    length = torch.arange(depth + 1, dtype=ret.dtype, device=ret.device) + 2  # L_k = k + 2
    raw = torch.where(counts, length[:, None] ** alpha, torch.zeros_like(adv))
    num, den = (raw * adv).sum(0), raw.sum(0)
    if base_group:
        a_base = a_episode[traj_index]
        has = (a_base != 0).to(ret.dtype)  # L_{-1}^alpha = 1
        num, den = num + has * a_base, den + has
    return num / (den + eps)
