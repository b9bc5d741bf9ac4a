"""The ``hf`` backend's decode loop: preallocated KV buffers, finished rows leave the batch.

Hugging Face ``generate`` keeps its KV in a ``DynamicCache`` that concatenates every layer's keys
and values at every step, so a step of a batch with B rows of S cached tokens copies the whole
cache (B x S x 2 x N_layers x H_kv x D values) once more; it also keeps decoding rows that have
stopped until the longest reply ends. :func:`decode` instead

- writes each step's keys and values in place into buffers allocated once at the batch's final
  width (:class:`BufferLayer`, a full-attention cache layer with a capacity);
- drops rows that have stopped from the batch (their buffers are compacted, one copy) once at
  most half of the rows are still decoding (each compaction copies every remaining row's
  keys and values, so compacting at every departure would cost more than it saves);
- under valid-action decoding, writes the tokens a reply's trie forces without a forward where
  nothing reads their logits (``skip_forced``: the ``<action>`` tag with the prompt's forward,
  a reply's forced rest at once; :mod:`.forced`);
- samples from exactly softmax(z / T) (renormalised over C_j under valid-action decoding, see
  :mod:`.constrained`): no generation-config processors (a checkpoint's repetition penalty,
  top-k / top-p defaults) can change the draw behind the behaviour log-probs' back.

The draw per row is the one ``generate`` made with the backend's processors: greedy argmax, the
row's own Gumbel stream (:class:`~.row_sampler.RowSeededSampler`: each call draws one uniform vector
per active row, so row i's k-th token depends only on (seed_i, k)), or a multinomial draw from
torch's global generator when no seeds are given. Log-probs are computed at each step, log pi(y_j) =
z_j[y_j] / T - logsumexp_{v in C_j} z_j[v] / T (T = 1 for greedy), so the [B, G, V] logits of a
whole batch are never held. What each part saves: ``docs/benchmarks.md`` (Generation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .constrained import MASKED_LOGIT, TokenTrie
from .forced import forced_head, write_forced_rest

COMPACT_BELOW = 0.5
"""Finished rows leave the batch once at most this fraction of its rows still decodes."""


class BufferLayer(DynamicLayer):
    """A full-attention cache layer over buffers [R, H_kv, capacity, D] allocated once, of which
    the first ``rows`` rows are the batch's: :meth:`update` writes the new keys and values in
    place and returns views of the filled columns, where
    :class:`~transformers.cache_utils.DynamicLayer` concatenates; :meth:`append_rows` copies
    rows into the spare ones."""

    def __init__(
        self,
        capacity: int,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        length: int = 0,
        rows: int | None = None,
    ) -> None:
        """``keys``, ``values`` [R, H_kv, capacity, D]: buffers whose first ``length`` columns
        are filled, of which the first ``rows`` rows (all by default) are the batch's and the
        others spare (None: allocated by the first forward, with no spare rows)."""
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.rows = 0
        if keys is not None and values is not None:
            self._set(keys, values, length, keys.shape[0] if rows is None else rows)

    def _set(self, keys: torch.Tensor, values: torch.Tensor, length: int, rows: int) -> None:
        if keys.shape[-2] != self.capacity or length > self.capacity:
            raise ValueError(f"buffer of {keys.shape[-2]} columns, capacity {self.capacity}")
        self._k, self._v, self.length, self.rows = keys, values, length, rows
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        n, m = self.rows, self.length
        self.keys, self.values = self._k[:n, :, :m], self._v[:n, :, :m]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        empty = key_states.new_empty((b, h, self.capacity, d))
        self._set(empty, torch.empty_like(empty), 0, b)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        lo, hi = self.length, self.length + key_states.shape[-2]
        if hi > self.capacity:
            raise RuntimeError(f"KV buffer full: {hi} columns for a capacity of {self.capacity}")
        self._k[: self.rows, :, lo:hi] = key_states
        self._v[: self.rows, :, lo:hi] = value_states
        self.length = hi
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # index_select, not advanced indexing: its kernel copies whole rows (faster on CPU).
        if self.is_initialized:
            keys = self._k[: self.rows].index_select(0, indices)
            values = self._v[: self.rows].index_select(0, indices)
            self._set(keys, values, self.length, len(indices))

    def append_rows(self, src: Sequence[int], room: int) -> None:
        """Copies of rows ``src`` after the batch's rows, in that order. With fewer spare rows
        than that, the buffers are first reallocated with ``room`` rows (at least enough),
        which copies the batch's rows once."""
        n, m = self.rows, self.length
        need = n + len(src)
        if need > self._k.shape[0]:
            shape = (max(room, need), *self._k.shape[1:])
            keys, values = self._k.new_empty(shape), self._v.new_empty(shape)
            keys[:n, :, :m], values[:n, :, :m] = self._k[:n, :, :m], self._v[:n, :, :m]
            self._k, self._v = keys, values
        for i, r in enumerate(src):
            self._k[n + i, :, :m] = self._k[r, :, :m]
            self._v[n + i, :, :m] = self._v[r, :, :m]
        self.rows = need
        self._views()


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both [B, W]: left padding, each sequence ends at column W - 1."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def append_rows(cache: DynamicCache, rows: int, src: Sequence[int], room: int) -> None:
    """Copies of the ``rows``-row batch's rows ``src`` appended to ``cache``, in that order:
    into spare rows of :class:`BufferLayer` s (``room``: the most rows the batch will need),
    by a reselection of every row for other layers."""
    if all(isinstance(layer, BufferLayer) for layer in cache.layers):
        for layer in cache.layers:
            layer.append_rows(src, room)
    else:
        cache.batch_select_indices(torch.tensor([*range(rows), *src]))


