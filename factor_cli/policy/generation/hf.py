"""The ``hf`` generation backend: Hugging Face ``generate`` with a KV cache, sampling with the
trainer's own model object (so its log-probs are the trainer's, and :meth:`refresh` only rebinds).

Seeded replies (the rollout runner always seeds them) are drawn by :class:`RowSeededSampler`, one
random stream per reply, so a reply does not depend on the batch it was generated in.

Valid-action decoding (``allowed``): :class:`~.constrained.TrieLogitsMask` masks each constrained
row to its action trie before the draw, and the reported log-probs are renormalised over the
same sets (:mod:`.constrained`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

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
from .constrained import Allowed, TokenTrie, TrieBuilder, TrieLogitsMask, constrained_logprobs

if TYPE_CHECKING:
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
    ) -> None:
        super().__init__(policy, GenerationLimits(max_new_tokens, max_context, batch_size))
        self.tries = TrieBuilder(self.tokenizer, self.stop_ids)

    def refresh(self, model: torch.nn.Module | None = None) -> None:
        """Sample with ``model`` from now on; nothing to copy, generation reads its weights."""
        if model is not None:
            self.model = model

    def close(self) -> None:
        """Nothing to release: the model belongs to the caller."""

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        allowed: Allowed = None,
    ) -> list[Generation]:
        """Sample (or greedily decode) one reply per prompt; seeds as
        :meth:`GenerationBackend.generate` says: reply i's stream is seeded by ``seeds[i]``, else
        ``seed + i`` (:class:`RowSeededSampler`); with neither, HF samples from torch's global
        generator. ``allowed``: valid-action decoding (:mod:`.constrained`)."""
        check_temperature(temperature, greedy)
        rows = request_seeds(len(prompts), seed, seeds)
        tries = self.tries.tries(allowed, len(prompts))
        encoded = self.encode(prompts)
        size = self.batch_size
        out: list[Generation] = []
        for lo in range(0, len(encoded), size):
            chunk = None if rows is None else rows[lo : lo + size]
            out += self._generate_batch(
                encoded[lo : lo + size], temperature, greedy, chunk, tries[lo : lo + size]
            )
        return out

    def _shared_prefix_cache(
        self, ids: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor
    ) -> object:
        """KV cache of each distinct prompt (all but its last token), computed once and then
        copied to every row that repeats it (e.g. the M continuations of one checkpoint)."""
        device = ids.device
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        out = self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=pos[:, :-1],
            use_cache=True,
        )
        cache = out.past_key_values
        for layer in cache.layers:
            layer.batch_select_indices(rows.to(device))
        return cache

    def _sampling_options(
        self,
        temperature: float,
        greedy: bool,
        seeds: Sequence[int] | None,
        device: torch.device,
        mask: TrieLogitsMask | None = None,
    ) -> dict[str, Any]:
        """``generate`` keyword arguments for greedy decoding or full-distribution sampling;
        ``mask`` (valid-action decoding) runs first, so every draw sees it."""
        processors: list[Any] = [] if mask is None else [mask]
        options: dict[str, Any] = {"do_sample": not greedy}
        if not greedy:
            options.update(temperature=float(temperature), top_k=0, top_p=1.0)
        if not greedy and seeds is not None:
            # The sampler draws the token itself (temperature included); HF's own draw then
            # has a single candidate, so its global-RNG multinomial changes nothing.
            options["temperature"] = 1.0
            processors.append(RowSeededSampler(seeds, float(temperature), device))
        if processors:
            from transformers import LogitsProcessorList

            options["logits_processor"] = LogitsProcessorList(processors)
        return options

    def _inputs(
        self, prompts: list[list[int]], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """(ids, mask) [B, W] on ``device``, plus a shared-prefix KV cache when prompts repeat."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts])
        if len(distinct) < len(prompts) and min(len(p) for p in prompts) > 1:
            uniq_ids, uniq_mask = _left_pad([list(p) for p in distinct], self.pad_id)
            uniq_ids, uniq_mask = uniq_ids.to(device), uniq_mask.to(device)
            cache = self._shared_prefix_cache(uniq_ids, uniq_mask, rows)
            rows = rows.to(device)
            return uniq_ids[rows], uniq_mask[rows], {"past_key_values": cache}
        ids, mask = _left_pad(prompts, self.pad_id)
        return ids.to(device), mask.to(device), {}

    def _generate_batch(
        self,
        encoded: list[Encoded],
        temperature: float,
        greedy: bool,
        seeds: Sequence[int] | None = None,
        tries: Sequence[TokenTrie | None] | None = None,
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        ids, mask, cache = self._inputs([e[0] for e in encoded], device)
        tries = list(tries) if tries is not None else [None] * len(encoded)
        trie_mask = TrieLogitsMask(tries, ids.shape[1]) if any(tries) else None
        res = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
            **cache,
            **self._sampling_options(temperature, greedy, seeds, device, trie_mask),
        )
        new = res.sequences[:, ids.shape[1] :].cpu()  # [B, G]
        scale = 1.0 if greedy else float(temperature)
        logits = torch.stack(res.logits, dim=1).float().cpu() / scale  # [B, G, V] raw, / T
        return [
            self._to_generation(new[b].tolist(), logits[b], prompt, cut, tries[b])
            for b, (prompt, cut) in enumerate(encoded)
        ]

    def _to_generation(
        self,
        toks: list[int],
        logits: torch.Tensor,
        prompt: list[int],
        cut: bool,
        trie: TokenTrie | None = None,
    ) -> Generation:
        """Cut a row of generated tokens [G] after its first stop token (padding follows it)
        and score it from its logits [G, V] (/ T): log softmax, renormalised over the trie's
        allowed sets when the row was constrained."""
        stops = set(self.stop_ids)
        end = next((j + 1 for j, t in enumerate(toks) if t in stops), len(toks))
        toks = toks[:end]
        allowed_ids = None if trie is None else trie.allowed_along(toks)
        return Generation(
            prompt_ids=prompt,
            token_ids=toks,
            logprobs=constrained_logprobs(logits[:end], toks, allowed_ids).tolist(),
            text=self.tokenizer.decode(toks, skip_special_tokens=True),
            finished=bool(toks) and toks[-1] in stops,
            prompt_truncated=cut,
            allowed_ids=allowed_ids,
        )


class RowSeededSampler:
    """Samples row i of a batch from softmax(z_i / T) with row i's own random stream.

    Gumbel-max: y_i = argmax_v (z_iv / T + g_iv), g_iv = -log(-log u_iv), u_iv ~ U(0, 1) drawn
    from a generator seeded with ``seeds[i]``; y_i is then exactly a draw from softmax(z_i / T).
    Each call consumes one vocabulary-sized draw per row, so row i's k-th token depends only on
    (seeds[i], k) and its logits. Used as a Hugging Face logits processor, it returns logits that
    allow only y_i (0 there, -inf elsewhere); ``output_logits`` still reports the raw logits.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, device: torch.device) -> None:
        self.temperature = temperature
        self.generators = [
            torch.Generator(device=device).manual_seed(int(s) % 2**63) for s in seeds
        ]

    def draw(self, scores: torch.Tensor) -> torch.Tensor:
        """The sampled token id of each row, [B]."""
        vocab = scores.shape[-1]
        u = torch.stack(
            [torch.rand(vocab, generator=g, device=scores.device) for g in self.generators]
        )
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        return (scores.float() / self.temperature + gumbel).argmax(-1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        pick = self.draw(scores)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, pick[:, None], 0.0)
