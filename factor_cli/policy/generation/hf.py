"""The ``hf`` generation backend: a Hugging Face model decoded with a KV cache by our own loop
(:func:`.decode.decode`: in-place KV buffers, finished rows leave the batch, draws from exactly
softmax(z / T) whatever the checkpoint's generation config says), sampling with the trainer's
own model object (so its log-probs are the trainer's, and :meth:`HFGenerator.refresh` only
rebinds).

Seeded replies (the rollout runner always seeds them) are drawn by
:class:`~.row_sampler.RowSeededSampler`, one random stream per reply, so a reply does not
depend on the batch it was generated in. Valid-action decoding (``allowed``): each constrained
row's logits are masked to its action trie's C_j before the draw, and the reported log-probs are
renormalised over the same sets (:mod:`.constrained`).

This module only composes the backend's optimisations; each is its own module behind a switch
(``rollout.prefix_reuse`` and ``rollout.hf.*``, defaults in :mod:`.hf_options`), on by default,
and gives the replies and log-probs of the plain path (its equivalence test in
``tests/policy``):

- :mod:`.prefix_reuse`: prompt KV kept across calls in a :mod:`.prefix_cache`, each prompt
  prefilling only what follows its longest stored prefix; scoring starts from it too;
- :mod:`.stems`: what several prompts of a batch share past the cache is prefilled once;
- :mod:`.shared_attention`: a prefix every row of a batch starts with is held and attended once
  (cascade attention, CPU);
- :mod:`.scratch`: the batches' gathered KV in memory reused from batch to batch (CPU);
- :mod:`.duplicates`: requests with the same prompt decode in one row while they agree;
- :mod:`.forced`: tokens an action trie forces skip the model where no logits are read.

What each saves is measured in the benchmarks (``docs/benchmarks.md``, Generation).
:attr:`HFGenerator.prefill_tokens` and :attr:`HFGenerator.reused_tokens` count the prompt tokens
computed and taken from earlier work, :attr:`HFGenerator.shared_prefix_tokens` those decoding read
from a prefix held once. Models whose cache layers are not plain full-attention
:class:`~transformers.DynamicLayer` (sliding windows) decode without reuse.
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
from .decode import Decoded, Sampling, buffer_cache, decode, left_pad
from .duplicates import duplicate_rows
from .hf_options import (
    MERGE_DUPLICATES,
    PREFIX_CACHE_BYTES,
    SHARED_PREFIX_MIN,
    SKIP_FORCED,
    STEM_MIN,
)
from .prefix_cache import Match, PrefixCache, kv_bytes_per_token
from .prefix_reuse import PrefixReuse, TokenCounts, cost_batches, plain_kv_layers
from .row_sampler import RowSeededSampler
from .scoring import Scores, reply_scores
from .shared_attention import use_shared_prefix

if TYPE_CHECKING:
    from transformers import DynamicCache

    from ..model import Policy


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
        """The switches, each documented in :mod:`.hf_options` and its own module:
        ``prefix_reuse`` (:mod:`.prefix_reuse`); ``prefix_cache_tokens``: the cache's bound in
        tokens (default: what :data:`PREFIX_CACHE_BYTES` holds, at most
        ``2 * batch_size * max_context``); ``shared_prefix_min`` (:mod:`.shared_attention`;
        None: never); ``stem_min`` (:mod:`.stems`; None: never); ``merge_duplicates``
        (:mod:`.duplicates`); ``skip_forced`` (:mod:`.forced`)."""
        super().__init__(policy, GenerationLimits(max_new_tokens, max_context, batch_size))
        self.tries = TrieBuilder(self.tokenizer, self.stop_ids)
        if prefix_cache_tokens is None:
            per_token = kv_bytes_per_token(self.model.config, self.model.dtype)
            prefix_cache_tokens = min(2 * batch_size * max_context, PREFIX_CACHE_BYTES // per_token)
        self.prefix_reuse = prefix_reuse and plain_kv_layers(self.model)
        self.counts = TokenCounts()
        self.reuse = PrefixReuse(
            prefix_cache_tokens, self.pad_id, batch_size, self.counts, shared_prefix_min, stem_min
        )
        self.merge_duplicates = merge_duplicates
        self.skip_forced = skip_forced

    @property
    def prefix_cache(self) -> PrefixCache:
        """The stored prompt-prefix KV (:mod:`.prefix_reuse`)."""
        return self.reuse.cache

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every reply generated so far."""
        return self.counts.prompt

    @property
    def prefill_tokens(self) -> int:
        """Of those, the tokens whose KV the backend computed."""
        return self.counts.prefill

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens whose KV was taken from earlier computation instead of prefilled."""
        return self.counts.prompt - self.counts.prefill

    @property
    def shared_prefix_tokens(self) -> int:
        """Prompt tokens decoding read from a prefix held once for the whole batch."""
        return self.counts.shared_prefix

    @property
    def score_reused_tokens(self) -> int:
        """Tokens :meth:`score` took from the prefix cache instead of encoding them."""
        return self.counts.score_reused

    def refresh(self, model: torch.nn.Module | None = None) -> None:
        """Sample with ``model`` from now on; nothing to copy, generation reads its weights.
        The prefix cache is dropped: its KV belong to the weights before the update."""
        if model is not None:
            self.model = model
        self.reuse.clear()

    def close(self) -> None:
        """Gives back the scratch memory; the model belongs to the caller."""
        self.reuse.scratch.clear()

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
        self.counts.prompt += sum(len(p) for p in prompts)
        if self.prefix_reuse:
            extra = self._decode_capacity(0)
            return self.reuse.inputs(self.model, prompts, device, extra, keep, room)
        distinct: dict[tuple[int, ...], int] = {}
        rows = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts])
        if len(distinct) < len(prompts) and min(len(p) for p in prompts) > 1:
            self.counts.prefill += sum(len(p) - 1 for p in distinct) + len(prompts)
            uniq_ids, uniq_mask = left_pad([list(p) for p in distinct], self.pad_id)
            uniq_ids, uniq_mask = uniq_ids.to(device), uniq_mask.to(device)
            cache = self._shared_prefix_cache(uniq_ids, uniq_mask, rows)
            rows = rows.to(device)
            return uniq_ids[rows], uniq_mask[rows], cache, None
        self.counts.prefill += sum(len(p) for p in prompts)
        ids, mask = left_pad(prompts, self.pad_id)
        cache = buffer_cache(self.model.config, self._decode_capacity(ids.shape[1]))
        return ids.to(device), mask.to(device), cache, None

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
        self.reuse.check_weights(self.model)
        found = [self.reuse.cache.match(p[:-1]) for p in prompts]
        new = [len(p) + len(r) - m.length for p, r, m in zip(prompts, replies, found)]
        logps: list[Any] = [None] * len(prompts)
        hidden: list[Any] = [None] * len(prompts)
        logits: list[Any] = [None] * len(prompts)
        for rows in cost_batches(new, self.batch_size):
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
        ids, mask = left_pad(seqs, self.pad_id)
        width = ids.shape[1]
        pads = [width - len(s) for s in seqs]
        c0 = min(pad + m.length for pad, m in zip(pads, found))
        past = (
            self.reuse.stored_cache(self.model, found, pads, c0, device, width) if c0 > 0 else None
        )
        self.counts.score_reused += sum(max(c0 - pad, 0) for pad in pads)
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
            self.counts.prompt += sum(len(encoded[i][0]) for m in members for i in m[1:])
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
