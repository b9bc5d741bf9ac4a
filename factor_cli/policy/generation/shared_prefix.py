"""Teacher-forced forwards that encode every shared prefix once: a radix tree over the batch.

The sequences s_i = x_i + y_i of one scoring batch share long prefixes: every prompt starts with
the same system text, the K trajectories of a group share the task and first observation, the
turns of one trajectory share their earlier history, a checkpoint's continuations share its
prompt. A right-padded batch encodes each of those tokens once per row. Here the batch's
sequences form a radix tree (each edge a run of tokens, each root-to-leaf path one sequence), and
one forward per internal node P encodes all of P's child edges as a batch on top of P's KV (the
keys and values of the path root -> P), so each distinct prefix is encoded once, at its position
in the sequence (position = depth).

Why it is the same function: attention is causal, so the hidden state h_q of s at depth q depends
only on s_{<=q} and the positions 0..q, whichever batch row computed it. Hence log pi(y_j | x, y_<j)
= log softmax(z_{|x|-1+j} / T)[y_j] and the boundary state h_{|x|-1} equal the padded forward's up
to float rounding, and the gradient reaching a shared prefix's activations is the sum of what each
sequence's own forward would send there: loss and gradients are unchanged (tests: within 1e-5,
fp32).

Layout: the children of the root are right-padded (no past to attend to); the children of any
other node are left-padded so their ends align (the positions whose logits are wanted, a reply's,
sit at an edge's end), with P's KV as the past. Logits are computed only in the columns some
sequence needs (``logits_to_keep``), not at every prompt position.

Cost (tokens encoded): the tree's size instead of rows x width (measured on the smoke preset's
update batch: ``docs/benchmarks.md``, Generation). Forward calls: one per internal node (one per
batch when nothing is shared). Pure torch over a Hugging Face causal LM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(eq=False)
class Edge:
    """A run of tokens at depths [depth, depth + len(tokens)) of every sequence through it."""

    tokens: list[int]
    depth: int
    children: dict[int, Edge] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.depth + len(self.tokens)


def radix_tree(seqs: Sequence[Sequence[int]]) -> Edge:
    """The radix tree of ``seqs`` (the root is an empty edge at depth 0)."""
    root = Edge([], 0)
    for seq in seqs:
        node, i = root, 0
        while i < len(seq):
            child = node.children.get(seq[i])
            if child is None:
                node.children[seq[i]] = Edge(list(seq[i:]), i)
                break
            n = _common(child.tokens, seq, i)
            if n < len(child.tokens):  # diverges inside the edge: split it there
                head = Edge(child.tokens[:n], child.depth, {child.tokens[n]: child})
                child.tokens, child.depth = child.tokens[n:], child.depth + n
                node.children[seq[i]] = child = head
            node, i = child, i + n
    return root


def _common(edge: Sequence[int], seq: Sequence[int], start: int) -> int:
    n, limit = 0, min(len(edge), len(seq) - start)
    while n < limit and edge[n] == seq[start + n]:
        n += 1
    return n


def path(root: Edge, seq: Sequence[int]) -> list[Edge]:
    """The edges that spell ``seq`` (which is in the tree), root excluded."""
    out, node, i = [], root, 0
    while i < len(seq):
        node = node.children[seq[i]]
        out.append(node)
        i = node.end
    return out


def tree_size(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens a shared-prefix forward encodes for ``seqs`` (the tree's total edge length)."""
    stack, n = [radix_tree(seqs)], 0
    while stack:
        node = stack.pop()
        n += len(node.tokens)
        stack.extend(node.children.values())
    return n


KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, the keys and values [1, H_kv, n, D] of the n tokens of a path from the root."""


@dataclass
class TreeOutputs:
    """The wanted outputs, keyed (sequence index, depth)."""

    logits: dict[tuple[int, int], torch.Tensor]
    """Next-token logits [V] at the depths asked for (float, unscaled)."""
    hidden: dict[tuple[int, int], torch.Tensor]
    """Last-layer hidden states [H] at the depths asked for."""


def forward_tree(
    model: torch.nn.Module,
    seqs: Sequence[Sequence[int]],
    logit_depths: Sequence[Sequence[int]],
    hidden_depths: Sequence[Sequence[int]],
    pad_id: int,
) -> TreeOutputs:
    """Encode ``seqs`` through their radix tree; return the logits at ``logit_depths[i]`` and
    the last hidden states at ``hidden_depths[i]`` of each sequence i.

    Runs under the caller's grad mode; with grad, every returned tensor carries it.
    """
    root = radix_tree(seqs)
    asks = ({}, {})  # per kind: (i, depth) -> the edge holding that depth of sequence i
    for i, seq in enumerate(seqs):
        edges = path(root, seq)
        for kind, depths in enumerate((logit_depths[i], hidden_depths[i])):
            for q in depths:
                asks[kind][(i, q)] = next(e for e in edges if e.depth <= q < e.end)
    wanted: tuple[dict[int, set[int]], dict[int, set[int]]] = ({}, {})
    for kind in (0, 1):
        for (_, q), edge in asks[kind].items():
            wanted[kind].setdefault(id(edge), set()).add(q)
    got: tuple[dict, dict] = ({}, {})  # (id(edge), depth) -> tensor
    pending: list[tuple[Edge, KV | None]] = [(root, None)]
    while pending:
        parent, past = pending.pop()
        kids = list(parent.children.values())
        if kids:
            kvs = _encode(model, parent.end, past, kids, wanted, got, pad_id)
            pending += [(kid, kv) for kid, kv in zip(kids, kvs) if kv is not None]
    return TreeOutputs(
        *({key: got[kind][(id(e), key[1])] for key, e in asks[kind].items()} for kind in (0, 1))
    )


def _encode(
    model: torch.nn.Module,
    base: int,
    past: KV | None,
    kids: list[Edge],
    wanted: tuple[dict[int, set[int]], dict[int, set[int]]],
    got: tuple[dict, dict],
    pad_id: int,
) -> list[KV | None]:
    """One forward over the edges ``kids`` of a node at depth ``base`` (its path's KV ``past``);
    stores the wanted logits and hidden states in ``got``; returns each kid's path KV (None for
    a leaf, which nothing extends)."""
    device = next(model.parameters()).device
    m, width = len(kids), max(len(k.tokens) for k in kids)
    ids = torch.full((m, width), pad_id, dtype=torch.long)
    live = torch.zeros((m, width), dtype=torch.long)
    pos = torch.zeros((m, width), dtype=torch.long)
    first = []  # column of each kid's first token: ends aligned when there is a past
    for u, kid in enumerate(kids):
        c = width - len(kid.tokens) if past is not None else 0
        ids[u, c : c + len(kid.tokens)] = torch.tensor(kid.tokens)
        live[u, c : c + len(kid.tokens)] = 1
        pos[u, c : c + len(kid.tokens)] = torch.arange(kid.depth, kid.end)
        first.append(c)

    def column(u: int, q: int) -> int:
        return first[u] + q - kids[u].depth

    cols = sorted({column(u, q) for u, k in enumerate(kids) for q in wanted[0].get(id(k), ())})
    hidden = any(id(k) in wanted[1] for k in kids)
    extend = any(k.children for k in kids)
    out = model(
        input_ids=ids.to(device),
        attention_mask=torch.cat([torch.ones((m, base), dtype=torch.long), live], 1).to(device),
        position_ids=pos.to(device),
        past_key_values=None if past is None else _cache(model, past, m),
        use_cache=extend,
        logits_to_keep=torch.tensor(cols, device=device) if cols else 1,
        output_hidden_states=hidden,
    )
    at = {c: j for j, c in enumerate(cols)}
    for u, kid in enumerate(kids):
        for q in wanted[0].get(id(kid), ()):
            got[0][(id(kid), q)] = out.logits[u, at[column(u, q)]]
        for q in wanted[1].get(id(kid), ()):
            got[1][(id(kid), q)] = out.hidden_states[-1][u, column(u, q)]
    if not extend:
        return [None] * m
    layers = out.past_key_values.layers
    kvs: list[KV | None] = []
    for u, kid in enumerate(kids):
        if not kid.children:
            kvs.append(None)
            continue
        lo, hi = base + first[u], base + first[u] + len(kid.tokens)
        own = [(lay.keys[u : u + 1, :, lo:hi], lay.values[u : u + 1, :, lo:hi]) for lay in layers]
        if past is None:
            kvs.append(own)
        else:
            kvs.append(
                [
                    (torch.cat((pk, k), dim=-2), torch.cat((pv, v), dim=-2))
                    for (pk, pv), (k, v) in zip(past, own)
                ]
            )
    return kvs


def _cache(model: torch.nn.Module, past: KV, rows: int) -> Any:
    """A ``DynamicCache`` holding ``past`` for each of ``rows`` rows (a broadcast view: the
    forward's concatenation is the only copy)."""
    from transformers import DynamicCache

    inner = getattr(model, "module", model)  # DeepSpeed's engine: its own .config is DeepSpeed's
    cache = DynamicCache(config=inner.config)
    for layer, (k, v) in zip(cache.layers, past):
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)
    return cache
