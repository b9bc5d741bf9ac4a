"""Forced tokens: under valid-action decoding, tokens a reply's action trie forces (one allowed
token, log pi^C = 0) skip the model where nothing reads their logits (the ``hf`` backend's
``skip_forced``, ``rollout.hf.skip_forced``).

Two cases, both used by :func:`.decode.decode`:

- the forced start every row's requests share (the ``<action>`` tag) enters the first forward
  with the prompt (:func:`forced_head`);
- a request whose remaining reply is forced through its stop token (the only admissible action
  with its prefix, then the closing tag) is written at once and leaves the batch
  (:func:`write_forced_rest`).

Per-reply random streams skip the positions they did not draw (:meth:`.row_sampler.
RowSeededSampler.skip`), so the k-th drawn token still uses the stream's k-th draw and replies
equal the token-by-token path's. What it saves: ``docs/benchmarks.md`` (Generation).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import common_length
from .constrained import TokenTrie


def forced_head(
    groups: list[list[int]], tries: Sequence[TokenTrie | None], limit: int
) -> list[list[int]]:
    """Per row, the first h tokens of its requests' replies when their tries force them, with
    the largest h (< ``limit``) that every row's requests share ([] when h = 0; a row without
    requests gets its neighbour's, as it is read by no one)."""
    heads: list[list[int] | None] = []
    for group in groups:
        common: list[int] | None = None
        for b in group:
            trie = tries[b]
            toks = [] if trie is None else trie.forced([])[0]
            common = toks if common is None else common[: common_length(common, toks)]
        heads.append(common)
    some = [x for x in heads if x is not None]
    h = min([len(x) for x in some] + [limit - 1]) if some else 0
    if h <= 0:
        return []
    return [(x if x is not None else some[0])[:h] for x in heads]


def write_forced_rest(trie: TokenTrie | None, out: list[int], lps: list[float], limit: int) -> bool:
    """When ``trie`` forces the rest of the reply ``out`` through a stop token, append it (log-
    prob 0 each, at most ``limit`` tokens in all) and return True: the request is done."""
    if trie is None:
        return False
    tail, complete = trie.forced(out)
    if not complete:
        return False
    tail = tail[: limit - len(out)]
    out += tail
    lps += [0.0] * len(tail)
    return True
