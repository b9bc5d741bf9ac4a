"""PPO with a learned critic (the verl / verl-agent baseline): token GAE, whitening, value loss.

The token chain. GAE runs over the policy's own tokens only: for trajectory i, number its
executable-action tokens n = 1..N_i in turn order (action t's tokens y_{t,1..L_t}, then action
t+1's). Environment observations are not in the chain (the policy did not produce them); they
enter through the critic's context. V_n is the critic's value of the context before token n
(its hidden state at the preceding position; for the first token of action t that is the last
token of x_t, the action's boundary, whose context holds the observation Phi_{t-1}). Rewards sit
on each action's last token, r_n = r_t, which under every convention here leaves only the
terminal reward r_{T-1} on the last token of the trajectory's last action. Then, within the
trajectory, with V_{N_i + 1} = 0:

    delta_n = r_n + gamma V_{n+1} - V_n
    A_n     = sum_{l >= 0} (gamma lambda)^l delta_{n+l}         (truncated at N_i)
    R_n     = A_n + V_n                                         (the critic's target)

so the last token of action t bootstraps from V at the first token of action t+1: the critic's
value at the next action's boundary, after the observation. The reply's non-action tokens
(reasoning, tags) stay in the protocol's own branch with coefficient A^seq_i, as for every
method (docs/design.md section 4.7), so methods differ only in the action tokens' credit. Defaults
gamma = 1, lambda = 0.95 (``CreditConfig.ppo_gamma`` / ``ppo_lambda``).

Whitening (``ppo_whiten``): A' = (A - mean A) / sqrt(var A + 1e-8) over the action tokens of one
PPO mini-batch (unbiased var, as verl's ``masked_whiten``).

Critic loss with value clipping (``ppo_value_clip`` = c, verl's ``cliprange_value``):

    V^clip_n = V^old_n + clip(V_n - V^old_n, -c, c)
    l_n      = 1/2 max((V_n - R_n)^2, (V^clip_n - R_n)^2)

reduced like the policy loss (``REDUCTIONS``: the protocol's token-mean or action-mean, with
the mini-batch's global count as normalizer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from factor_cli.registry import Registry

from . import checks
from .batch import PackedBatch
from .config import DEFAULTS, CreditConfig
from .losses import REDUCTIONS
from .segments import Ragged

WHITEN_EPS = 1e-8


@dataclass(frozen=True)
class TokenGAE:
    advantages: Tensor
    """A_n per action token, [N_tok]."""
    returns: Tensor
    """R_n = A_n + V_n, [N_tok] (the critic's regression target)."""


def _reverse_scan(x: Tensor, index: Tensor, num: int, factor: float) -> Tensor:
    """y_n = x_n + factor * y_{n+1} within each contiguous segment (0 past its end), [N].

    One backward pass over positions, vectorised across segments (a token chain can be
    thousands long, so no [N, N] matrix of powers).
    """
    lay = Ragged.of(index, num)
    dense = lay.pad(x, index)
    out = torch.zeros_like(dense)
    acc = torch.zeros_like(dense[:, 0]) if lay.max_length else dense.new_zeros(num)
    for n in range(lay.max_length - 1, -1, -1):
        acc = dense[:, n] + factor * acc
        out[:, n] = acc
    return lay.unpad(out, index)


def token_gae(
    rewards: Tensor,
    token_values: Tensor,
    action_index: Tensor,
    traj_index: Tensor,
    gamma: float = DEFAULTS.ppo_gamma,
    lam: float = DEFAULTS.ppo_lambda,
) -> TokenGAE:
    """GAE over each trajectory's token chain (module docstring).

    Args:
        rewards: r_t per action, [N_act]; placed on each action's last token.
        token_values: V_n, the critic's value before each action token, [N_tok].
        action_index: action of each token, [N_tok], non-decreasing.
        traj_index: trajectory of each action, [N_act], contiguous in turn order.
        gamma, lam: discount and GAE lambda, each in [0, 1].
    """
    checks.vector("rewards", rewards)
    checks.vector("token_values", token_values)
    checks.unit_interval("gamma", gamma)
    checks.unit_interval("lam", lam)
    n_act = rewards.numel()
    action_index = checks.index("action_index", action_index, n_act, length=token_values.numel())
    n_traj = int(traj_index.max()) + 1 if traj_index.numel() else 0
    traj_index = checks.index("traj_index", traj_index, n_traj, length=n_act)
    checks.contiguous("traj_index", traj_index, n_traj)
    tok_traj = traj_index[action_index]
    checks.contiguous("action_index", action_index, n_act)
    v = token_values.to(rewards.dtype)
    n_tok = v.numel()
    last_of_action = torch.ones(n_tok, dtype=torch.bool, device=v.device)
    last_of_action[:-1] = action_index[1:] != action_index[:-1]
    r = torch.where(last_of_action, rewards[action_index], torch.zeros_like(v))
    v_next = torch.zeros_like(v)
    same = tok_traj[1:] == tok_traj[:-1]  # V_{N_i + 1} = 0 at each chain's end
    v_next[:-1] = torch.where(same, v[1:], torch.zeros_like(v[1:]))
    delta = r + gamma * v_next - v
    adv = _reverse_scan(delta, tok_traj, n_traj, gamma * lam)
    return TokenGAE(advantages=adv, returns=adv + v)


def whiten(x: Tensor, eps: float = WHITEN_EPS) -> Tensor:
    """(x - mean x) / sqrt(var x + eps), unbiased var (0 for a single entry), shape like x."""
    checks.vector("x", x)
    checks.non_empty("x", x)
    var = x.var(unbiased=True) if x.numel() > 1 else x.new_zeros(())
    return (x - x.mean()) * torch.rsqrt(var + eps)


def value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    action_index: Tensor,
    reduction: str,
    clip: float = DEFAULTS.ppo_value_clip,
    normalizer: float | None = None,
) -> Tensor:
    """Clipped critic loss (module docstring), a scalar.

    Args:
        values: V_n under the critic being trained, [N_tok] (carries the gradient).
        values_old: V^old_n, the values the advantages were computed from, [N_tok].
        returns: R_n, [N_tok].
        action_index: action of each token (local ids), [N_tok].
        reduction: "token-mean" or "action-mean"; normalizer: the global count, as for the
            policy loss.
    """
    checks.vector("values", values)
    for name, x in (("values_old", values_old), ("returns", returns)):
        checks.vector(name, x)
        checks.same_length(name, x, values.numel(), "token")
    checks.positive("clip", clip, allow_inf=True)
    old, target = values_old.to(values), returns.to(values)
    clipped = old + (values - old).clamp(-clip, clip)
    per_token = 0.5 * torch.maximum((values - target) ** 2, (clipped - target) ** 2)
    return REDUCTIONS.get(reduction)(per_token, action_index.long(), normalizer)


TokenEstimator = Callable[[PackedBatch, Tensor, CreditConfig], TokenGAE]
TOKEN_ESTIMATORS: Registry[TokenEstimator] = Registry("token credit estimator")
"""Token-level credit from a learned critic (methods with ``critic=True``), by name."""


@TOKEN_ESTIMATORS.register("critic-gae")
def critic_gae(batch: PackedBatch, rewards: Tensor, cfg: CreditConfig) -> TokenGAE:
    """:func:`token_gae` on a packed batch carrying the critic's ``token_values``."""
    if batch.token_values is None:
        raise ValueError(
            "token_values is missing: critic-gae credit needs the critic's value before every "
            "action token (PackedBatch.token_values)"
        )
    return token_gae(
        rewards,
        batch.token_values,
        batch.action_index,
        batch.traj_index,
        cfg.ppo_gamma,
        cfg.ppo_lambda,
    )
