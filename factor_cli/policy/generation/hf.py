"""The ``hf`` generation backend: a Hugging Face model decoded with a KV cache by our own loop
(:func:`.decode.decode`: in-place KV buffers, finished rows leave the batch, draws from exactly
softmax(z / T) whatever the checkpoint's generation config says), sampling with the trainer's
own model object (so its log-probs are the trainer's, and :meth:`refresh` only rebinds).

Seeded replies (the rollout runner always seeds them) are drawn by :class:`RowSeededSampler`, one
random stream per reply, so a reply does not depend on the batch it was generated in.

Valid-action decoding (``allowed``): each constrained row's logits are masked to its action
trie's C_j before the draw, and the reported log-probs are renormalised over the same sets
(:mod:`.constrained`).

Prefix reuse (``prefix_reuse=True``, the default; ``rollout.prefix_reuse``): the KV of every
prompt encoded so far stays in a bounded :class:`~.prefix_cache.PrefixCache` (a radix tree over
token ids, LRU eviction at ``prefix_cache_tokens``), and each new prompt prefills only what
follows its longest stored prefix: the previous turn's prompt of the same episode when prompts
are append-only (a ``prompt.history_turns`` window covering the whole episode), system + task
(+ the first observation) shared by the K trajectories of a group, a continuation's root prompt
at its checkpoint. A batch runs in two passes:

1. prefill: what two or more prompts of the batch share past their stored prefixes, by at least
   ``stem_min`` tokens (a stem: the K trajectories of a group after different first actions
   share system, task and o_0 up to the action they differ in), is prefilled first, once
   (:func:`shared_stems`; 24% fewer prefilled root tokens in ``benchmarks/rollout.py``); then
   the distinct prompts whose x[:-1] (all but the last token) is not fully stored,
   in batches of similar suffix lengths, are left-padded to a width W; row u has pad_u padding
   columns, m_u stored tokens and S_u = |x_u| - 1 - m_u new ones; with c0 = W - max_u S_u,
   one forward computes columns [c0, W) over a cache holding, per row, its stored KV for
   columns [pad_u, c0) (rows with shorter suffixes recompute a few stored tokens: harmless),
   and the new KV are stored;
2. decode: every row's x[:-1] is now stored; the decode loop receives them as its cache
   (columns [pad_b, W - 1), padding columns zero and masked) and computes the last prompt
   column, then decodes as without reuse.

In both passes, on a CPU, a stored prefix of P >= ``shared_prefix_min`` tokens that every row of
the batch starts with (system + task for every episode of one game; 41% of the prompt tokens of
``benchmarks/rollout.py``) is gathered once, not into every row's columns, and attended as one
query block (:mod:`.shared_attention`); the rows' own columns then start at position P. On a
CPU both passes gather the stored KV into blocks of memory reused from batch to batch
(:mod:`.scratch`: a fresh buffer of that size cost more in page faults than the copy).

Requests of a seeded or greedy batch with the same prompt (the K first turns of a group, the M
continuations of a checkpoint, and their later turns while they agree: 54% of the rows of a
FACTOR smoke step at M = 4) share one row, gathered and decoded once, each request drawing from
its own stream under its own allowed replies; where their draws differ the row is copied
(:func:`duplicate_rows`, :func:`.decode.decode`; ``merge_duplicates=False`` turns it off).

Under valid-action decoding, tokens a reply's trie forces (log pi^C = 0) skip the model where
nothing reads their logits: the ``<action>`` tag enters the first forward with the prompt, and
a reply whose rest is forced through its stop token (the only admissible action with its
prefix, and the closing tag) is written at once and leaves the batch. In a FACTOR smoke step
these are 67% of the reply tokens (``skip_forced=False``: a forward per token).

Position ids are the left-padded ones (cumulative attention mask - 1: token j of a prompt sits
at position j at any padding), so a stored prefix is valid in any batch. Replies and log-probs
are those of reuse off up to float rounding (the same token KV, computed in other batch
shapes): greedy and seeded replies are identical in the tests, log-probs agree within 1e-5
(fp32). The cache is dropped by :meth:`HFGenerator.refresh` (the trainer calls it after every
update) and, as a safety net, whenever an in-place update of the model's parameters bumped
their version counters (torch optimizers, ``load_state_dict``). Models whose cache layers are
not plain full-attention :class:`~transformers.DynamicLayer` (sliding windows) decode without
reuse, on their own ``DynamicCache``. :attr:`HFGenerator.prefill_tokens` and
:attr:`HFGenerator.reused_tokens` count the prompt tokens computed and taken from the cache,
:attr:`HFGenerator.shared_prefix_tokens` those decoding read from a prefix held once.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from ..value_head import features_at
from .base import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_CONTEXT,
    DEFAULT_MAX_NEW_TOKENS,
    Encoded,
    Generation,
    GenerationLimits,
    TokenizedBackend,
    check_temperature,
    request_seeds,
)
from .constrained import Allowed, TokenTrie, TrieBuilder
from .decode import Decoded, Sampling, buffer_cache, decode
from .hf_options import (
    MERGE_DUPLICATES,
    PREFIX_CACHE_BYTES,
    SHARED_PREFIX_MIN,
    SKIP_FORCED,
    STEM_MIN,
)
from .prefix_cache import Match, PrefixCache, kv_bytes_per_token
from .scoring import Scores, reply_scores
from .scratch import Scratch
from .shared_attention import use_shared_prefix

if TYPE_CHECKING:
    from transformers import DynamicCache

    from ..model import Policy


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both [B, W]: left padding, each sequence ends at column W - 1."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


class HFGenerator(TokenizedBackend):
    """Batched ``generate`` with a KV cache over all active environments in one call per turn."""

    def __init__(
        self,
        policy: Policy,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_context: int = DEFAULT_MAX_CONTEXT,
        batch_size: int = DEFAULT_BATCH_SIZE,
        prefix_reuse: bool = True,
        prefix_cache_tokens: int | None = None,
        shared_prefix_min: int | None = SHARED_PREFIX_MIN,
        stem_min: int | None = STEM_MIN,
        merge_duplicates: bool = MERGE_DUPLICATES,
        skip_forced: bool = SKIP_FORCED,
    ) -> None:
        """``prefix_reuse``: keep prompt KV across calls and prefill only new suffixes (module
        docstring); ``prefix_cache_tokens``: the cache's bound in tokens (default: what
        :data:`PREFIX_CACHE_BYTES` holds, at most ``2 * batch_size * max_context``);
        ``shared_prefix_min``: with prefix reuse on a CPU, prefill and decode read a stored
        prefix of at least this many tokens shared by every row of a batch once (None: never);
        ``stem_min``: with prefix reuse, prefill first, once, what two or more prompts of a
        batch share past their stored prefixes when that is at least this many tokens (None:
        never; :func:`shared_stems`); ``merge_duplicates``: requests of a seeded or greedy
        batch with the same prompt decode in one row while their replies agree
        (:func:`duplicate_rows`; False: a row per request); ``skip_forced``: under valid-action
        decoding, tokens a reply's trie forces skip the model where no logits of theirs are
        read (:func:`.decode.decode`; False: one forward per token)."""
        super().__init__(policy, GenerationLimits(max_new_tokens, max_context, batch_size))
        self.tries = TrieBuilder(self.tokenizer, self.stop_ids)
        if prefix_cache_tokens is None:
            per_token = kv_bytes_per_token(self.model.config, self.model.dtype)
            prefix_cache_tokens = min(2 * batch_size * max_context, PREFIX_CACHE_BYTES // per_token)
        self.prefix_reuse = prefix_reuse and _plain_kv_layers(self.model)
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.prompt_tokens = 0
        """Prompt tokens of every reply generated so far."""
        self.prefill_tokens = 0
        """Of those, the tokens whose KV the backend computed (the rest came from the cache, or
        from an identical prompt of the same batch): :attr:`reused_tokens` = the difference."""
        self.score_reused_tokens = 0
        """Tokens :meth:`score` took from the prefix cache instead of encoding them."""
        self.shared_prefix_min = shared_prefix_min
        self.stem_min = stem_min
        self.merge_duplicates = merge_duplicates
        self.skip_forced = skip_forced
        self.shared_prefix_tokens = 0
        """Prompt tokens that decoding read from a prefix shared by the whole batch (held once)
        instead of from each row's own cache."""
        self._weights: tuple[int, int] | None = None
        self._scratch = Scratch()
        """Reused memory of the batches' gathered KV on a CPU (:mod:`.scratch`)."""

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens whose KV was taken from earlier computation instead of prefilled."""
        return self.prompt_tokens - self.prefill_tokens

    def refresh(self, model: torch.nn.Module | None = None) -> None:
        """Sample with ``model`` from now on; nothing to copy, generation reads its weights.
        The prefix cache is dropped: its KV belong to the weights before the update."""
        if model is not None:
            self.model = model
        self.prefix_cache.clear()
        self._weights = None

    def _check_weights(self) -> None:
        """Drop the prefix cache when the model or its parameters changed since it was filled:
        in-place updates (optimizer steps, ``load_state_dict``) bump each tensor's version
        counter. A safety net only: writes through ``.data`` (DeepSpeed) are not counted, so
        callers still :meth:`refresh` after every update."""
        key = (id(self.model), sum(p._version for p in self.model.parameters()))
        if key != self._weights:
            self.prefix_cache.clear()
            self._weights = key

    def close(self) -> None:
        """Gives back the scratch memory; the model belongs to the caller."""
        self._scratch.clear()

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        allowed: Allowed = None,
        keep: Sequence[bool] | None = None,
    ) -> list[Generation]:
        """Sample (or greedily decode) one reply per prompt; seeds as
        :meth:`GenerationBackend.generate` says: reply i's stream is seeded by ``seeds[i]``, else
        ``seed + i`` (:class:`RowSeededSampler`); with neither, HF samples from torch's global
        generator. ``allowed``: valid-action decoding (:mod:`.constrained`). ``keep[i]`` False:
        prompt i's new KV are stored transient (evicted before the rest)."""
        check_temperature(temperature, greedy)
        rows = request_seeds(len(prompts), seed, seeds)
        tries = self.tries.tries(allowed, len(prompts))
        encoded = self.encode(prompts)
        keeps = [True] * len(prompts) if keep is None else list(keep)
        size = self.batch_size
        out: list[Generation] = []
        for lo in range(0, len(encoded), size):
            chunk = None if rows is None else rows[lo : lo + size]
            out += self._generate_batch(
                encoded[lo : lo + size],
                temperature,
                greedy,
                chunk,
                tries[lo : lo + size],
                keeps[lo : lo + size],
            )
        return out

    def _shared_prefix_cache(
        self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor
    ) -> DynamicCache:
        """KV cache of each distinct prompt (all but its last token), computed once and then
        copied to every row that repeats it (e.g. the M continuations of one checkpoint), in
        buffers with room for the reply."""
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        cache = buffer_cache(self.model.config, self._decode_capacity(ids.shape[1]))
        self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=pos[:, :-1],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_select_indices(rows.to(ids.device))
        return cache

    def _decode_capacity(self, width: int) -> int:
        """KV columns a batch of prompts ``width`` wide needs: the prompt and every reply token
        but the last (whose KV no step reads)."""
        return width + self.max_new_tokens - 1

    def _sampling(
        self, temperature: float, greedy: bool, seeds: Sequence[int] | None, device: torch.device
    ) -> Sampling:
        """Greedy, seeded (each reply its own Gumbel stream), or global-RNG sampling."""
        if greedy or seeds is None:
            return Sampling(float(temperature), greedy)
        sampler = RowSeededSampler(seeds, float(temperature), device)
        return Sampling(float(temperature), greedy, sampler.draw, sampler.skip)

    def _inputs(
        self,
        prompts: list[list[int]],
        device: torch.device,
        keep: Sequence[bool] | None = None,
        room: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache, torch.Tensor | None]:
        """(ids, mask) [B, W] on ``device``, the KV cache decoding starts from (every row's
        stored prefix under prefix reuse, a shared prefill when prompts repeat, else empty), and
        the KV [N_layers, 2, 1, H_kv, P, D] of a prefix of P tokens shared by every row, held
        once and left out of ids, mask and cache (:meth:`_shared_length`), or None.
        ``keep[i]`` False: row i's new prefix KV are stored transient. ``room``: rows the
        decode may grow to (copies of rows, :func:`.decode.append_rows`), kept spare in a
        filled cache."""
        self.prompt_tokens += sum(len(p) for p in prompts)
        if self.prefix_reuse:
            return self._reused_inputs(prompts, device, keep, room)
        distinct: dict[tuple[int, ...], int] = {}
        rows = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts])
        if len(distinct) < len(prompts) and min(len(p) for p in prompts) > 1:
            self.prefill_tokens += sum(len(p) - 1 for p in distinct) + len(prompts)
            uniq_ids, uniq_mask = _left_pad([list(p) for p in distinct], self.pad_id)
            uniq_ids, uniq_mask = uniq_ids.to(device), uniq_mask.to(device)
            cache = self._shared_prefix_cache(uniq_ids, uniq_mask, rows)
            rows = rows.to(device)
            return uniq_ids[rows], uniq_mask[rows], cache, None
        self.prefill_tokens += sum(len(p) for p in prompts)
        ids, mask = _left_pad(prompts, self.pad_id)
        cache = buffer_cache(self.model.config, self._decode_capacity(ids.shape[1]))
        return ids.to(device), mask.to(device), cache, None

    # -- prefix reuse (module docstring) ----------------------------------------------------
    def _reused_inputs(
        self,
        prompts: list[list[int]],
        device: torch.device,
        keep: Sequence[bool] | None = None,
        room: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, DynamicCache, torch.Tensor | None]:
        """Pass 1 (prefill what is not stored) and the cache of pass 2 (every row's x[:-1],
        less a prefix shared by all rows, which is returned apart)."""
        self._check_weights()
        heads = [tuple(p[:-1]) for p in prompts]  # the KV generate needs: all but the last token
        distinct = list(dict.fromkeys(heads))
        kept = {h for h, k in zip(heads, keep or [True] * len(heads)) if k}
        transient = {h for h in distinct if h not in kept}
        found = [self.prefix_cache.match(h) for h in distinct]
        missing = [(h, m) for h, m in zip(distinct, found) if m.length < len(h)]
        self.prefill_tokens += sum(min(len(p), 1) for p in prompts)  # decoding's first column
        if self.stem_min is not None and len(missing) > 1:
            stems = shared_stems([(h, m.length) for h, m in missing], self.stem_min)
            # A stem is transient only when every prompt that shares it is.
            self._prefill_missing(
                [s for s, _ in stems],
                device,
                {s for s, of in stems if all(missing[i][0] in transient for i in of)},
            )
        self._prefill_missing([h for h, _ in missing], device, transient)
        stored = {h: self.prefix_cache.match(h) for h in distinct}
        n_shared = self._shared_length(heads, device)
        shared = None
        if n_shared:
            shared = self._prefix_kv(stored[heads[0]], n_shared, device)
            self.shared_prefix_tokens += n_shared * len(heads)
        ids, mask = _left_pad([p[n_shared:] for p in prompts], self.pad_id)
        width = ids.shape[1] - 1
        pads = [width - (len(h) - n_shared) for h in heads]
        capacity = self._decode_capacity(ids.shape[1])
        matches = [stored[h] for h in heads]
        cache = self._stored_cache(matches, pads, width, device, capacity, n_shared, room)
        self.prefix_cache.evict()  # after the gather: this batch's prefixes were needed until now
        return ids.to(device), mask.to(device), cache, shared

    def _prefill_missing(
        self, seqs: list[tuple[int, ...]], device: torch.device, transient: set[tuple[int, ...]]
    ) -> None:
        """Store the KV of every sequence of ``seqs``, prefilling what the cache lacks of each,
        in batches of similar suffix lengths (so one long suffix does not pad every row)."""
        found = [self.prefix_cache.match(s) for s in seqs]
        for batch in self._cost_batches([len(s) - m.length for s, m in zip(seqs, found)]):
            # Matched again: an earlier batch may have stored more of a row, or split the
            # nodes an older match points into.
            again = [(h, self.prefix_cache.match(h)) for h in (seqs[i] for i in batch)]
            rows = [(h, m) for h, m in again if m.length < len(h)]
            if rows:
                self.prefill_tokens += sum(len(h) - m.length for h, m in rows)
                self._prefill(rows, device, transient)

    def _shared_length(
        self, heads: list[tuple[int, ...]], device: torch.device, cap: int | None = None
    ) -> int:
        """P: the tokens every sequence of ``heads`` starts with (at most ``cap``: those stored
        for every row), when a forward holds them once (:mod:`.shared_attention`: the CPU
        kernel, at least ``shared_prefix_min`` tokens, two rows or more); else 0."""
        least = self.shared_prefix_min
        if least is None or len(heads) < 2 or device.type != "cpu":
            return 0
        # The common prefix of all is that of the lexicographically first and last.
        n = _common_length(min(heads), max(heads))
        n = n if cap is None else min(n, cap)
        return n if n >= max(least, 1) else 0

    def _prefill(
        self,
        rows: list[tuple[tuple[int, ...], Match]],
        device: torch.device,
        transient: set[tuple[int, ...]] | None = None,
    ) -> None:
        """One forward over the unstored columns [c0, W) of ``rows`` (sequence, stored match);
        their new KV go into the prefix cache (transient for the sequences in ``transient``).
        A stored prefix of P tokens that every row starts with is attended once
        (:mod:`.shared_attention`) and left out of the rows' columns."""
        heads = [h for h, _ in rows]
        n_shared = self._shared_length(heads, device, cap=min(m.length for _, m in rows))
        seqs = [list(h[n_shared:]) for h in heads]
        ids, mask = _left_pad(seqs, self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        width = ids.shape[1]
        pads = [width - len(s) for s in seqs]
        c0 = width - max(len(h) - m.length for h, m in rows)  # = min_u pad_u + m_u - P
        matches = [m for _, m in rows]
        past = self._stored_cache(matches, pads, c0, device, width, n_shared)
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
            with use_shared_prefix(self.model, shared):
                out = self.model(**forward)
        else:
            out = self.model(**forward)
        layers = out.past_key_values.layers
        for u, (h, m) in enumerate(rows):
            lo = pads[u] + m.length - n_shared  # the first column not stored yet
            # One copy into [N_layers, 2, H_kv, n, D] (a stack of per-layer stacks copied twice).
            parts = [t for lay in layers for t in (lay.keys[u, :, lo:], lay.values[u, :, lo:])]
            kv = torch.stack(parts).unflatten(0, (len(layers), 2))
            self.prefix_cache.insert(
                h, kv, m.length, transient=h in (transient or ()), handed_over=True
            )

    def _stored_cache(
        self,
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
            return buffer_cache(self.model.config, capacity)
        past = self._gather_rows(matches, pads, width, device, capacity, start, room=room)
        return buffer_cache(self.model.config, capacity, past, width, len(matches))

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
        :meth:`_stored_cache` says (the rest unset); on a CPU a view of the scratch block
        ``scratch``, valid until that block's next use."""
        like = next(node.kv for m in matches for node, _ in m.pieces)
        n_layers, _, heads, _, dim = like.shape
        shape = (n_layers, 2, max(len(matches), room), heads, capacity, dim)
        if device.type == "cpu":
            past = self._scratch.take(scratch, shape, like.dtype, device)
        else:  # CUDA's caching allocator reuses its blocks already
            past = torch.empty(shape, dtype=like.dtype, device=device)
        for b, (m, pad) in enumerate(zip(matches, pads)):
            # Padding columns are masked, but must be finite: 0 * nan would still be nan.
            past[:, :, b, :, : max(pad, 0)] = 0
            if width > pad:
                out = past[:, :, b, :, max(pad, 0) : width]
                self.prefix_cache.gather(m, width - pad, out, start)
        return past

    # -- scoring from the prefix cache ---------------------------------------------------------
    @torch.no_grad()
    def score(
        self,
        prompts: Sequence[Sequence[int]],
        replies: Sequence[Sequence[int]],
        temperature: float = 1.0,
        allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
        return_hidden: bool = False,
        return_logits: bool = False,
    ) -> Scores:
        """:func:`.scoring.score_replies` (no gradient) that starts each sequence x + y from
        the longest prefix of x[:-1] the prefix cache holds, so the teacher's prompts (the
        student's prompt with the feedback block appended) and the value head's boundary
        states (the rollout's own prompts) cost only what the rollout did not encode. Rows are
        batched by how much they must compute, so one uncached row does not make a batch
        recompute the others' stored tokens. Without prefix reuse: the radix-tree forward."""
        if not self.prefix_reuse:  # no cache to start from: the shared radix-tree scorer
            return super().score(
                prompts, replies, temperature, allowed, return_hidden, return_logits
            )
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token (its last one predicts it)")
        self._check_weights()
        found = [self.prefix_cache.match(p[:-1]) for p in prompts]
        new = [len(p) + len(r) - m.length for p, r, m in zip(prompts, replies, found)]
        logps: list[Any] = [None] * len(prompts)
        hidden: list[Any] = [None] * len(prompts)
        logits: list[Any] = [None] * len(prompts)
        for rows in self._cost_batches(new):
            z, h = self._score_rows(
                [list(prompts[i]) for i in rows],
                [list(replies[i]) for i in rows],
                [found[i] for i in rows],
                return_hidden,
            )
            sets = None if allowed is None else [allowed[i] for i in rows]
            lp, zs = reply_scores([x / temperature for x in z], [replies[i] for i in rows], sets)
            for k, i in enumerate(rows):
                logps[i], logits[i] = lp[k], zs[k]
                hidden[i] = None if h is None else h[k]
        hidden_t = torch.stack(hidden) if return_hidden else None
        return Scores(logps, hidden_t, logits if return_logits else None)

    def _cost_batches(self, new: list[int], slack: float = 1.25) -> list[list[int]]:
        """Row indices by ascending count of tokens to compute, cut into batches of at most
        ``batch_size`` rows whose padded cost (rows x the largest count, what one forward
        computes) stays within ``slack`` x the sum of their counts."""
        out: list[list[int]] = []
        rows: list[int] = []
        total = 0
        for i in sorted(range(len(new)), key=new.__getitem__):
            padded = (len(rows) + 1) * new[i]
            if rows and (len(rows) >= self.batch_size or padded > slack * (total + new[i])):
                out.append(rows)
                rows, total = [], 0
            rows.append(i)
            total += new[i]
        return [*out, rows] if rows else out

    def _score_rows(
        self,
        prompts: list[list[int]],
        replies: list[list[int]],
        found: list[Match],
        return_hidden: bool,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Per row, the logits [G, V] that predict its reply (and the last-layer hidden state
        at its last prompt token): one forward over the columns [c0, W) of the left-padded
        sequences, on a cache holding each row's stored prefix for the columns before c0."""
        device = next(self.model.parameters()).device
        seqs = [p + r for p, r in zip(prompts, replies)]
        ids, mask = _left_pad(seqs, self.pad_id)
        width = ids.shape[1]
        pads = [width - len(s) for s in seqs]
        c0 = min(pad + m.length for pad, m in zip(pads, found))
        past = self._stored_cache(found, pads, c0, device, width) if c0 > 0 else None
        self.score_reused_tokens += sum(max(c0 - pad, 0) for pad in pads)
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        # Row u's reply is predicted by columns [W - 1 - G_u, W - 1): the ends align.
        need = max(len(r) for r in replies) + 1
        out = self.model(
            input_ids=ids[:, c0:].to(device),
            attention_mask=mask.to(device),
            position_ids=pos[:, c0:].to(device),
            past_key_values=past,
            use_cache=past is not None,
            logits_to_keep=need,
            output_hidden_states=return_hidden,
        )
        logits = out.logits.float()  # [B, need, V]: columns [W - need, W)
        z = [logits[u, need - 1 - len(r) : need - 1] for u, r in enumerate(replies)]
        h = None
        if return_hidden:
            cols = torch.tensor([width - 1 - len(r) - c0 for r in replies], device=device)
            h = features_at(out.hidden_states[-1], cols)
        return z, h

    def _generate_batch(
        self,
        encoded: list[Encoded],
        temperature: float,
        greedy: bool,
        seeds: Sequence[int] | None = None,
        tries: Sequence[TokenTrie | None] | None = None,
        keep: Sequence[bool] | None = None,
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        tries = list(tries) if tries is not None else [None] * len(encoded)
        order = list(range(len(encoded)))
        if greedy or seeds is not None:
            # Rows by prompt length, so rows with similar padding are neighbours (the banded
            # own-column attention of :mod:`.shared_attention`); a reply does not depend on its
            # row's place. Global-RNG draws would, so those batches keep the caller's order.
            order.sort(key=lambda i: len(encoded[i][0]))
        encoded = [encoded[i] for i in order]
        tries = [tries[i] for i in order]
        seeds = None if seeds is None else [seeds[i] for i in order]
        keep = [True] * len(encoded) if keep is None else [keep[i] for i in order]
        # Requests with one prompt share a row while their replies agree; seedless draws
        # depend on the row layout, so those batches keep a row per request.
        same = self.merge_duplicates and (greedy or seeds is not None)
        members = duplicate_rows([e[0] for e in encoded]) if same else None
        lead = [m[0] for m in members] if members else range(len(encoded))
        ids, mask, cache, shared = self._inputs(
            [encoded[i][0] for i in lead],
            device,
            [any(keep[i] for i in m) for m in members] if members else keep,
            len(encoded) if members else 0,
        )
        if members:  # a merged request's prompt tokens count as reused
            self.prompt_tokens += sum(len(encoded[i][0]) for m in members for i in m[1:])
        sampling = self._sampling(temperature, greedy, seeds, device)
        args = (self.model, ids, mask, cache, self.max_new_tokens, self.stop_ids, sampling, tries)
        start = 0 if shared is None else shared.shape[-2]
        with use_shared_prefix(self.model, shared) if shared is not None else nullcontext():
            replies = decode(
                *args, first_position=start, members=members, skip_forced=self.skip_forced
            )
        out: list[Generation] = [None] * len(encoded)  # type: ignore[list-item]
        for i, reply, (prompt, cut), trie in zip(order, replies, encoded, tries):
            out[i] = self._to_generation(reply, prompt, cut, trie)
        return out

    def _to_generation(
        self, reply: Decoded, prompt: list[int], cut: bool, trie: TokenTrie | None = None
    ) -> Generation:
        """A decoded reply (cut after its first stop token) with the sets C_j it was drawn
        from when the row was constrained."""
        stops = set(self.stop_ids)
        toks = reply.tokens
        allowed_ids = None if trie is None else trie.allowed_along(toks)
        return Generation(
            prompt_ids=prompt,
            token_ids=toks,
            logprobs=reply.logprobs,
            text=self.tokenizer.decode(toks, skip_special_tokens=True),
            finished=bool(toks) and toks[-1] in stops,
            prompt_truncated=cut,
            allowed_ids=allowed_ids,
        )


def duplicate_rows(prompts: Sequence[Sequence[int]]) -> list[list[int]] | None:
    """The requests of a batch grouped by prompt, in first-seen order: one decode row each
    (:func:`~.decode.decode`'s ``members``; a row's logits depend on its tokens only, so
    requests with other allowed replies share it too); None when all prompts differ."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(i)
    return list(groups.values()) if len(groups) < len(prompts) else None


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
            common = min(stem, _common_length(rows[order[j - 1]][0], nxt))
            if common - max(top, stored) < least:
                break
            stem, top, j = common, max(top, stored), j + 1
        if j - i >= 2:
            stems.append((seq[:stem], sorted(order[i:j])))
        i = j
    return stems


def _common_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix of ``a`` and ``b`` (binary search: slices compare in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plain_kv_layers(model: torch.nn.Module) -> bool:
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


class RowSeededSampler:
    """Samples row i of a batch from softmax(z_i / T) with row i's own random stream.

    Gumbel-max: y_i = argmax_v (z_iv / T + g_iv), g_iv = -log(-log u_iv), u_iv ~ U(0, 1) drawn
    from a generator seeded with ``seeds[i]``; y_i is then exactly a draw from softmax(z_i / T).
    Each call consumes one vocabulary-sized draw per row, so row i's k-th token depends only on
    (seeds[i], k) and its logits.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, device: torch.device) -> None:
        self.temperature = temperature
        self.generators = [
            torch.Generator(device=device).manual_seed(int(s) % 2**63) for s in seeds
        ]
        self.skipped = [0] * len(seeds)
        """Per stream, draws owed to positions skipped since its last draw (:meth:`skip`)."""

    def draw(self, scores: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """The sampled token id of each row of ``scores`` [A, V], [A]; ``rows``: the streams
        (indices into ``seeds``) of those rows, all of them in order when None."""
        vocab = scores.shape[-1]
        rows = range(len(self.generators)) if rows is None else rows
        gens = [self.generators[r] for r in rows]
        for r, g in zip(rows, gens):
            for _ in range(self.skipped[r]):
                torch.rand(vocab, generator=g, device=scores.device)
            self.skipped[r] = 0
        u = torch.stack([torch.rand(vocab, generator=g, device=scores.device) for g in gens])
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        return (scores.float() / self.temperature + gumbel).argmax(-1)

    def skip(self, rows: Sequence[int], n: int) -> None:
        """The streams of ``rows`` past ``n`` more positions whose token was forced: their
        draws are made (and dropped) by the row's next :meth:`draw`, which knows the
        vocabulary size, so the k-th drawn token still uses the stream's k-th draw."""
        for r in rows:
            self.skipped[r] += n
