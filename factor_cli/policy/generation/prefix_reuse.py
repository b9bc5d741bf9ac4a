"""Prefix reuse: prompt KV kept across calls, each new prompt prefilling only what follows its
longest stored prefix (the ``hf`` backend's ``prefix_reuse``, ``rollout.prefix_reuse``).

The KV of every prompt encoded so far stays in a bounded :class:`~.prefix_cache.PrefixCache` (a
radix tree over token ids, LRU eviction). What a new prompt finds there: the previous turn's
prompt of the same episode when prompts are append-only (a ``prompt.history_turns`` window
covering the whole episode), system + task (+ the first observation) shared by the K
trajectories of a group, a continuation's root prompt at its checkpoint. A batch runs in two
passes (:meth:`PrefixReuse.inputs`):

1. prefill: stems two or more prompts share past their stored prefixes are prefilled first,
   once (:mod:`.stems`); then the distinct prompts whose x[:-1] (all but the last token) is not
   fully stored, in batches of similar suffix lengths (:func:`cost_batches`), are left-padded to
   a width W; row u has pad_u padding columns, m_u stored tokens and S_u = |x_u| - 1 - m_u new
   ones; with c0 = W - max_u S_u, one forward computes columns [c0, W) over a cache holding, per
   row, its stored KV for columns [pad_u, c0) (rows with shorter suffixes recompute a few stored
   tokens: harmless), and the new KV are stored;
2. decode: every row's x[:-1] is now stored; the decode loop receives them as its cache
   (columns [pad_b, W - 1), padding columns zero and masked) and computes the last prompt
   column, then decodes as without reuse.

In both passes, on a CPU, a stored prefix of P >= ``shared_prefix_min`` tokens that every row of
the batch starts with (system + task for every episode of one game) is gathered once, not into
every row's columns, and attended as one query block (:mod:`.shared_attention`); the rows' own
columns then start at position P. On a CPU both passes gather the stored KV into blocks of
memory reused from batch to batch (:mod:`.scratch`).

Position ids are the left-padded ones (cumulative attention mask - 1: token j of a prompt sits
at position j at any padding), so a stored prefix is valid in any batch. Replies and log-probs
are those of reuse off up to float rounding (the same token KV, computed in other batch
shapes): greedy and seeded replies are identical in the tests, log-probs agree within 1e-5
(fp32). The cache belongs to one set of weights: :meth:`PrefixReuse.clear` drops it (the
backend's ``refresh``, after every update) and :meth:`PrefixReuse.check_weights` drops it when
an in-place update bumped the parameters' version counters. What it saves:
``docs/benchmarks.md`` (Generation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .base import common_length
from .decode import buffer_cache, left_pad
from .prefix_cache import Match, PrefixCache
from .scratch import Scratch
from .shared_attention import use_shared_prefix
from .stems import shared_stems

if TYPE_CHECKING:
    from transformers import DynamicCache

Seq = tuple[int, ...]


@dataclass
class TokenCounts:
    """What a backend computed and what it took from earlier work, in prompt tokens."""

    prompt: int = 0
    """Prompt tokens of every reply generated so far."""
    prefill: int = 0
    """Of those, the tokens whose KV the backend computed (the rest came from the cache, or
    from an identical prompt of the same batch)."""
    shared_prefix: int = 0
    """Prompt tokens that decoding read from a prefix shared by the whole batch (held once)
    instead of from each row's own cache."""
    score_reused: int = 0
    """Tokens scoring took from the prefix cache instead of encoding them."""


