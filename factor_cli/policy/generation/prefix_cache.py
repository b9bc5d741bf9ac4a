"""A bounded cache of prompt-prefix KV states: a radix tree over token ids, LRU eviction.

Every prompt the ``hf`` backend encodes leaves the keys and values of its tokens here, so a later
prompt that starts with the same tokens (the next turn of the same episode, a sibling
trajectory of the group: system + task + first observation; a continuation: its root's prompt
at the checkpoint) prefills only what follows. Because attention is causal, the KV of the first
n tokens of a sequence depend only on those n tokens (and their positions 0..n-1), so one
stored sequence serves every prompt that shares any prefix of it.

Layout: each node holds an edge of tokens and their KV, one tensor ``kv`` of shape
[N_layers, 2, H_kv, n, D] (index 1: 0 = keys, 1 = values; n = the edge's token count). A path
from the root spells a stored prefix; siblings share their common part once (SGLang's
RadixAttention layout). Positions are those of an unpadded sequence (token j at position j), as
the backend's left-padded forwards give every row (position ids count real tokens only), so a
prefix's KV is valid in any batch, at any padding.

Bound: :attr:`PrefixCache.tokens` (the stored token count, the sum of the edges' lengths, hence
the memory: tokens x bytes per token) is brought to at most ``capacity`` by :meth:`evict`,
which drops transient leaves (inserted with ``transient=True``: prompts no later pass scores,
such as a continuation's) before the others, and least-recently-used first within each (a node
is used when a lookup or an insert walks through it); the backend calls it after every batch,
so the cache never holds more than ``capacity`` tokens while the model generates. Pure torch.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class _Node:
    """One edge of the radix tree: ``tokens`` and their ``kv`` [N_layers, 2, H_kv, n, D]."""

    tokens: tuple[int, ...]
    kv: torch.Tensor | None
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0
    transient: bool = False
    """Stored for a prompt no later pass scores (a continuation's): evicted before the rest."""


@dataclass(frozen=True)
class Match:
    """A stored prefix of a sequence: its length and the (node, tokens used) pieces along it."""

    length: int
    pieces: tuple[tuple[_Node, int], ...]


class PrefixCache:
    """Radix tree of token prefixes -> their KV, at most ``capacity`` tokens after :meth:`evict`."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"prefix cache capacity must be >= 0 tokens, got {capacity}")
        self.capacity = capacity
        self.root = _Node((), None, None)
        self.tokens = 0
        """Tokens stored (the sum of every edge's length)."""
        self.evicted = 0
        """Tokens evicted so far (:meth:`evict`)."""
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return self.tokens

    def clear(self) -> None:
        """Drop every stored prefix (the weights changed, so their KV are stale)."""
        self.root = _Node((), None, None)
        self.tokens = 0

    # -- lookup -----------------------------------------------------------------------------
    def match(self, seq: Sequence[int]) -> Match:
        """The longest stored prefix of ``seq``; marks its nodes used."""
        now = next(self._clock)
        node, i, pieces = self.root, 0, []
        while i < len(seq):
            child = node.children.get(int(seq[i]))
            if child is None:
                break
            used = _common(child.tokens, seq, i)
            child.last_used = now
            pieces.append((child, used))
            i += used
            if used < len(child.tokens):
                break
            node = child
        return Match(i, tuple(pieces))

    def gather(self, match: Match, n: int, out: torch.Tensor, start: int = 0) -> None:
        """Write the KV of tokens [start, start + n) of ``match`` into ``out`` [N_layers, 2,
        H_kv, n, D] (the backend's batch cache, one row's columns)."""
        if start + n > match.length:
            raise ValueError(f"only {match.length} tokens are cached, {start + n} asked")
        col, at = 0, 0  # columns written; the token where the current piece begins
        for node, used in match.pieces:
            lo = max(start - at, 0)  # skip this piece's tokens before `start`
            take = min(used - lo, n - col)
            at += used
            if take <= 0:
                if col >= n:
                    break
                continue
            assert node.kv is not None  # only the root has none, and it is never a piece
            out[..., col : col + take, :] = node.kv[..., lo : lo + take, :]
            col += take

    # -- insert -----------------------------------------------------------------------------
    def insert(
        self,
        seq: Sequence[int],
        kv: torch.Tensor,
        start: int,
        transient: bool = False,
        handed_over: bool = False,
    ) -> None:
        """Store ``seq`` given the KV of ``seq[start:]``, ``kv`` [N_layers, 2, H_kv, len(seq) -
        start, D]; ``seq[:start]`` must be stored already (the part a lookup found). What is
        stored by now beyond ``start`` (an earlier row of the same batch) is kept, not copied.
        ``transient``: the new part goes before the rest at eviction; a lasting insert makes
        its whole path lasting. ``handed_over``: ``kv`` is a tensor of its own (no view of a
        larger one) that the caller will not touch again, stored without a copy where it is
        stored whole."""
        if kv.shape[-2] != len(seq) - start:
            raise ValueError(f"kv holds {kv.shape[-2]} tokens for {len(seq) - start}")
        found = self.match(seq)
        if found.length < start:
            raise ValueError(f"{start} tokens were to be cached already, {found.length} are")
        node = self.root
        if found.pieces:
            last, used = found.pieces[-1]
            node = self._split(last, used) if used < len(last.tokens) else last
        if not transient:  # the path becomes lasting (of a split piece, its upper half only)
            for piece, _ in found.pieces[:-1]:
                piece.transient = False
            node.transient = False
        if found.length == len(seq):
            return
        rest = tuple(int(t) for t in seq[found.length :])
        if handed_over and found.length == start:
            part = kv
        else:  # an own copy: a slice would keep the whole batch's cache alive
            part = kv[..., found.length - start :, :].clone()
        leaf = _Node(rest, part, node, transient=transient)
        leaf.last_used = next(self._clock)
        node.children[rest[0]] = leaf
        self.tokens += len(rest)

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` tokens; returns the new upper node."""
        assert node.kv is not None and node.parent is not None and 0 < at < len(node.tokens)
        upper = _Node(node.tokens[:at], node.kv[..., :at, :].clone(), node.parent)
        upper.last_used, upper.transient = node.last_used, node.transient
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.kv, node.parent = node.tokens[at:], node.kv[..., at:, :].clone(), upper
        upper.children[node.tokens[0]] = node
        return upper

    # -- bound ------------------------------------------------------------------------------
    def evict(self) -> int:
        """Drop leaves, transient ones first and least recently used first among each, until at
        most ``capacity`` tokens are stored; returns the tokens dropped. A parent left without
        children becomes a leaf and may go next."""
        if self.tokens <= self.capacity:
            return 0
        order = itertools.count()  # ties: first come, first evicted; never compares nodes
        heap = [(not n.transient, n.last_used, next(order), n) for n in self._leaves()]
        heapq.heapify(heap)
        dropped = 0
        while self.tokens > self.capacity and heap:
            *_, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            self.tokens -= len(leaf.tokens)
            dropped += len(leaf.tokens)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (not parent.transient, parent.last_used, next(order), parent))
        self.evicted += dropped
        return dropped

    def _leaves(self) -> list[_Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out


def _common(edge: tuple[int, ...], seq: Sequence[int], i: int) -> int:
    """Length of the common prefix of ``edge`` and ``seq[i:]``."""
    n = min(len(edge), len(seq) - i)
    if tuple(seq[i : i + n]) == edge[:n]:  # the usual case, compared at C speed
        return n
    return next(j for j in range(n) if edge[j] != seq[i + j])


def kv_bytes_per_token(config: object, dtype: torch.dtype) -> int:
    """Keys and values of one token over all layers: 2 * L * n_kv_heads * head_dim * bytes."""
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if get_text is not None else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
