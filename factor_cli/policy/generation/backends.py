"""Generation backends by name (``rollout.backend``): a registry of factories.

Every factory has the one signature of :class:`BackendFactory` and imports its implementation
when called, so this module needs neither torch nor vLLM: config validation reads
:data:`BACKEND_NAMES` at load time, and the optional ``vllm`` module is imported only when a
``vllm`` backend is actually built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from factor_cli.registry import Registry

from .base import DEFAULT_BATCH_SIZE, DEFAULT_MAX_CONTEXT, DEFAULT_MAX_NEW_TOKENS
from .hf_options import OPTION_NAMES

if TYPE_CHECKING:
    from ..model import Policy
    from .base import GenerationBackend


class BackendFactory(Protocol):
    """Build a backend for ``policy`` under the given limits; ``prefix_reuse``
    (``rollout.prefix_reuse``) keeps the KV of prompt prefixes already encoded (hf: its own
    prefix cache; vLLM: automatic prefix caching); ``options`` are the backend's own (e.g. vLLM
    engine options); a backend that takes none refuses any."""

    def __call__(
        self,
        policy: Policy,
        *,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_context: int = DEFAULT_MAX_CONTEXT,
        batch_size: int = DEFAULT_BATCH_SIZE,
        prefix_reuse: bool = True,
        **options: Any,
    ) -> GenerationBackend: ...


BACKENDS: Registry[BackendFactory] = Registry("generation backend")


@BACKENDS.register("hf")
def hf_backend(
    policy: Policy,
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_context: int = DEFAULT_MAX_CONTEXT,
    batch_size: int = DEFAULT_BATCH_SIZE,
    prefix_reuse: bool = True,
    **options: Any,
) -> GenerationBackend:
    """:class:`~factor_cli.policy.generation.hf.HFGenerator`; ``options`` are its switches
    (:data:`~.hf_options.OPTION_NAMES`, ``rollout.hf.*``)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(f"the hf generation backend has no option {', '.join(unknown)}; "
                         f"valid: {', '.join(OPTION_NAMES)}")  # fmt: skip
    from .hf import HFGenerator

    return HFGenerator(policy, max_new_tokens, max_context, batch_size, prefix_reuse, **options)


@BACKENDS.register("vllm")
def vllm_backend(
    policy: Policy,
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_context: int = DEFAULT_MAX_CONTEXT,
    batch_size: int = DEFAULT_BATCH_SIZE,
    prefix_reuse: bool = True,
    **options: Any,
) -> GenerationBackend:
    """:class:`~factor_cli.policy.generation.vllm.VLLMGenerator`; ``options`` are its
    ``rescore`` flag and ``vllm.LLM`` engine options."""
    from .vllm import VLLMGenerator

    return VLLMGenerator(
        policy, max_new_tokens, max_context, batch_size, prefix_reuse=prefix_reuse, **options
    )


BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS.names())
"""The valid ``rollout.backend`` values, importable without torch."""
