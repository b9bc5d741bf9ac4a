"""The hindsight teacher: the policy's own weights with Phi_t in the context, scoring the
realised reply tokens with no gradient:

    log pi_T(y_{t,j} | x_t, Phi_t, y_{t,<j})

The teacher prompt is the student prompt of turn t with the feedback block inserted before the
reply (see ``prompting``); the hindsight gap is Delta_{t,j} = log pi_T - log pi_old.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .generation import score_replies
from .prompting import PromptFormat, TurnView, render


def turn_views(episode: object) -> list[TurnView]:
    """The student's view before each of the episode's own turns."""
    ep = episode
    hist = ep.history()  # type: ignore[attr-defined]
    offset = len(ep.start.prefix_actions)  # type: ignore[attr-defined]
    return [
        TurnView(ep.task, hist[: offset + t], ep.observations[offset + t])  # type: ignore[attr-defined]
        for t in range(len(ep.turns))  # type: ignore[attr-defined]
    ]


def teacher_prompt_texts(
    fmt: PromptFormat, tokenizer: object, episodes: Sequence[object]
) -> list[str]:
    """Teacher prompt of every turn of every episode, in packing order."""
    out = []
    for ep in episodes:
        for view, turn in zip(turn_views(ep), ep.turns):  # type: ignore[attr-defined]
            out.append(render(fmt, view, tokenizer, feedback=turn.feedback))
    return out


@torch.no_grad()
def teacher_logprobs(
    model: torch.nn.Module,
    tokenizer: object,
    fmt: PromptFormat,
    episodes: Sequence[object],
    encode: Callable[[Sequence[str]], list[tuple[list[int], bool]]],
    temperature: float = 1.0,
    batch_size: int = 32,
) -> list[list[float]]:
    """Per action (packing order), the teacher log-prob of every reply token.

    ``encode`` tokenizes and truncates prompts exactly as the generation backend did.
    """
    texts = teacher_prompt_texts(fmt, tokenizer, episodes)
    replies = [t.reply_ids for ep in episodes for t in ep.turns]  # type: ignore[attr-defined]
    prompts = [ids for ids, _ in encode(texts)]
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    out: list[list[float]] = []
    for lo in range(0, len(prompts), batch_size):
        sc = score_replies(
            model,
            prompts[lo : lo + batch_size],
            replies[lo : lo + batch_size],
            temperature=temperature,
            pad_id=int(pad),
        )
        out += [lp.tolist() for lp in sc.logprobs]
    return out
