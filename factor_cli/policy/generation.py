"""Generation backends and token scoring.

Backends (``BACKENDS``) turn a batch of prompts into sampled replies with the behaviour
log-prob of every sampled token:

    log mu(y_j | x, y_<j) = log softmax(z_j / T)[y_j]

with z the model's logits and T the sampling temperature (greedy decoding scores at T = 1).
Sampling uses the full distribution (no top-k / top-p), so these are the exact probabilities of
the tokens drawn. :func:`score_replies` recomputes the same quantity with one teacher-forced
forward pass (for the trainer, the teacher, and to check a backend).

Context limits: a prompt longer than ``max_context - max_new_tokens`` tokens keeps its first
quarter and its last three quarters of that budget (middle-out), so the instructions and the
current observation survive; replies stop at ``max_new_tokens``. Neither ever raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from factor_cli.credit.registry import Registry

from .prompting import ACTION_CLOSE

BACKENDS: Registry[type] = Registry("generation backend")


@dataclass(frozen=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    """Generated tokens, up to and including the stop token when one was produced."""
    logprobs: list[float]
    """Behaviour log-prob of each generated token."""
    text: str
    finished: bool
    """Stopped by a stop token (False: cut at max_new_tokens)."""
    prompt_truncated: bool = False


def truncate_middle(ids: list[int], budget: int) -> tuple[list[int], bool]:
    """Keep the first budget//4 and the last budget - budget//4 tokens of an over-long prompt."""
    if len(ids) <= budget:
        return ids, False
    head = budget // 4
    return ids[:head] + ids[len(ids) - (budget - head) :], True


def encode_prompts(
    tokenizer: object, prompts: Sequence[str], max_context: int, max_new_tokens: int
) -> list[tuple[list[int], bool]]:
    """(token ids, truncated?) of each prompt, middle-out truncated to the prompt budget
    ``max_context - max_new_tokens``; shared by every backend so they see the same context."""
    budget = max_context - max_new_tokens
    encode = tokenizer.encode  # type: ignore[attr-defined]
    return [truncate_middle(encode(p, add_special_tokens=False), budget) for p in prompts]


def stop_token_ids(tokenizer: object) -> list[int]:
    """eos, plus ``</action>`` when it is a single token (replies end after the action)."""
    ids = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.append(int(eos))
    close = tokenizer.encode(ACTION_CLOSE, add_special_tokens=False)  # type: ignore[attr-defined]
    if len(close) == 1:
        ids.append(int(close[0]))
    return ids


def _left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


