"""Duplicate rows: requests of one batch with the same prompt decode in one row while their
replies agree (the ``hf`` backend's ``merge_duplicates``, ``rollout.hf.merge_duplicates``).

A seeded or greedy batch often repeats a prompt: the K first turns of a group, the M
continuations of a checkpoint, and their later turns while they agree. A row's logits depend on
its tokens only, so those requests share one row, gathered and decoded once; each request still
draws from its own stream under its own allowed replies, and where the draws differ
:func:`.decode.decode` copies the row (:func:`.decode.append_rows`). Seedless draws depend on
the row layout, so such batches keep a row per request. What it saves:
``docs/benchmarks.md`` (Generation).
"""

from __future__ import annotations

from collections.abc import Sequence


def duplicate_rows(prompts: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """The requests of a batch grouped by prompt, in first-seen order: one decode row each
    (:func:`~.decode.decode`'s ``members``; a row's logits depend on its tokens only, so
    requests with other allowed replies share it too); None when all prompts differ."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(i)
    return list(groups.values()) if len(groups) < len(prompts) else None
