"""The hindsight teacher: the policy's own weights with Phi_t in the context, scoring the
realised reply tokens of recorded episodes with no gradient:

    log pi_T(y_{t,j} | x_t, Phi_t, y_{t,<j})

The teacher prompt is the student prompt of turn t with the feedback block inserted before the
reply (see ``policy.prompting``); the hindsight gap is Delta_{t,j} = log pi_T - log pi_old.
It lives beside the rollout runner because it reads :class:`~.runner.Episode` records.

Under valid-action decoding a turn records the allowed token sets its reply was sampled under
(``Turn.allowed_ids``), and the teacher is renormalised over the same sets: pi_T is the
teacher's distribution constrained to the same admissible actions, so Delta compares like with
like (a forced token has log pi_T = log pi_old = 0 and Delta = 0, instead of a gap that only
says the free teacher would not have forced it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from factor_cli.policy.generation.base import Encoded
from factor_cli.policy.generation.scoring import Scorer
from factor_cli.policy.prompting import PromptFormat, TurnView, render

from .runner import Episode

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def turn_views(episode: Episode) -> list[TurnView]:
    """The student's view before each of the episode's own turns (prefix turns excluded)."""
    hist = episode.history()
    offset = len(episode.start.prefix_actions)
    return [
        TurnView(
            episode.task,
            hist[: offset + t],
            episode.observations[offset + t],
            tn.admissible,
            episode.observations[0],
        )
        for t, tn in enumerate(episode.turns)
    ]


def teacher_prompt_texts(
    fmt: PromptFormat, tokenizer: PreTrainedTokenizerBase, episodes: Sequence[Episode]
) -> list[str]:
    """Teacher prompt of every turn of every episode, in packing order."""
    return [
        render(fmt, view, tokenizer, feedback=turn.feedback)
        for ep in episodes
        for view, turn in zip(turn_views(ep), ep.turns)
    ]


def teacher_logprobs(
    score: Scorer,
    tokenizer: PreTrainedTokenizerBase,
    fmt: PromptFormat,
    episodes: Sequence[Episode],
    encode: Callable[[Sequence[str]], list[Encoded]],
    temperature: float = 1.0,
    batch_size: int = 64,
) -> list[list[float]]:
    """Per action (packing order), the teacher log-prob of every reply token.

    ``score``: the scoring pass (:func:`~factor_cli.policy.generation.scoring.model_scorer`, or
    the backend's cached one); ``encode`` tokenizes and truncates prompts exactly as the
    generation backend did (its
    :meth:`~factor_cli.policy.generation.base.GenerationBackend.encode`).
    """
    texts = teacher_prompt_texts(fmt, tokenizer, episodes)
    replies = [t.reply_ids for ep in episodes for t in ep.turns]
    allowed = [t.allowed_ids for ep in episodes for t in ep.turns]
    return reply_logprobs(score, encode, texts, replies, allowed, temperature, batch_size)


def reply_logprobs(
    score: Scorer,
    encode: Callable[[Sequence[str]], list[Encoded]],
    texts: Sequence[str],
    replies: Sequence[list[int]],
    allowed: Sequence[list[list[int]] | None],
    temperature: float = 1.0,
    batch_size: int = 64,
) -> list[list[float]]:
    """log pi(y_j | prompt, y_<j) of every token of each reply after its prompt text (encoded
    and truncated by ``encode``), renormalised over ``allowed`` sets where given."""
    prompts = [ids for ids, _ in encode(texts)]
    out: list[list[float]] = []
    for lo in range(0, len(prompts), batch_size):
        sc = score(
            prompts[lo : lo + batch_size],
            list(replies[lo : lo + batch_size]),
            temperature,
            list(allowed[lo : lo + batch_size]),
        )
        out += [lp.tolist() for lp in sc.logprobs]
    return out
