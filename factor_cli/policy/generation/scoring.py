"""Teacher-forced log-prob scoring: one forward pass over prompt + reply.

:func:`score_replies` recomputes what a backend reports while sampling,

    log pi(y_j | x, y_<j) = log softmax(z_j / T)[y_j],

for the trainer (pi_theta and pi_old), the hindsight teacher (x with Phi_t inserted), the value
head's boundary features, and to check a backend against the trainer's forward.

A reply generated under valid-action decoding is scored under the same constraint (``allowed``:
its :attr:`~.base.Generation.allowed_ids`): log pi^C(y_j) = z_j[y_j] / T - logsumexp_{v in C_j}
z_j[v] / T (:mod:`.constrained`), and its returned logits are masked to C_j likewise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from ..value_head import features_at
from .constrained import constrained_logits


@dataclass
class Scores:
    """What :func:`score_replies` computed for a batch of (prompt, reply) pairs."""

    logprobs: list[torch.Tensor]
    """Per reply, log pi(y_j | x, y_<j) at temperature T, shape [G_i] (carries grad if asked)."""
    boundary_hidden: torch.Tensor | None
    """Last-layer hidden state at each prompt's last token (the boundary before the reply),
    [B, H]."""
    logits: list[torch.Tensor] | None
    """Per reply, the next-token logits (/ T) at each reply position, [G_i, V]; a constrained
    reply's are masked to its allowed sets (:data:`~.constrained.MASKED_LOGIT` elsewhere)."""


def reply_scores(
    logits: Sequence[torch.Tensor],
    replies: Sequence[Sequence[int]],
    allowed: Sequence[Sequence[Sequence[int]] | None] | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(log pi(y_j) [G_i], logits [G_i, V]) of each reply from its logits / T [G_i, V] at the
    positions that predict it; a constrained reply's are masked to ``allowed[i]`` first."""
    logps, out = [], []
    for i, (z, r) in enumerate(zip(logits, replies)):
        sets = None if allowed is None else allowed[i]
        if sets is not None:
            z = constrained_logits(z, sets)
        target = torch.tensor(list(r), dtype=torch.long, device=z.device)
        logps.append(F.log_softmax(z, dim=-1).gather(-1, target[:, None]).squeeze(-1))
        out.append(z)
    return logps, out


class Scorer(Protocol):
    """Teacher-forced scoring without gradient (the teacher's and the value head's passes, the
    update's KL teacher at the rollout's weights): :func:`score_replies` on a model
    (:func:`model_scorer`), or a backend's own scorer that starts from the KV it already holds
    (:meth:`.hf.HFGenerator.score`). Same outputs."""

    def __call__(
        self,
        prompts: Sequence[Sequence[int]],
        replies: Sequence[Sequence[int]],
        temperature: float = 1.0,
        allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
        return_hidden: bool = False,
        return_logits: bool = False,
    ) -> Scores: ...


def model_scorer(model: torch.nn.Module, pad_id: int, share_prefixes: bool = False) -> Scorer:
    """:func:`score_replies` on ``model`` (no gradient) as a :class:`Scorer`."""

    def score(
        prompts: Sequence[Sequence[int]],
        replies: Sequence[Sequence[int]],
        temperature: float = 1.0,
        allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
        return_hidden: bool = False,
        return_logits: bool = False,
    ) -> Scores:
        return score_replies(
            model,
            prompts,
            replies,
            temperature,
            pad_id,
            return_hidden=return_hidden,
            return_logits=return_logits,
            allowed=allowed,
            share_prefixes=share_prefixes,
        )

    return score


def right_padded(
    prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, attention mask) [B, W] of ``prompts[i] + replies[i]``, right-padded with
    ``pad_id``: the one layout of every teacher-forced forward (scores, critic values)."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, replies)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def score_replies(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_grad: bool = False,
    return_hidden: bool = False,
    return_logits: bool = False,
    allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
    share_prefixes: bool = False,
) -> Scores:
    """Teacher-forced log-probs of ``replies[i]`` after ``prompts[i]``, one right-padded forward
    (``share_prefixes``: through the batch's radix tree instead, each shared prefix encoded
    once, :mod:`.shared_prefix`; the same outputs up to float rounding).

    ``allowed[i]``: reply i's allowed token ids per position (valid-action decoding), or None
    (free); the log-probs (and logits) of a constrained reply are renormalised over them.
    """
    if allowed is not None and len(allowed) != len(replies):
        raise ValueError(f"allowed has {len(allowed)} entries for {len(replies)} replies")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (its last one predicts the reply)")
    if share_prefixes:
        return _score_tree(
            model,
            prompts,
            replies,
            temperature,
            pad_id,
            with_grad,
            return_hidden,
            return_logits,
            allowed,
        )
    ids, mask = right_padded(prompts, replies, pad_id)
    device = next(model.parameters()).device
    ctx = torch.enable_grad() if with_grad else torch.no_grad()
    with ctx:
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            output_hidden_states=return_hidden,
        )
        logits = out.logits.float() / temperature  # [B, W, V]
        # logits at t predict token t + 1
        rows = [
            logits[i, len(p) - 1 : len(p) - 1 + len(r)]
            for i, (p, r) in enumerate(zip(prompts, replies))
        ]
        logps, all_logits = reply_scores(rows, replies, allowed)
        hidden = None
        if return_hidden:
            last = torch.tensor([len(p) - 1 for p in prompts], device=device)
            hidden = features_at(out.hidden_states[-1], last)
    return Scores(
        logprobs=logps, boundary_hidden=hidden, logits=all_logits if return_logits else None
    )


def _score_tree(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
    with_grad: bool,
    return_hidden: bool,
    return_logits: bool,
    allowed: Sequence[Sequence[Sequence[int]] | None] | None,
) -> Scores:
    """:func:`score_replies` through the batch's radix tree (``shared_prefix.forward_tree``)."""
    from .shared_prefix import forward_tree

    seqs = [list(p) + list(r) for p, r in zip(prompts, replies)]
    logit_at = [range(len(p) - 1, len(p) - 1 + len(r)) for p, r in zip(prompts, replies)]
    hidden_at = [[len(p) - 1] if return_hidden else [] for p in prompts]
    device = next(model.parameters()).device
    ctx = torch.enable_grad() if with_grad else torch.no_grad()
    with ctx:
        out = forward_tree(model, seqs, logit_at, hidden_at, pad_id)
        vocab = next((z.shape[-1] for z in out.logits.values()), 0)
        rows = [
            torch.stack([out.logits[(i, q)] for q in logit_at[i]]).float() / temperature
            if r
            else torch.zeros((0, vocab), device=device)
            for i, r in enumerate(replies)
        ]
        logps, all_logits = reply_scores(rows, replies, allowed)
        hidden = None
        if return_hidden:
            hidden = torch.stack([out.hidden[(i, len(p) - 1)] for i, p in enumerate(prompts)])
            hidden = hidden.detach()
    return Scores(
        logprobs=logps, boundary_hidden=hidden, logits=all_logits if return_logits else None
    )
