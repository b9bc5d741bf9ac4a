"""HTA + APM: how an action's credit is spread over its tokens.

Every allocation in ``ALLOCATIONS`` has one signature

    fn(gap[N_tok], action_index[N_tok], credit[N_act], strength, cfg, generator) -> weight[N_tok]

where ``gap`` is the hindsight likelihood gap Delta_{t,j}, ``action_index`` names each token's
action, ``credit`` is the action's credit (its sign orients the scores) and ``strength`` is the
step's eta_k (APM family) or alpha_k (SERL's psi). The token coefficient is then
C_{t,j} = credit_t * weight_{t,j}.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from factor_cli.registry import Registry

from . import checks
from .config import DEFAULTS, CreditConfig
from .segments import permute_within_segments, segment_count, segment_softmax
from .serl import serl_weights

Allocation = Callable[
    [Tensor, Tensor, Tensor, float, CreditConfig, "torch.Generator | None"], Tensor
]
ALLOCATIONS: Registry[Allocation] = Registry("allocation")


def hta_scores(gap: Tensor, action_index: Tensor, credit: Tensor, d: float) -> Tensor:
    """s_{t,j} = sign(A*_t) * clip(Delta_{t,j}, -d, d); sign(0) = 0. Shape [N_tok]."""
    return torch.sign(credit).index_select(0, action_index) * gap.clamp(-d, d)


def allocation(
    gap: Tensor,
    action_index: Tensor,
    credit: Tensor,
    eta: float,
    tau: float = DEFAULTS.tau,
    d: float = DEFAULTS.d,
    *,
    check: bool = True,
) -> Tensor:
    """APM allocation omega[N_tok]:

        rho_{t,j}   = (1 - eta) / L_t + eta * softmax_j(s_{t,j} / tau)
        omega_{t,j} = L_t * rho_{t,j}

    with s from :func:`hta_scores`. omega >= 0 and mean_j omega_{t,j} = 1 for every action, for
    any eta in [0, 1] and tau > 0; a zero-credit action gets the uniform allocation omega = 1.

    Args:
        gap: Delta_{t,j}, [N_tok]. action_index: action of each token, [N_tok] in [0, N_act).
        credit: A*_t, [N_act]. eta: teacher concentration eta_k. tau: softmax temperature.
        d: clip bound (math.inf allowed).
        check: validate the inputs (False only for inputs already validated).
    """
    if check:
        action_index, length = checks.tokens(gap, action_index, credit)
        eta = checks.unit_interval("eta", eta)
        tau = checks.positive("tau", tau)
        d = checks.positive("d", d, allow_inf=True)
    else:
        action_index = action_index.long()
        length = segment_count(action_index, credit.numel())
    scores = hta_scores(gap, action_index, credit, d) / tau
    soft = segment_softmax(scores, action_index, credit.numel(), max_abs=d / tau)
    return (1.0 - eta) + eta * length.to(gap.dtype).index_select(0, action_index) * soft


@ALLOCATIONS.register("per-action")
def _per_action(gap, action_index, credit, strength, cfg, generator, check=True):
    return allocation(gap, action_index, credit, strength, cfg.tau, cfg.d, check=check)


@ALLOCATIONS.register("uniform")
def uniform_allocation(gap, action_index, credit, strength, cfg, generator, check=True):
    """omega_{t,j} = 1 (w/o HTA: eta == 0, the teacher gap is ignored)."""
    if check:
        checks.tokens(gap, action_index, credit)
    return torch.ones_like(gap)


@ALLOCATIONS.register("batch-global")
def batch_global_allocation(gap, action_index, credit, strength, cfg, generator, check=True):
    """Batch-global norm ablation: one softmax over every action token of the batch,

        rho_{t,j} = (1 - eta) / L_t + eta * softmax_batch(s_{t,j} / tau),  omega = L_t rho,

    which no longer preserves the per-action mean.
    """
    if check:
        action_index, length = checks.tokens(gap, action_index, credit)
    else:
        action_index = action_index.long()
        length = segment_count(action_index, credit.numel())
    eta = checks.unit_interval("eta", strength)
    scores = hta_scores(gap, action_index, credit, cfg.d) / cfg.tau
    soft = torch.softmax(scores, dim=0)
    return (1.0 - eta) + eta * length[action_index].to(gap.dtype) * soft


@ALLOCATIONS.register("token-shuffled")
def token_shuffled_allocation(gap, action_index, credit, strength, cfg, generator, check=True):
    """TokenShuffled ablation: the gaps are permuted at random within each action before APM.

    The permutation is drawn from ``generator`` (a fresh one per step in training), so the
    allocation keeps its distribution of weights but loses which token earned them. Tokens of
    one action must be contiguous.
    """
    if check:
        action_index, _ = checks.tokens(gap, action_index, credit)
        checks.contiguous("action_index", action_index, credit.numel())
    action_index = action_index.long()
    perm = permute_within_segments(action_index, generator)
    return allocation(gap[perm], action_index, credit, strength, cfg.tau, cfg.d, check=check)


@ALLOCATIONS.register("serl-psi")
def _serl_psi(gap, action_index, credit, strength, cfg, generator, check=True):
    """SERL's multipliers w_{t,j} with A = the action's credit (A^seq for SERL, A*_t for
    TAC+SERL-psi) and alpha_k as the strength."""
    lo, hi = cfg.psi_bounds
    return serl_weights(gap, action_index, credit, strength, cfg.psi_clip, lo, hi, check=check)
