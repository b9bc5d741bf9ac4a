"""SERL (Li et al. 2026b), the controlled baseline: hindsight multipliers and action-only KL.

    psi(A, Delta)  = clip(exp(clip(sign(A) * Delta, -20, 20)), 1 - c, 1 + c)
    w_{t,j}        = (1 - alpha_k) + alpha_k * psi(A, Delta_{t,j})
    C_{t,j}        = A * w_{t,j}

with A = A^seq (SERL) or A = A*_t (TAC+SERL-psi). Nothing forces mean_j w_{t,j} = 1: that drift
is what FACTOR's APM removes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import checks
from .config import DEFAULTS

EXP_CLIP = 20.0  # keeps exp() finite before the psi clip; matches SERL's reference constant


def serl_weights(
    gap: Tensor,
    action_index: Tensor,
    advantage: Tensor,
    alpha: float,
    clip: float = DEFAULTS.psi_clip,
    psi_min: float | None = None,
    psi_max: float | None = None,
    *,
    check: bool = True,
) -> Tensor:
    """SERL token multipliers w[N_tok] (see module docstring).

    Args:
        gap: Delta_{t,j}, [N_tok]. action_index: action of each token, [N_tok].
        advantage: the action's A (A^seq or A*_t), [N_act]; only its sign is used.
        alpha: alpha_k in [0, 1]. clip: c, psi bounds default to [1 - c, 1 + c].
        psi_min, psi_max: explicit psi bounds overriding c (e.g. [0, 5]).
        check: validate the inputs (False only for inputs already validated).
    """
    if check:
        action_index, _ = checks.tokens(gap, action_index, advantage)
        alpha = checks.unit_interval("alpha", alpha)
    action_index = action_index.long()
    lo = 1.0 - clip if psi_min is None else psi_min
    hi = 1.0 + clip if psi_max is None else psi_max
    if not (0.0 <= lo <= hi):
        raise ValueError(f"psi bounds must satisfy 0 <= psi_min <= psi_max, got [{lo}, {hi}]")
    signed = torch.sign(advantage)[action_index] * gap
    psi = signed.clamp(-EXP_CLIP, EXP_CLIP).exp().clamp(lo, hi)
    return (1.0 - alpha) + alpha * psi


def action_kl(
    teacher_logits: Tensor, student_logits: Tensor, normalizer: float | None = None
) -> Tensor:
    """SERL's action-only distillation term L^SERL_act (forward KL, teacher detached):

        L = 1/N_tok sum_{(t,j)} sum_v p_T(v) [log p_T(v) - log p_theta(v)],

    p_T(v) = pi_T(v | x_t, Phi_t, y_{t,<j}),  p_theta(v) = pi_theta(v | x_t, y_{t,<j}).

    Args:
        teacher_logits, student_logits: next-token logits at the action tokens, [N_tok, V].
        normalizer: global action-token count when the batch is split into micro-batches
            (default: this call's N_tok).
    """
    if teacher_logits.shape != student_logits.shape or teacher_logits.dim() != 2:
        raise ValueError(
            "teacher_logits and student_logits must both be [N_tok, V], got "
            f"{tuple(teacher_logits.shape)} and {tuple(student_logits.shape)}"
        )
    if teacher_logits.shape[0] == 0:
        raise ValueError("teacher_logits is empty: no action tokens")
    log_t = F.log_softmax(teacher_logits.detach().float(), dim=-1)
    log_s = F.log_softmax(student_logits.float(), dim=-1)
    per_token = (log_t.exp() * (log_t - log_s)).sum(-1)
    denom = float(per_token.numel()) if normalizer is None else float(normalizer)
    return per_token.sum() / denom
