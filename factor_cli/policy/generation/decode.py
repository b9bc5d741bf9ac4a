"""The ``hf`` backend's decode loop: preallocated KV buffers, finished rows leave the batch.

Hugging Face ``generate`` keeps its KV in a ``DynamicCache`` that concatenates every layer's keys
and values at every step, so a step of a batch with B rows of S cached tokens copies the whole
cache (B x S x 2 x N_layers x H_kv x D values) once more; it also keeps decoding rows that have
stopped until the longest reply ends. On the tiny model the copy was ~15% of continuation time
and the finished rows about half of the decode work. :func:`decode` instead

- writes each step's keys and values in place into buffers allocated once at the batch's final
  width (:class:`BufferLayer`, a full-attention cache layer with a capacity);
- drops rows that have stopped from the batch (their buffers are compacted, one copy) once at
  most half of the rows are still decoding (each compaction copies every remaining row's
  keys and values; measured against three quarters on ``benchmarks/rollout.py``: 1.03x);
- samples from exactly softmax(z / T) (renormalised over C_j under valid-action decoding, see
  :mod:`.constrained`): no generation-config processors (a checkpoint's repetition penalty,
  top-k / top-p defaults) can change the draw behind the behaviour log-probs' back.

The draw per row is the one ``generate`` made with the backend's processors: greedy argmax,
the row's own Gumbel stream (:class:`~.hf.RowSeededSampler`: each call draws one uniform vector
per active row, so row i's k-th token depends only on (seed_i, k)), or a multinomial draw from
torch's global generator when no seeds are given. Log-probs are computed at each step,
log pi(y_j) = z_j[y_j] / T - logsumexp_{v in C_j} z_j[v] / T (T = 1 for greedy), so the [B, G, V]
logits of a whole batch are never held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .constrained import MASKED_LOGIT, TokenTrie

COMPACT_BELOW = 0.5
"""Finished rows leave the batch once at most this fraction of its rows still decodes."""


class BufferLayer(DynamicLayer):
    """A full-attention cache layer over buffers [B, H_kv, capacity, D] allocated once:
    :meth:`update` writes the new keys and values in place and returns views of the filled
    columns, where :class:`~transformers.cache_utils.DynamicLayer` concatenates."""

    def __init__(
        self,
        capacity: int,
        keys: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        length: int = 0,
    ) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        if keys is not None and values is not None:
            self._set(keys, values, length)

    def _set(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        if keys.shape[-2] != self.capacity or length > self.capacity:
            raise ValueError(f"buffer of {keys.shape[-2]} columns, capacity {self.capacity}")
        self._k, self._v, self.length = keys, values, length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.keys, self.values = keys[..., :length, :], values[..., :length, :]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        empty = key_states.new_empty((b, h, self.capacity, d))
        self._set(empty, torch.empty_like(empty), 0)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        lo, hi = self.length, self.length + key_states.shape[-2]
        if hi > self.capacity:
            raise RuntimeError(f"KV buffer full: {hi} columns for a capacity of {self.capacity}")
        self._k[..., lo:hi, :] = key_states
        self._v[..., lo:hi, :] = value_states
        self.length = hi
        self.keys, self.values = self._k[..., :hi, :], self._v[..., :hi, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # index_select, not advanced indexing: its kernel copies whole rows (3x faster on CPU).
        if self.is_initialized:
            keys, values = self._k.index_select(0, indices), self._v.index_select(0, indices)
            self._set(keys, values, self.length)


def buffer_cache(
    config: Any, capacity: int, kv: torch.Tensor | None = None, length: int = 0
) -> DynamicCache:
    """A cache of :class:`BufferLayer` s of ``capacity`` columns; ``kv`` [N_layers, 2, B, H_kv,
    capacity, D] holds the first ``length`` columns already (None: empty, allocated by the
    first forward). A model with other layers (sliding windows) gets its own ``DynamicCache``,
    which then cannot start filled."""
    cache = DynamicCache(config=config)
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        if kv is not None:
            raise ValueError("only full-attention cache layers can start from stored KV")
        return cache
    if kv is None:
        cache.layers = [BufferLayer(capacity) for _ in cache.layers]
    else:
        cache.layers = [BufferLayer(capacity, k, v, length) for k, v in kv]
    return cache


@dataclass
class Sampling:
    """How each step's token is chosen: greedy, the rows' own Gumbel streams (``draw`` over the
    active rows' generators), or torch's global multinomial; scores at T (1 for greedy)."""

    temperature: float
    greedy: bool
    draw: Callable[[torch.Tensor, Sequence[int]], torch.Tensor] | None = None

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
) -> list[Decoded]:
    """Replies to the left-padded prompts ``ids`` [B, W] (``mask`` [B, W]) whose first
    ``cache.get_seq_length()`` columns are in ``cache`` already (a :func:`buffer_cache` of at
    least W + ``max_new_tokens`` - 1 columns, or any ``DynamicCache``): the first forward
    computes the rest of the prompt, each later one the previous token, until every row
    stopped or has ``max_new_tokens`` tokens. ``first_position``: the position of each row's
    first token in ``ids`` (> 0 when the tokens before it are a prefix shared by every row,
    held apart: :mod:`.shared_attention`)."""
    device = ids.device
    n, width = ids.shape
    stops = torch.tensor(sorted(set(int(s) for s in stop_ids)), device=device)
    full = torch.zeros((n, width + max_new_tokens), dtype=mask.dtype, device=device)
    full[:, :width] = mask
    pos = (mask.cumsum(-1) - 1).clamp_min(0) + first_position
    rows = list(range(n))  # batch row -> original row
    done = torch.zeros(n, dtype=torch.bool, device=device)  # per batch row: a stop was drawn
    out: list[list[int]] = [[] for _ in range(n)]
    lps: list[list[float]] = [[] for _ in range(n)]
    start = cache.get_seq_length()
    step_ids, step_pos, cols = ids[:, start:], pos[:, start:], width
    for j in range(max_new_tokens):
        logits = model(
            input_ids=step_ids,
            attention_mask=full[:, :cols],
            position_ids=step_pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        raw = logits.float()
        keep = _trie_keep(tries, rows, out, raw.shape[-1])
        off = None if keep is None else ~keep.to(device)  # one transfer, both masks
        z = raw if off is None else raw.masked_fill(off, float("-inf"))
        tok = sampling.pick(z, rows)
        scaled = raw / sampling.scale
        if off is not None:
            scaled = scaled.masked_fill(off, MASKED_LOGIT)
        lp = torch.log_softmax(scaled, -1).gather(-1, tok[:, None]).squeeze(-1)
        for b, t, p in zip(rows, tok.tolist(), lp.tolist()):
            out[b].append(t)
            lps[b].append(p)
        done |= torch.isin(tok, stops)
        going = ~done
        if j + 1 == max_new_tokens or not bool(going.any()):
            break
        full[:, cols] = 1
        step_ids, step_pos, cols = tok[:, None], step_pos[:, -1:] + 1, cols + 1
        if int(going.sum()) <= COMPACT_BELOW * len(rows):
            idx = going.nonzero().squeeze(-1)
            cache.batch_select_indices(idx)
            rows = [rows[i] for i in idx.tolist()]
            full, step_ids, step_pos, done = full[idx], step_ids[idx], step_pos[idx], done[idx]
        # A stopped row still in the batch decodes on; its extra tokens are cut below.
    return [_cut(t, p, set(int(s) for s in stop_ids)) for t, p in zip(out, lps)]


def _cut(tokens: list[int], logprobs: list[float], stops: set[int]) -> Decoded:
    """A row's tokens and log-probs through its first stop token."""
    end = next((j + 1 for j, t in enumerate(tokens) if t in stops), len(tokens))
    return Decoded(tokens[:end], logprobs[:end])
