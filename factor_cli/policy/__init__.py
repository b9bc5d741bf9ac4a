"""Policy: model and tokenizer loading, the tiny CPU model, generation, the value head.

Public names are re-exported lazily, so importing a submodule (e.g. ``prompting``) does not pay
for importing transformers' model classes (~10 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import Policy, init_tiny, load_policy, train_tokenizer
    from .presets import TINY_PRESETS
    from .value_head import (
        TargetValueHead,
        ValueHead,
        ValueReplayBuffer,
        fit_value_head,
        make_value_optimizer,
        polyak_update,
    )

_EXPORTS = {
    "TINY_PRESETS": "presets",
    "Policy": "model",
    "init_tiny": "model",
    "load_policy": "model",
    "train_tokenizer": "model",
    "TargetValueHead": "value_head",
    "ValueHead": "value_head",
    "ValueReplayBuffer": "value_head",
    "fit_value_head": "value_head",
    "make_value_optimizer": "value_head",
    "polyak_update": "value_head",
}
__all__ = [
    "TINY_PRESETS",
    "Policy",
    "TargetValueHead",
    "ValueHead",
    "ValueReplayBuffer",
    "fit_value_head",
    "init_tiny",
    "load_policy",
    "make_value_optimizer",
    "polyak_update",
    "train_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
