"""What every generation backend is: the :class:`GenerationBackend` protocol, its limits, and
the prompt encoding they share so that every backend sees exactly the same context.

A backend turns a batch of prompts into sampled replies with the behaviour log-prob of every
sampled token,

    log mu(y_j | x, y_<j) = log softmax(z_j / T)[y_j]

with z the model's logits and T the sampling temperature (greedy decoding scores at T = 1).
Sampling uses the full distribution (no top-k / top-p), so these are the exact probabilities of
the tokens drawn. Under valid-action decoding (``allowed``) the distribution is that softmax
renormalised over the tokens the current admissible actions allow (:mod:`.constrained`).

Context limits (:class:`GenerationLimits`): a prompt longer than ``max_context -
max_new_tokens`` tokens keeps its first quarter and its last three quarters of that budget
(middle-out), so the instructions and the current observation survive; replies stop at
``max_new_tokens``. Neither ever raises.

Standard library only (torch is imported by the backends themselves), so config validation can
read :data:`DEFAULT_MAX_NEW_TOKENS` and friends without loading torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..prompting import ACTION_CLOSE

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from ..model import Policy
    from .scoring import Scores

DEFAULT_MAX_NEW_TOKENS = 512
"""Reply length limit (tokens) when none is given: room for reasoning plus one action."""
DEFAULT_MAX_CONTEXT = 4096
"""Prompt + reply limit (tokens) when none is given: a 7B backbone's usual training context."""
DEFAULT_BATCH_SIZE = 128
"""Prompts per forward batch (HF) or concurrent sequences (vLLM): one RL step's roots."""

SEED_MODULUS = 2**63
"""Seeds are reduced modulo 2^63: torch generators and vLLM take non-negative int64 seeds."""

Encoded = tuple[list[int], bool]
"""One encoded prompt: its token ids and whether middle-out truncation cut it."""


@dataclass(frozen=True)
class GenerationLimits:
    """Token limits of one backend, checked once here for every backend."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    max_context: int = DEFAULT_MAX_CONTEXT
    batch_size: int = DEFAULT_BATCH_SIZE

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_context", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_new_tokens >= self.max_context:
            raise ValueError(
                f"max_new_tokens ({self.max_new_tokens}) must be < max_context "
                f"({self.max_context}): the prompt needs room too"
            )

    @property
    def prompt_budget(self) -> int:
        """Tokens a prompt may keep: ``max_context - max_new_tokens`` (>= 1)."""
        return self.max_context - self.max_new_tokens


@dataclass(frozen=True)
class Generation:
    """One sampled reply and what it was sampled from."""

    prompt_ids: list[int]
    """The prompt's token ids as the model saw them (after middle-out truncation)."""
    token_ids: list[int]
    """Generated tokens, up to and including the stop token when one was produced."""
    logprobs: list[float]
    """Behaviour log-prob of each generated token."""
    text: str
    """The reply decoded without special tokens."""
    finished: bool
    """Stopped by a stop token (False: cut at max_new_tokens)."""
    prompt_truncated: bool = False
    allowed_ids: list[list[int]] | None = None
    """Under valid-action decoding (``allowed``), the token ids that were allowed at each
    generated position; the log-probs are renormalised over them. None: free decoding."""


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences of one type (binary search: slices
    compare in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def truncate_middle(ids: list[int], budget: int) -> tuple[list[int], bool]:
    """Keep the first budget//4 and the last budget - budget//4 tokens of an over-long prompt."""
    if len(ids) <= budget:
        return ids, False
    head = budget // 4
    return ids[:head] + ids[len(ids) - (budget - head) :], True


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], limits: GenerationLimits
) -> list[Encoded]:
    """(token ids, truncated?) of each prompt, middle-out truncated to ``limits.prompt_budget``;
    shared by every backend so they see the same context."""
    budget = limits.prompt_budget
    # A batch often repeats a prompt (a group's first turns, a checkpoint's continuations).
    ids = {p: tokenizer.encode(p, add_special_tokens=False) for p in dict.fromkeys(prompts)}
    return [truncate_middle(list(ids[p]), budget) for p in prompts]


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """eos, plus ``</action>`` when it is a single token (replies end after the action)."""
    ids = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.append(int(eos))
    close = tokenizer.encode(ACTION_CLOSE, add_special_tokens=False)
    if len(close) == 1:
        ids.append(int(close[0]))
    return ids


def request_seeds(n: int, seed: int | None, seeds: Sequence[int] | None) -> list[int] | None:
    """The seed of each of ``n`` replies: ``seeds[i]``, else ``seed + i``, else None (unseeded).

    This is what ``seed=`` / ``seeds=`` mean in every backend's :meth:`~GenerationBackend.generate`.
    """
    if seeds is not None:
        if len(seeds) != n:
            raise ValueError(f"seeds has {len(seeds)} entries for {n} prompts")
        return [int(s) % SEED_MODULUS for s in seeds]
    if seed is None:
        return None
    return [(int(seed) + i) % SEED_MODULUS for i in range(n)]


def check_temperature(temperature: float, greedy: bool) -> None:
    """Sampling needs T > 0 (greedy decoding ignores T)."""
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")