def buffer_cache(
    config: Any,
    capacity: int,
    kv: torch.Tensor | None = None,
    length: int = 0,
    rows: int | None = None,
) -> DynamicCache:
    """A cache of :class:`BufferLayer` s of ``capacity`` columns; ``kv`` [N_layers, 2, R, H_kv,
    capacity, D] holds the first ``length`` columns already, in its first ``rows`` rows (all by
    default; the others are spare rows for :func:`append_rows`), or None: empty, allocated by
    the first forward. A model with other layers (sliding windows) gets its own
    ``DynamicCache``, which then cannot start filled."""
    cache = DynamicCache(config=config)
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        if kv is not None:
            raise ValueError("only full-attention cache layers can start from stored KV")
        return cache
    if kv is None:
        cache.layers = [BufferLayer(capacity) for _ in cache.layers]
    else:
        cache.layers = [BufferLayer(capacity, k, v, length, rows) for k, v in kv]
    return cache


@dataclass
class Sampling:
    """How each step's token is chosen: greedy, the rows' own Gumbel streams (``draw`` over the
    active rows' generators; ``skip`` advances streams past positions drawn without a call),
    or torch's global multinomial; scores at T (1 for greedy)."""

    temperature: float
    greedy: bool
    draw: Callable[[torch.Tensor, Sequence[int]], torch.Tensor] | None = None
    skip: Callable[[Sequence[int], int], None] | None = None

    def pick(self, z: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """Token per row from raw (masked) logits ``z`` [A, V] of the active ``rows``."""
        if self.greedy:
            return z.argmax(-1)
        if self.draw is not None:
            return self.draw(z, rows)
        probs = torch.softmax(z.float() / self.temperature, dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)

    @property
    def scale(self) -> float:
        return 1.0 if self.greedy else float(self.temperature)

    @property
    def per_request(self) -> bool:
        """Whether a request's draws depend on its own logits and stream alone, whichever other
        requests draw (greedy, or streams that can skip): forced tokens may then skip the
        model (:func:`decode`'s ``skip_forced``)."""
        return self.greedy or (self.draw is not None and self.skip is not None)

    def advance(self, rows: Sequence[int], n: int) -> None:
        """The streams of ``rows`` past ``n`` positions whose tokens were forced."""
        if not self.greedy and n > 0 and rows:
            if self.skip is None:
                raise ValueError("these draws cannot skip positions (no per-request streams)")
            self.skip(rows, n)


@dataclass
class Decoded:
    """One row's reply: its tokens (through the first stop token) and their log-probs."""

    tokens: list[int]
    logprobs: list[float]


def _trie_keep(
    tries: Sequence[TokenTrie | None], rows: Sequence[int], out: list[list[int]], vocab: int
) -> torch.Tensor | None:
    """[A, V] bool of C_j for the active constrained rows (all True for free ones); None when
    no active row is constrained at this step."""
    keep = None
    for a, b in enumerate(rows):
        trie = tries[b]
        allowed = None if trie is None else trie.allowed(out[b])
        if allowed is None:
            continue
        if keep is None:
            keep = torch.ones((len(rows), vocab), dtype=torch.bool)
        keep[a] = False
        keep[a, allowed] = True
    return keep


def decode(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    cache: DynamicCache,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    sampling: Sampling,
    tries: Sequence[TokenTrie | None],
    first_position: int = 0,
    members: Sequence[Sequence[int]] | None = None,
    skip_forced: bool = False,
) -> list[Decoded]:
    """Replies to the left-padded prompts ``ids`` [B, W] (``mask`` [B, W]) whose first
    ``cache.get_seq_length()`` columns are in ``cache`` already (a :func:`buffer_cache` of at
    least W + ``max_new_tokens`` - 1 columns, or any ``DynamicCache``): the first forward
    computes the rest of the prompt, each later one the previous token, until every row
    stopped or has ``max_new_tokens`` tokens. ``first_position``: the position of each row's
    first token in ``ids`` (> 0 when the tokens before it are a prefix shared by every row,
    held apart: :mod:`.shared_attention`).

    ``members[r]``: the requests (indices into ``tries`` and the result) that row r decodes
    for, requests with the same prompt (None: row r is request r alone).
    A row's requests draw their own tokens (``sampling``'s per-request streams) from the
    row's logits, which are theirs exactly while their replies agree; where the draws of a
    row's requests differ, the row is copied, its KV with it, once per further token, so each
    row always holds one sequence (:func:`_split`).

    ``skip_forced`` (with ``sampling.per_request``): a token forced by a request's trie
    (|C_j| = 1) is written without the model where nothing reads its logits. It has log
    pi^C = 0 and is drawn whatever the logits, so the replies do not change:

    - the forced start every row's requests share (the ``<action>`` tag), as many tokens for
      every row, enters the first forward with the prompt, and each request's stream skips
      those positions' draws;
    - a request whose remaining reply is forced through its stop token (the rest of the only
      admissible action with its prefix, and the closing tag) is written at once and leaves
      its row; a row whose requests all left is done.
    """
    device = ids.device
    n, width = ids.shape
    groups = [[b] for b in range(n)] if members is None else [list(m) for m in members]
    stop_set = set(int(s) for s in stop_ids)
    out: list[list[int]] = [[] for _ in range(sum(len(g) for g in groups))]
    lps: list[list[float]] = [[] for _ in out]
    skip = skip_forced and sampling.per_request
    groups = _retire(groups, tries, out, lps, stop_set, max_new_tokens, skip)
    head = forced_head(groups, tries, max_new_tokens) if skip else []
    h = len(head[0]) if head else 0
    full = torch.zeros((n, width + max_new_tokens), dtype=mask.dtype, device=device)
    full[:, :width] = mask
    pos = (mask.cumsum(-1) - 1).clamp_min(0) + first_position
    start = cache.get_seq_length()
    step_ids, step_pos, cols = ids[:, start:], pos[:, start:], width
    if h:
        for g, toks in zip(groups, head):
            for b in g:
                out[b] += toks
                lps[b] += [0.0] * h
        sampling.advance([b for g in groups for b in g], h)
        step_ids = torch.cat([step_ids, torch.tensor(head, device=device)], 1)
        step_pos = torch.cat([step_pos, pos[:, -1:] + torch.arange(1, h + 1, device=device)], 1)
        full[:, width : width + h] = 1
        cols += h
    while any(groups):
        logits = model(
            input_ids=step_ids,
            attention_mask=full[:, :cols],
            position_ids=step_pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        drawn = _draw(logits.float(), groups, tries, out, sampling)
        for b, (t, p) in drawn.items():
            out[b].append(t)
            lps[b].append(p)
        # Requests that end here leave first, so no row is copied for them.
        groups = _retire(groups, tries, out, lps, stop_set, max_new_tokens, skip)
        groups, copies, row_tok = _split(groups, drawn, int(stop_ids[0]))
        if copies:
            append_rows(cache, len(step_pos), copies, len(out))
            idx = torch.tensor([*range(len(step_pos)), *copies], device=device)
            full, step_pos = full[idx], step_pos[idx]
        going = [r for r, g in enumerate(groups) if g]
        if not going:
            break
        full[:, cols] = 1
        step_ids = torch.tensor(row_tok, device=device)[:, None]
        step_pos, cols = step_pos[:, -1:] + 1, cols + 1
        if len(going) <= COMPACT_BELOW * len(groups):
            idx = torch.tensor(going, device=device)
            cache.batch_select_indices(idx)
            groups = [groups[i] for i in going]
            full, step_ids, step_pos = full[idx], step_ids[idx], step_pos[idx]
        # A row whose requests all left stays in the batch until compaction: its tokens are
        # computed and read by no one.
    return [Decoded(t, p) for t, p in zip(out, lps)]


def _retire(
    groups: list[list[int]],
    tries: Sequence[TokenTrie | None],
    out: list[list[int]],
    lps: list[list[float]],
    stops: set[int],
    limit: int,
    skip_forced: bool,
) -> list[list[int]]:
    """The requests of each row still replying: a request leaves when its last token is a stop
    or it has ``limit`` tokens; with ``skip_forced`` also when its trie forces the rest of its
    reply through a stop token, which is written at once (log-prob 0, at most ``limit``
    tokens in all)."""
    kept: list[list[int]] = []
    for group in groups:
        live = []
        for b in group:
            if out[b] and out[b][-1] in stops:
                continue
            if skip_forced and write_forced_rest(tries[b], out[b], lps[b], limit):
                continue
            if len(out[b]) < limit:
                live.append(b)
        kept.append(live)
    return kept


def _draw(
    raw: torch.Tensor,
    groups: list[list[int]],
    tries: Sequence[TokenTrie | None],
    out: list[list[int]],
    sampling: Sampling,
) -> dict[int, tuple[int, float]]:
    """Each request's token and its log pi(y_j) = z_j[y_j] / T - logsumexp_{v in C_j} z_j[v] / T
    from the logits ``raw`` [R, V] of its batch row (``groups[r]``: row r's requests, none
    for a row whose requests all left), its allowed set C_j after ``out[b]`` and its own
    stream."""
    rows = [b for g in groups for b in g]  # the requests, in batch row order
    if any(len(g) != 1 for g in groups):
        src = [r for r, g in enumerate(groups) for _ in g]
        raw = raw.index_select(0, torch.tensor(src, device=raw.device))
    keep = _trie_keep(tries, rows, out, raw.shape[-1])
    off = None if keep is None else ~keep.to(raw.device)  # one transfer, both masks
    z = raw if off is None else raw.masked_fill(off, float("-inf"))
    tok = sampling.pick(z, rows)
    scaled = raw / sampling.scale
    if off is not None:
        scaled = scaled.masked_fill(off, MASKED_LOGIT)
    lp = torch.log_softmax(scaled, -1).gather(-1, tok[:, None]).squeeze(-1)
    return dict(zip(rows, zip(tok.tolist(), lp.tolist())))


def _split(
    groups: list[list[int]], drawn: dict[int, tuple[int, float]], idle: int
) -> tuple[list[list[int]], list[int], list[int]]:
    """After a step's draws ((token, log-prob) per request): (the requests of each batch row,
    the rows to copy for new rows appended in that order, each row's token: its first
    request's, ``idle`` for a row without requests). A row's requests that drew another token
    than its first request leave it for a copy of the row, one per token."""
    row_tok = [drawn[g[0]][0] if g else idle for g in groups]
    if all(len(g) <= 1 for g in groups):  # at most a request per row: nothing to split
        return groups, [], row_tok
    kept: list[list[int]] = []
    added: list[list[int]] = []
    copies: list[int] = []
    added_tok: list[int] = []
    for r, group in enumerate(groups):
        by_tok: dict[int, list[int]] = {}
        for b in group:
            by_tok.setdefault(drawn[b][0], []).append(b)
        kept.append(by_tok.pop(row_tok[r], []))
        for t, bs in by_tok.items():
            added.append(bs)
            copies.append(r)
            added_tok.append(t)
    return kept + added, copies, row_tok + added_tok