@BACKENDS.register("hf")
class HFGenerator:
    """Batched ``generate`` with a KV cache over all active environments in one call per turn."""

    def __init__(
        self,
        policy: object,
        max_new_tokens: int = 512,
        max_context: int = 4096,
        batch_size: int = 128,
    ) -> None:
        if max_new_tokens >= max_context:
            raise ValueError(
                f"max_new_tokens ({max_new_tokens}) must be < max_context ({max_context})"
            )
        self.model = policy.model  # type: ignore[attr-defined]
        self.tokenizer = policy.tokenizer  # type: ignore[attr-defined]
        self.max_new_tokens, self.max_context, self.batch_size = (
            max_new_tokens,
            max_context,
            batch_size,
        )
        self.stop_ids = stop_token_ids(self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_ids[0])

    def encode(self, prompts: Sequence[str]) -> list[tuple[list[int], bool]]:
        return encode_prompts(self.tokenizer, prompts, self.max_context, self.max_new_tokens)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample (or greedily decode) one reply per prompt.

        ``seeds[i]`` gives reply i its own random stream (:class:`RowSeededSampler`), so what it
        draws does not depend on the rest of the batch: the same episode samples the same reply
        whether it runs alone, in a larger batch, or on another data-parallel rank. Without
        ``seeds``, ``seed`` seeds torch's global generator for the whole batch.
        """
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts")
        if seed is not None:
            torch.manual_seed(seed)
        encoded = self.encode(prompts)
        out: list[Generation] = []
        for lo in range(0, len(encoded), self.batch_size):
            out += self._generate_batch(
                encoded[lo : lo + self.batch_size],
                temperature,
                greedy,
                None if seeds is None else seeds[lo : lo + self.batch_size],
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

    def _generate_batch(
        self,
        encoded: list[tuple[list[int], bool]],
        temperature: float,
        greedy: bool,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        prompts = [e[0] for e in encoded]
        distinct: dict[tuple[int, ...], int] = {}
        rows = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts])
        device = next(self.model.parameters()).device
        kwargs: dict = (
            dict(do_sample=False)
            if greedy
            else dict(
                do_sample=True,
                temperature=float(temperature),
                top_k=0,
                top_p=1.0,
            )
        )
        if seeds is not None and not greedy:
            from transformers import LogitsProcessorList

            # The sampler draws the token itself (temperature included); HF's own draw then
            # has a single candidate, so its global-RNG multinomial changes nothing.
            kwargs["temperature"] = 1.0
            kwargs["logits_processor"] = LogitsProcessorList(
                [RowSeededSampler(seeds, float(temperature), device)]
            )
        if len(distinct) < len(prompts) and min(len(p) for p in prompts) > 1:
            uniq_ids, uniq_mask = _left_pad([list(p) for p in distinct], self.pad_id)
            uniq_ids, uniq_mask = uniq_ids.to(device), uniq_mask.to(device)
            kwargs["past_key_values"] = self._shared_prefix_cache(uniq_ids, uniq_mask, rows)
            ids, mask = uniq_ids[rows.to(device)], uniq_mask[rows.to(device)]
        else:
            ids, mask = _left_pad(prompts, self.pad_id)
            ids, mask = ids.to(device), mask.to(device)
        res = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
        new = res.sequences[:, ids.shape[1] :].cpu()  # [B, G]
        scale = 1.0 if greedy else float(temperature)
        logits = torch.stack(res.logits, dim=1).float().cpu() / scale  # [B, G, V]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        gens = []
        stops = set(self.stop_ids)
        for b, (prompt, cut) in enumerate(encoded):
            toks = new[b].tolist()
            end, finished = len(toks), False
            for j, t in enumerate(toks):
                if t in stops:
                    end, finished = j + 1, True
                    break
            toks = toks[:end]
            gens.append(
                Generation(
                    prompt_ids=prompt,
                    token_ids=toks,
                    logprobs=logp[b, :end].tolist(),
                    text=self.tokenizer.decode(toks, skip_special_tokens=True),
                    finished=finished,
                    prompt_truncated=cut,
                )
            )
        return gens


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


@dataclass
class Scores:
    logprobs: list[torch.Tensor]
    """Per reply, log pi(y_j | x, y_<j) at temperature T, shape [G_i] (carries grad if asked)."""
    boundary_hidden: torch.Tensor | None
    """Last-layer hidden state at each prompt's last token (the boundary before the reply),
    [B, H]."""
    logits: list[torch.Tensor] | None
    """Per reply, the next-token logits at each reply position, [G_i, V]."""


def score_replies(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_grad: bool = False,
    return_hidden: bool = False,
    return_logits: bool = False,
) -> Scores:
    """Teacher-forced log-probs of ``replies[i]`` after ``prompts[i]``, one right-padded forward."""
    seqs = [list(p) + list(r) for p, r in zip(prompts, replies)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    device = next(model.parameters()).device
    ctx = torch.enable_grad() if with_grad else torch.no_grad()
    with ctx:
        out = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            output_hidden_states=return_hidden,
        )
        logits = out.logits.float() / temperature  # [B, W, V]
        logps, all_logits = [], []
        for i, (p, r) in enumerate(zip(prompts, replies)):
            pos = slice(len(p) - 1, len(p) - 1 + len(r))  # logits at t predict token t + 1
            z = logits[i, pos]
            target = torch.tensor(list(r), dtype=torch.long, device=z.device)
            logps.append(F.log_softmax(z, dim=-1).gather(-1, target[:, None]).squeeze(-1))
            if return_logits:
                all_logits.append(z)
        hidden = None
        if return_hidden:
            last = torch.tensor([len(p) - 1 for p in prompts], device=device)
            hidden = out.hidden_states[-1][torch.arange(len(prompts), device=device), last].detach()
    return Scores(
        logprobs=logps, boundary_hidden=hidden, logits=all_logits if return_logits else None
    )


from . import vllm_backend  # noqa: E402,F401  (registers "vllm"; vllm itself loads lazily)