@runtime_checkable
class GenerationBackend(Protocol):
    """A batch of prompts in, one sampled reply with its behaviour log-probs per prompt out.

    Registered by name in :data:`~factor_cli.policy.generation.backends.BACKENDS`; the rollout
    runner, evaluation and the trainer use nothing else of a backend.
    """

    tokenizer: PreTrainedTokenizerBase
    """The policy's tokenizer (prompts are rendered and replies decoded with it)."""
    pad_id: int
    """Token id used to pad batches (the tokenizer's pad token, else the first stop token)."""
    limits: GenerationLimits
    copies_weights: bool
    """True when the backend samples with its own copy of the weights (vLLM), which
    :meth:`refresh` must reload after every update; False when it samples with the trainer's
    module itself (hf), so there is nothing to gather or copy."""
    last_logprob_gap: float | None
    """max |backend log-prob - trainer re-score| over the last :meth:`generate` call, when the
    backend samples with a copy of the model whose log-probs were re-scored (vLLM); None when
    it samples with the trainer's own forward (hf), where there is no gap to report."""

    def encode(self, prompts: Sequence[str]) -> list[Encoded]:
        """(token ids, truncated?) of each prompt, exactly as :meth:`generate` feeds them."""
        ...

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        replies: Sequence[Sequence[int]],
        temperature: float = 1.0,
        allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
        return_hidden: bool = False,
        return_logits: bool = False,
    ) -> Scores:
        """Teacher-forced log-probs of ``replies[i]`` after ``prompts[i]`` (token ids) under the
        trainer's current weights, no gradient, as :func:`.scoring.score_replies` computes them
        (and the last-layer hidden state at each prompt's last token, and the logits at each
        reply position): the teacher's and the value head's passes. A backend may start from
        KV it already holds (hf's prefix cache)."""
        ...

    def generate(
        self,
        prompts: Sequence[str],
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        allowed: Sequence[Sequence[str] | None] | None = None,
        keep: Sequence[bool] | None = None,
    ) -> list[Generation]:
        """Sample (or greedily decode) one reply per prompt.

        ``keep[i]`` False is a hint that nothing will score prompt i again (a continuation's
        turn): a backend with a prefix cache evicts its KV before the others' (hf); it changes
        no reply.

        ``allowed`` (valid-action decoding, :mod:`.constrained`): reply i must be
        ``<action>a</action>`` for one of the actions ``allowed[i]`` (free when ``allowed[i]``
        is None or empty); its log-probs are those of the constrained distribution, softmax
        renormalised over the tokens the action trie allows at each position, and
        :attr:`Generation.allowed_ids` records them. A length other than ``len(prompts)`` or an
        empty action is a one-line ValueError.

        Seeds (:func:`request_seeds`): reply i draws from its own random stream, seeded with
        ``seeds[i]`` when given, else with ``seed + i``; so what reply i draws depends only on
        its seed, its prompt and the weights, never on the other prompts of the batch, and a
        group of identical prompts still draws different replies. With neither, sampling is
        unseeded. Greedy decoding ignores both.
        """
        ...

    def refresh(self, model: torch.nn.Module | None = None) -> None:
        """Generate from ``model``'s current weights from now on (default: the model held).

        Called by the trainer after every update. A backend that samples with the model object
        itself (hf) only rebinds it; one that holds its own copy of the weights (vLLM) loads
        them into its engine.
        """
        ...

    def close(self) -> None:
        """Release what the backend started (engine processes, temporary files); idempotent."""
        ...


class TokenizedBackend:
    """What every backend shares: limits, tokenizer, stop and pad ids, prompt encoding.

    A concrete helper for implementations; the interface is :class:`GenerationBackend`.
    """

    last_logprob_gap: float | None = None
    copies_weights: bool = False

    def __init__(self, policy: Policy, limits: GenerationLimits) -> None:
        self.limits = limits
        self.model: torch.nn.Module = policy.model
        self.tokenizer: PreTrainedTokenizerBase = policy.tokenizer
        self.stop_ids = stop_token_ids(self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.stop_ids[0])

    @property
    def max_new_tokens(self) -> int:
        return self.limits.max_new_tokens

    @property
    def max_context(self) -> int:
        return self.limits.max_context

    @property
    def batch_size(self) -> int:
        return self.limits.batch_size

    def encode(self, prompts: Sequence[str]) -> list[Encoded]:
        """Token ids of each prompt, middle-out truncated to ``max_context - max_new_tokens``."""
        return encode_prompts(self.tokenizer, prompts, self.limits)

    def score(
        self,
        prompts: Sequence[Sequence[int]],
        replies: Sequence[Sequence[int]],
        temperature: float = 1.0,
        allowed: Sequence[Sequence[Sequence[int]] | None] | None = None,
        return_hidden: bool = False,
        return_logits: bool = False,
    ) -> Scores:
        """Teacher-forced scores under the trainer's model, no gradient (a
        :class:`~.scoring.Scorer`): the radix-tree forward, each shared prefix encoded once."""
        from .scoring import model_scorer

        return model_scorer(self.model, self.pad_id, share_prefixes=True)(
            prompts, replies, temperature, allowed, return_hidden, return_logits
        )
