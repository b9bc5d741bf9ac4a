"""Generation backends and token scoring.

- :mod:`.base`: the :class:`GenerationBackend` protocol every backend satisfies, its limits
  (the one home of the default ``max_new_tokens`` / ``max_context``), the meaning of ``seed=``,
  and the prompt encoding all backends share (standard library only);
- :mod:`.backends`: ``BACKENDS``, factories by name, and ``BACKEND_NAMES`` (no torch);
- :mod:`.hf`: the ``hf`` backend (our decode loop over a Hugging Face model), composed of its
  optimisations, one module each: :mod:`.prefix_reuse` over :mod:`.prefix_cache` (the bounded
  radix-tree cache of prompt-prefix KV), :mod:`.stems`, :mod:`.shared_attention`,
  :mod:`.scratch`, :mod:`.duplicates`, :mod:`.forced`; :mod:`.decode` is its decode loop and
  :mod:`.row_sampler` its per-reply random streams;
- :mod:`.vllm`: the ``vllm`` backend (vLLM's offline engine; vLLM itself is optional and is
  imported only when such a backend is built);
- :mod:`.scoring`: teacher-forced log-prob re-scoring (:func:`score_replies`) and the
  :class:`~.scoring.Scorer` the teacher's and value head's passes take;
- :mod:`.shared_prefix`: forwards through a batch's radix tree, each shared prefix encoded once
  (``score_replies(share_prefixes=True)``; pure torch);
- :mod:`.constrained`: valid-action decoding (the action token trie, the HF logits mask and
  the constrained log-probs both backends and the scorer share).

The modules import downward only (``backends`` -> ``hf`` / ``vllm`` -> ``scoring`` ->
``shared_prefix``, ``constrained``, ``prefix_cache``, ``base``), lazily where torch or vLLM
would load. Public names are re-exported here lazily too, so importing this package costs
nothing until a name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backends import BACKEND_NAMES, BACKENDS, BackendFactory
    from .base import (
        DEFAULT_BATCH_SIZE,
        DEFAULT_MAX_CONTEXT,
        DEFAULT_MAX_NEW_TOKENS,
        Generation,
        GenerationBackend,
        GenerationLimits,
        encode_prompts,
        request_seeds,
        stop_token_ids,
        truncate_middle,
    )
    from .hf import HFGenerator
    from .row_sampler import RowSeededSampler
    from .scoring import Scores, score_replies

_EXPORTS = {
    "BACKEND_NAMES": "backends",
    "BACKENDS": "backends",
    "BackendFactory": "backends",
    "DEFAULT_BATCH_SIZE": "base",
    "DEFAULT_MAX_CONTEXT": "base",
    "DEFAULT_MAX_NEW_TOKENS": "base",
    "Generation": "base",
    "GenerationBackend": "base",
    "GenerationLimits": "base",
    "encode_prompts": "base",
    "request_seeds": "base",
    "stop_token_ids": "base",
    "truncate_middle": "base",
    "HFGenerator": "hf",
    "RowSeededSampler": "row_sampler",
    "Scores": "scoring",
    "score_replies": "scoring",
}
__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_CONTEXT",
    "DEFAULT_MAX_NEW_TOKENS",
    "BackendFactory",
    "Generation",
    "GenerationBackend",
    "GenerationLimits",
    "HFGenerator",
    "RowSeededSampler",
    "Scores",
    "encode_prompts",
    "request_seeds",
    "score_replies",
    "stop_token_ids",
    "truncate_middle",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
