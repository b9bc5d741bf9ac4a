"""The generation backend a training config asks for (``rollout.*``), built in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from factor_cli.policy.generation.backends import BACKENDS

if TYPE_CHECKING:
    from factor_cli.policy.generation.base import GenerationBackend
    from factor_cli.policy.model import Policy

    from .config import RolloutConfig


def make_backend(rollout: RolloutConfig, policy: Policy) -> GenerationBackend:
    """``rollout.backend`` for ``policy`` with the section's limits, prefix reuse and the
    backend's own options (hf: ``rollout.hf``)."""
    return BACKENDS.get(rollout.backend)(
        policy,
        max_new_tokens=rollout.max_new_tokens,
        max_context=rollout.max_context,
        prefix_reuse=rollout.prefix_reuse,
        **rollout.backend_options(),
    )
