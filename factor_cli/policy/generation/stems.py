"""Shared stems: what two or more prompts of one batch share past the prefix cache is prefilled
once, before them (the ``hf`` backend's ``stem_min``, ``rollout.hf.stem_min``).

The K trajectories of a group after different first actions share system, task and o_0 up to
the action they differ in; no earlier prompt holds that prefix, so without stems each of them
would prefill it. What it saves: ``docs/benchmarks.md`` (Generation).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import common_length


def shared_stems(
    rows: Sequence[tuple[tuple[int, ...], int]], least: int
) -> list[tuple[tuple[int, ...], list[int]]]:
    """Prefixes that two or more of ``rows`` (sequence, tokens of it already stored) share past
    what is stored of each of them, by at least ``least`` tokens, with the rows sharing each.

    Among the sorted sequences, a run of neighbours whose common prefix c satisfies
    c - max_i(stored_i) >= ``least`` gives the stem x[:c]. Prefilled once before its rows, it
    saves sum_i (c - stored_i) - (c - max_i stored_i) >= ``least`` computed tokens (the K
    trajectories of a group after different first actions share system, task and o_0 until
    the first action they differ in; such a prefix is in no earlier prompt)."""
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    stems: list[tuple[tuple[int, ...], list[int]]] = []
    i = 0
    while i < len(order):
        seq, top = rows[order[i]]
        stem, j = len(seq), i + 1
        while j < len(order):
            nxt, stored = rows[order[j]]
            common = min(stem, common_length(rows[order[j - 1]][0], nxt))
            if common - max(top, stored) < least:
                break
            stem, top, j = common, max(top, stored), j + 1
        if j - i >= 2:
            stems.append((seq[:stem], sorted(order[i:j])))
        i = j
    return stems