class PrefixReuse:
    """The prefix cache and the two-pass prefill over it (module docstring)."""

    def __init__(
        self,
        capacity_tokens: int,
        pad_id: int,
        batch_size: int,
        counts: TokenCounts,
        shared_prefix_min: int | None,
        stem_min: int | None,
    ) -> None:
        """``shared_prefix_min``: on a CPU, a stored prefix of at least this many tokens that
        every row of a batch starts with is read once (None: never); ``stem_min``: prefill first,
        once, what two or more prompts share past their stored prefixes when that is at least
        this many tokens (None: never)."""
        self.cache = PrefixCache(capacity_tokens)
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.counts = counts
        self.shared_prefix_min = shared_prefix_min
        self.stem_min = stem_min
        self.scratch = Scratch()
        """Reused memory of the batches' gathered KV on a CPU (:mod:`.scratch`)."""
        self._weights: tuple[int, int] | None = None

    def clear(self) -> None:
        """Drop every stored prefix: their KV belong to the weights before an update."""
        self.cache.clear()
        self._weights = None

    def check_weights(self, model: torch.nn.Module) -> None:
        """Drop the cache when the model or its parameters changed since it was filled:
        in-place updates (optimizer steps, ``load_state_dict``) bump each tensor's version
        counter. A safety net only: writes through ``.data`` (DeepSpeed) are not counted, so
        callers still clear after every update."""
        key = (id(model), sum(p._version for p in model.parameters()))
        if key != self._weights:
            self.cache.clear()
            self._weights = key

    def inputs(
        self,
        model: torch.nn.Module,
        prompts: list[list[int]],
        device: torch.device,
        capacity_extra: int,
        keep: Sequence[bool] | None = None,
        room: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache, torch.Tensor | None]:
        """Pass 1 (prefill what is not stored) and the inputs of pass 2: (ids, mask) [B, W]
        less a prefix of P tokens shared by all rows, the cache of every row's x[:-1] with
        ``capacity_extra`` spare columns for the reply, and the shared prefix's KV
        [N_layers, 2, 1, H_kv, P, D] (None when P = 0). ``keep[i]`` False: row i's new KV are
        stored transient; ``room``: rows the decode may grow to."""
        self.check_weights(model)
        heads = [tuple(p[:-1]) for p in prompts]  # the KV generate needs: all but the last token
        distinct = list(dict.fromkeys(heads))
        kept = {h for h, k in zip(heads, keep or [True] * len(heads)) if k}
        transient = {h for h in distinct if h not in kept}
        found = [self.cache.match(h) for h in distinct]
        missing = [(h, m) for h, m in zip(distinct, found) if m.length < len(h)]
        self.counts.prefill += sum(min(len(p), 1) for p in prompts)  # decoding's first column
        if self.stem_min is not None and len(missing) > 1:
            stems = shared_stems([(h, m.length) for h, m in missing], self.stem_min)
            # A stem is transient only when every prompt that shares it is.
            self._prefill_missing(
                model,
                [s for s, _ in stems],
                device,
                {s for s, of in stems if all(missing[i][0] in transient for i in of)},
            )
        self._prefill_missing(model, [h for h, _ in missing], device, transient)
        stored = {h: self.cache.match(h) for h in distinct}
        n_shared = self._shared_length(heads, device)
        shared = None
        if n_shared:
            shared = self._prefix_kv(stored[heads[0]], n_shared, device)
            self.counts.shared_prefix += n_shared * len(heads)
        ids, mask = left_pad([p[n_shared:] for p in prompts], self.pad_id)
        width = ids.shape[1] - 1
        pads = [width - (len(h) - n_shared) for h in heads]
        capacity = ids.shape[1] + capacity_extra
        matches = [stored[h] for h in heads]
        cache = self.stored_cache(model, matches, pads, width, device, capacity, n_shared, room)
        self.cache.evict()  # after the gather: this batch's prefixes were needed until now
        return ids.to(device), mask.to(device), cache, shared

    def _prefill_missing(
        self,
        model: torch.nn.Module,
        seqs: list[Seq],
        device: torch.device,
        transient: set[Seq],
    ) -> None:
        """Store the KV of every sequence of ``seqs``, prefilling what the cache lacks of each,
        in batches of similar suffix lengths (so one long suffix does not pad every row)."""
        found = [self.cache.match(s) for s in seqs]
        new = [len(s) - m.length for s, m in zip(seqs, found)]
        for batch in cost_batches(new, self.batch_size):
            # Matched again: an earlier batch may have stored more of a row, or split the
            # nodes an older match points into.
            again = [(h, self.cache.match(h)) for h in (seqs[i] for i in batch)]
            rows = [(h, m) for h, m in again if m.length < len(h)]
            if rows:
                self.counts.prefill += sum(len(h) - m.length for h, m in rows)
                self._prefill(model, rows, device, transient)

    def _shared_length(self, heads: list[Seq], device: torch.device, cap: int | None = None) -> int:
        """P: the tokens every sequence of ``heads`` starts with (at most ``cap``: those stored
        for every row), when a forward holds them once (:mod:`.shared_attention`: the CPU
        kernel, at least ``shared_prefix_min`` tokens, two rows or more); else 0."""
        least = self.shared_prefix_min
        if least is None or len(heads) < 2 or device.type != "cpu":
            return 0
        # The common prefix of all is that of the lexicographically first and last.
        n = common_length(min(heads), max(heads))
        n = n if cap is None else min(n, cap)
        return n if n >= max(least, 1) else 0

    def _prefill(
        self,
        model: torch.nn.Module,
        rows: list[tuple[Seq, Match]],
        device: torch.device,
        transient: set[Seq],
    ) -> None:
        """One forward over the unstored columns [c0, W) of ``rows`` (sequence, stored match);
        their new KV go into the cache (transient for the sequences in ``transient``). A stored
        prefix of P tokens that every row starts with is attended once and left out of the
        rows' columns."""
        heads = [h for h, _ in rows]
        n_shared = self._shared_length(heads, device, cap=min(m.length for _, m in rows))
        seqs = [list(h[n_shared:]) for h in heads]
        ids, mask = left_pad(seqs, self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        width = ids.shape[1]
        pads = [width - len(s) for s in seqs]
        c0 = width - max(len(h) - m.length for h, m in rows)  # = min_u pad_u + m_u - P
        matches = [m for _, m in rows]
        past = self.stored_cache(model, matches, pads, c0, device, width, n_shared)
        pos = (mask.cumsum(-1) - 1).clamp_min(0) + n_shared  # position ids for left padding
        forward = dict(
            input_ids=ids[:, c0:],
            attention_mask=mask,
            position_ids=pos[:, c0:],
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,  # no logits needed: only the KV
        )
        if n_shared:
            shared = self._prefix_kv(matches[0], n_shared, device)
            with use_shared_prefix(model, shared):
                out = model(**forward)
        else:
            out = model(**forward)
        layers = out.past_key_values.layers
        for u, (h, m) in enumerate(rows):
            lo = pads[u] + m.length - n_shared  # the first column not stored yet
            # One copy into [N_layers, 2, H_kv, n, D] (a stack of per-layer stacks copied twice).
            parts = [t for lay in layers for t in (lay.keys[u, :, lo:], lay.values[u, :, lo:])]
            kv = torch.stack(parts).unflatten(0, (len(layers), 2))
            self.cache.insert(h, kv, m.length, transient=h in transient, handed_over=True)

    def stored_cache(
        self,
        model: torch.nn.Module,
        matches: list[Match],
        pads: list[int],
        width: int,
        device: torch.device,
        capacity: int,
        start: int = 0,
        room: int = 0,
    ) -> DynamicCache:
        """A buffer cache of ``capacity`` columns whose first ``width`` are filled: row b holds
        the stored tokens [start, start + width - pads[b]) of ``matches[b]`` in columns
        [pads[b], width) (none when that is <= 0), zeros (masked padding) before them; spare
        rows up to ``room``."""
        if width <= 0:
            return buffer_cache(model.config, capacity)
        past = self._gather_rows(matches, pads, width, device, capacity, start, room=room)
        return buffer_cache(model.config, capacity, past, width, len(matches))

    def _prefix_kv(self, match: Match, n: int, device: torch.device) -> torch.Tensor:
        """KV [N_layers, 2, 1, H_kv, n, D] of the first ``n`` tokens of ``match``: a prefix that
        a forward holds once for every row (:mod:`.shared_attention`)."""
        return self._gather_rows([match], [0], n, device, n, 0, scratch="prefix")

    def _gather_rows(
        self,
        matches: list[Match],
        pads: list[int],
        width: int,
        device: torch.device,
        capacity: int,
        start: int,
        scratch: str = "rows",
        room: int = 0,
    ) -> torch.Tensor:
        """KV [N_layers, 2, max(B, room), H_kv, capacity, D], its first B rows laid out as
        :meth:`stored_cache` says (the rest unset); on a CPU a view of the scratch block
        ``scratch``, valid until that block's next use."""
        like = next(node.kv for m in matches for node, _ in m.pieces)
        n_layers, _, heads, _, dim = like.shape
        shape = (n_layers, 2, max(len(matches), room), heads, capacity, dim)
        if device.type == "cpu":
            past = self.scratch.take(scratch, shape, like.dtype, device)
        else:  # CUDA's caching allocator reuses its blocks already
            past = torch.empty(shape, dtype=like.dtype, device=device)
        for b, (m, pad) in enumerate(zip(matches, pads)):
            # Padding columns are masked, but must be finite: 0 * nan would still be nan.
            past[:, :, b, :, : max(pad, 0)] = 0
            if width > pad:
                out = past[:, :, b, :, max(pad, 0) : width]
                self.cache.gather(m, width - pad, out, start)
        return past


def cost_batches(new: list[int], batch_size: int, slack: float = 1.25) -> list[list[int]]:
    """Row indices by ascending count of tokens to compute, cut into batches of at most
    ``batch_size`` rows whose padded cost (rows x the largest count, what one forward computes)
    stays within ``slack`` x the sum of their counts."""
    out: list[list[int]] = []
    rows: list[int] = []
    total = 0
    for i in sorted(range(len(new)), key=new.__getitem__):
        padded = (len(rows) + 1) * new[i]
        if rows and (len(rows) >= batch_size or padded > slack * (total + new[i])):
            out.append(rows)
            rows, total = [], 0
        rows.append(i)
        total += new[i]
    return [*out, rows] if rows else out


def plain_kv_layers(model: torch.nn.Module) -> bool:
    """True when every layer of the model's ``DynamicCache`` is a plain full-attention
    ``DynamicLayer`` (keys and values [B, H_kv, S, D] of every position), which prefix reuse
    needs; sliding-window or linear-attention layers keep other state."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # an unusual config: decode without reuse rather than guess
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
