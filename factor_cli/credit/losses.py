"""PPO clipped surrogate with named reductions, the non-action branch and the full objective.

Per token (q = pi_theta / pi_old = exp(logp - logp_old), C the token coefficient):

    l_{t,j} = -min(q C, clip(q, 1 - eps, 1 + eps) C)

Reductions (``REDUCTIONS``), each over the whole PPO mini-batch:

    token-mean:   1/N_tok sum_{t,j} l_{t,j}
    action-mean:  1/N_act sum_t (1/L_t sum_j l_{t,j})

With gradient accumulation or data-parallel ranks pass ``normalizer`` = the global count of
tokens (token-mean) or actions (action-mean), so the loss does not depend on the split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from factor_cli.registry import Registry

from . import checks
from .config import PPO_CLIP_EPS
from .segments import segment_count, segment_sum
from .serl import action_kl

Reduction = Callable[[Tensor, Tensor, "float | None"], Tensor]
REDUCTIONS: Registry[Reduction] = Registry("reduction")


@REDUCTIONS.register("token-mean")
def token_mean(per_token: Tensor, action_index: Tensor, normalizer: float | None = None) -> Tensor:
    """1/N_tok sum over all tokens (N_tok = ``normalizer`` when given)."""
    denom = per_token.numel() if normalizer is None else normalizer
    return per_token.sum() / denom


@REDUCTIONS.register("action-mean")
def action_mean(per_token: Tensor, action_index: Tensor, normalizer: float | None = None) -> Tensor:
    """1/N_act sum_t (1/L_t sum_j l_{t,j}): each action weighs the same whatever its length."""
    n = int(action_index.max()) + 1
    length = segment_count(action_index, n)
    present = length > 0
    per_action = segment_sum(per_token, action_index, n)[present] / length[present].to(
        per_token.dtype
    )
    denom = per_action.numel() if normalizer is None else normalizer
    return per_action.sum() / denom


def _validate(logp: Tensor, logp_old: Tensor, coef: Tensor, action_index: Tensor) -> Tensor:
    checks.vector("logp", logp)
    checks.non_empty("logp", logp)
    checks.vector("logp_old", logp_old)
    checks.same_length("logp_old", logp_old, logp.numel(), "token")
    checks.vector("coef", coef)
    checks.same_length("coef", coef, logp.numel(), "token")
    size = int(action_index.max()) + 1 if action_index.numel() else 1
    return checks.index("action_index", action_index, size, length=logp.numel())


def clipped_surrogate(
    logp: Tensor, logp_old: Tensor, coef: Tensor, clip_eps: float = PPO_CLIP_EPS
) -> Tensor:
    """l_{t,j} = -min(q C, clip(q, 1 - eps, 1 + eps) C), shape [N_tok]."""
    q = torch.exp(logp - logp_old)
    return -torch.minimum(q * coef, q.clamp(1.0 - clip_eps, 1.0 + clip_eps) * coef)


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    coef: Tensor,
    action_index: Tensor,
    reduction: str = "action-mean",
    clip_eps: float = PPO_CLIP_EPS,
    normalizer: float | None = None,
) -> Tensor:
    """PPO clipped surrogate to minimise (module docstring), a scalar.

    Args:
        logp: log pi_theta of each action token, [N_tok] (carries the gradient).
        logp_old: log pi_old (behaviour) of each token, [N_tok].
        coef: token coefficient C_{t,j}, [N_tok].
        action_index: action of each token, [N_tok].
        reduction: a name in ``REDUCTIONS`` ("action-mean" or "token-mean").
        clip_eps: PPO clip eps > 0.
        normalizer: global token / action count for split batches (default: this batch's).
    """
    action_index = _validate(logp, logp_old, coef, action_index)
    checks.positive("clip_eps", clip_eps)
    reduce = REDUCTIONS.get(reduction)
    return reduce(clipped_surrogate(logp, logp_old, coef, clip_eps), action_index, normalizer)


def action_surrogates(logp: Tensor, logp_old: Tensor, coef: Tensor, action_index: Tensor) -> Tensor:
    """Pre-clipping action-mean surrogate of each action, 1/L_t sum_j q_{t,j} C_{t,j}, [N_act].

    At q = 1 with C = A*_t omega_{t,j} and mean_j omega = 1 this equals A*_t exactly,
    independent of L_t (paper Section 3.4).
    """
    action_index = _validate(logp, logp_old, coef, action_index)
    n = int(action_index.max()) + 1
    q = torch.exp(logp - logp_old)
    return segment_sum(q * coef, action_index, n) / segment_count(action_index, n).clamp_min(1).to(
        coef.dtype
    )


def non_action_loss(
    logp: Tensor,
    logp_old: Tensor,
    token_traj_index: Tensor,
    a_seq: Tensor,
    clip_eps: float = PPO_CLIP_EPS,
    normalizer: float | None = None,
) -> Tensor:
    """L_non-act: token-mean clipped surrogate over non-action tokens with C = A^seq_i.

    Non-action tokens are the reply's reasoning, the ``<action>`` tags and formatting outside the
    executable action text; they carry their trajectory's advantage unchanged.

    Args:
        logp, logp_old: log-probs of the non-action tokens, [N_na].
        token_traj_index: trajectory of each non-action token, [N_na].
        a_seq: A^seq_i, [N_traj].
    """
    checks.vector("a_seq", a_seq)
    idx = checks.index("token_traj_index", token_traj_index, a_seq.numel(), length=logp.numel())
    coef = a_seq.index_select(0, idx).to(logp.dtype)
    return policy_loss(logp, logp_old, coef, idx, "token-mean", clip_eps, normalizer)


@dataclass(frozen=True)
class ActionTokens:
    """The action branch's inputs, one entry per executable-action token [N_tok].

    logp carries the gradient (log pi_theta); logp_old is the behaviour log-prob; coef is
    C_{t,j}; action_index names each token's action, in [0, N_act) of this (micro-)batch.
    """

    logp: Tensor
    logp_old: Tensor
    coef: Tensor
    action_index: Tensor


@dataclass(frozen=True)
class NonActionTokens:
    """The non-action branch's inputs: reasoning, tag and formatting tokens [N_na].

    traj_index[N_na] names each token's trajectory, an index into a_seq[N_traj] (A^seq_i).
    """

    logp: Tensor
    logp_old: Tensor
    traj_index: Tensor
    a_seq: Tensor


@dataclass(frozen=True)
class DistillTokens:
    """SERL's KL inputs: next-token logits at the action tokens, each [N_tok, V].

    teacher_logits come from the context with Phi_t (detached inside :func:`action_kl`).
    """

    teacher_logits: Tensor
    student_logits: Tensor


@dataclass(frozen=True)
class Normalizers:
    """Global counts of the whole PPO mini-batch; None means this call's own count.

    With gradient accumulation or data-parallel ranks each micro-batch's terms are divided by
    the mini-batch's counts, so summing the micro-batch objectives gives the mini-batch's
    (docs/design.md section 4.7: the loss does not depend on how the batch is split).
    """

    actions: float | None = None
    """N_act: the action-mean denominator."""
    action_tokens: float | None = None
    """N_tok: the token-mean denominator, and the KL's."""
    non_action_tokens: float | None = None
    """N_na: the non-action branch's denominator."""


@dataclass(frozen=True)
class Objective:
    """L = L_act + L_non-act + lambda_k L^SERL_act, with each term kept for logging."""

    total: Tensor
    action: Tensor
    non_action: Tensor
    kl: Tensor
    kl_coef: float


def objective(
    action: ActionTokens,
    reduction: str = "action-mean",
    clip_eps: float = PPO_CLIP_EPS,
    non_action: NonActionTokens | None = None,
    distill: DistillTokens | None = None,
    kl_coef: float = 0.0,
    normalizers: Normalizers | None = None,
) -> Objective:
    """The training objective (docs/design.md section 4.7), a scalar to minimise, and its terms:

        L = L_act + L_non-act + lambda_k * L^SERL_act

    L_act is :func:`policy_loss` under ``reduction``; L_non-act the token-mean surrogate of
    :func:`non_action_loss` with C = A^seq_i; L^SERL_act the :func:`action_kl`; lambda_k =
    ``kl_coef``. An absent branch (no non-action tokens, no teacher) counts as 0.

    Args:
        action: the action tokens. non_action: the non-action tokens (optional).
        reduction: a name in ``REDUCTIONS``. clip_eps: PPO's eps > 0.
        distill: teacher and student logits at the action tokens (optional).
        kl_coef: lambda_k >= 0.
        normalizers: the mini-batch's global counts when this is one micro-batch of it.
    """
    norm = normalizers or Normalizers()
    unit = norm.actions if reduction == "action-mean" else norm.action_tokens
    act = policy_loss(
        action.logp,
        action.logp_old,
        action.coef,
        action.action_index,
        reduction,
        clip_eps,
        normalizer=unit,
    )
    zero = act.new_zeros(())
    na = zero
    if non_action is not None:
        na = non_action_loss(
            non_action.logp,
            non_action.logp_old,
            non_action.traj_index,
            non_action.a_seq,
            clip_eps,
            normalizer=norm.non_action_tokens,
        )
    kl = zero
    if distill is not None:
        kl = action_kl(
            distill.teacher_logits, distill.student_logits, normalizer=norm.action_tokens
        )
    # Summed in this order (absent terms add an exact 0) so every split adds the same floats.
    total = act + na + (kl_coef * kl if kl_coef else zero)
    return Objective(total=total, action=act, non_action=na, kl=kl, kl_coef=kl_coef)
