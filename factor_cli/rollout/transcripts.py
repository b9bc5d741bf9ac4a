"""Episodes -> transcript records (:mod:`factor_cli.ledger.transcripts`: the schema and reader).

A training step's sample: :func:`sample_trajectories` picks ``n`` root trajectories
deterministically (the first trajectory of each group in group order, then the second of each,
...), and :func:`step_records` adds to each turn what the step computed for that action: the
credit A*_t, V_target(x_t) and the allocation weight omega_{t,j} of every action token.
:func:`eval_records` records evaluation episodes (no credit: greedy play is not trained on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from factor_cli.credit import CreditAssignment
from factor_cli.ledger.transcripts import EpisodeRecord, TurnRecord
from factor_cli.policy.prompting import token_char_spans

from .packing import RolloutBatch
from .runner import Episode, Turn

WEIGHT_DIGITS = 5  # weights are read by eye and by colour: 5 decimals keep files small


def sample_trajectories(episodes: Sequence[Episode], n: int) -> list[int]:
    """Indices of ``n`` episodes: rank 0 of every group in group order, then rank 1, ...

    The choice depends only on the groups' layout, so it is the same on every rank and in a
    resumed run.
    """
    order: dict[int, int] = {}  # group -> its position among the groups (first appearance)
    rank: dict[int, int] = {}  # group -> members seen so far
    ranked = []
    for i, ep in enumerate(episodes):
        g = ep.start.group
        order.setdefault(g, len(order))
        ranked.append((rank.get(g, 0), order[g], i))
        rank[g] = rank.get(g, 0) + 1
    return [i for _, _, i in sorted(ranked)[:n]]


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), WEIGHT_DIGITS)


def turn_record(
    t: int,
    turn: Turn,
    tokenizer: object,
    mask: Sequence[bool] | None = None,
    weights: Sequence[float] | None = None,
    credit: float | None = None,
    value: float | None = None,
) -> TurnRecord:
    """One turn's record. ``mask``: the effective action mask of the reply tokens (default:
    the turn's own); ``weights``: one per True entry of ``mask``, in order."""
    text, spans = token_char_spans(tokenizer, turn.reply_ids)
    mask = list(mask if mask is not None else turn.action_mask)
    per_token: list[float | None] = [None] * len(mask)
    if weights is not None:
        it = iter(weights)
        per_token = [_round(next(it)) if m else None for m in mask]
    decode = tokenizer.decode  # type: ignore[attr-defined]
    return TurnRecord(
        t=t,
        prompt=decode(list(turn.prompt_ids), skip_special_tokens=False),
        observation=turn.observation,
        reply=text,
        action=turn.action,
        valid=bool(turn.valid),
        feedback=turn.feedback,
        reward=float(turn.reward),
        done=bool(turn.done),
        admissible=list(turn.admissible),
        tokens=[text[a:b] for a, b in spans],
        action_mask=[bool(m) for m in mask],
        weights=per_token,
        credit=_round(credit),
        value=_round(value),
        prompt_truncated=bool(turn.prompt_truncated),
    )


def _episode_record(
    kind: str, step: int, pos: int, ep: Episode, turns: list[TurnRecord], **extra: Any
) -> EpisodeRecord:
    """The fields every episode record has (identity, outcome, task, error), plus ``extra``."""
    out = ep.outcome
    return EpisodeRecord(
        kind=kind,
        step=step,
        episode=pos,
        instance=ep.start.instance_id,
        group=ep.start.group,
        outcome=float(out.outcome) if out else 0.0,
        success=bool(out.success) if out else False,
        score=float(out.score) if out else 0.0,
        turns=turns,
        task=ep.task,
        error=str(ep.error) if ep.error else None,
        **extra,
    )


def step_records(
    step: int,
    roots: Sequence[Episode],
    rb: RolloutBatch,
    credit: CreditAssignment,
    values: torch.Tensor | None,
    tokenizer: object,
    n: int,
) -> list[EpisodeRecord]:
    """Transcripts of ``n`` sample trajectories of training step ``step``.

    Args:
        roots: the step's root episodes in packing order (trajectory i = ``roots[i]``).
        rb: their packed batch; action a of trajectory i, turn t is ``rb.turn_of_action[a]``.
        credit: the method's assignment: ``credit.credit`` [N_act], ``credit.weight``
            [N_tok] (action tokens in packed order), ``a_seq`` and ``v0`` [N_traj].
        values: V_target(x_t) per action, [N_act], or None.
    """
    action_index = rb.batch.action_index
    counts = torch.bincount(action_index, minlength=rb.batch.num_actions)  # L_t per action
    ends = torch.cumsum(counts, 0)
    starts = ends - counts
    action_of = {where: a for a, where in enumerate(rb.turn_of_action)}
    weight = credit.weight.detach().float().cpu()
    out = []
    for pos, i in enumerate(sample_trajectories(roots, n)):
        ep = roots[i]
        turns = []
        for t, turn in enumerate(ep.turns):
            a = action_of[(i, t)]
            w = weight[int(starts[a]) : int(ends[a])].tolist()
            v = float(values[a]) if values is not None else None
            turns.append(
                turn_record(t, turn, tokenizer, rb.action_masks[a], w, float(credit.credit[a]), v)
            )
        out.append(
            _episode_record(
                "step",
                step,
                pos,
                ep,
                turns,
                a_seq=_round(float(credit.a_seq[i])),
                v0=_round(float(credit.v0[i])),
                trajectory=i,
            )
        )
    return out


def eval_records(
    step: int, episodes: Sequence[Episode], categories: Sequence[str], tokenizer: object
) -> list[EpisodeRecord]:
    """Transcripts of every evaluation episode after ``step`` training steps (no credit)."""
    out = []
    for pos, (ep, category) in enumerate(zip(episodes, categories, strict=True)):
        turns = [turn_record(t, turn, tokenizer) for t, turn in enumerate(ep.turns)]
        out.append(_episode_record("eval", step, pos, ep, turns, category=str(category)))
    return out
