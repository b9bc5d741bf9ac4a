"""Tiny Llama shapes for CPU runs: ``factor model init-tiny`` builds them, configs name them.

Standard library only (transformers is imported when a preset builds its config), so config
validation can check ``model.init_tiny`` and the position limit without loading torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedTokenizerBase


@dataclass(frozen=True)
class TinyPreset:
    """A Llama-architecture shape; the vocabulary comes from the tokenizer."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False

    def config(self, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
        """The LlamaConfig with ``vocab_size = len(tokenizer)`` and its special token ids."""
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )

    def num_parameters(self, vocab_size: int) -> int:
        """Exact parameter count for a vocabulary of ``vocab_size`` (V), hidden H, MLP I, L layers:

        L * (4 H^2 + 3 H I + 2 H) + H + V H * (1 if tied else 2)

        (q, k, v, o projections without bias, gate/up/down MLP, two RMSNorms per layer, the
        final RMSNorm, input embedding and LM head).
        """
        h, i = self.hidden_size, self.intermediate_size
        per_layer = 4 * h * h + 3 * h * i + 2 * h
        embeddings = vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + h + embeddings


TINY_PRESETS: dict[str, TinyPreset] = {
    # ~0.99M parameters at the default 770-token vocabulary (792k in the blocks, 197k embeddings).
    "1m": TinyPreset(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=344),
    # ~5.1M parameters at 770 tokens; head dim 64. docs/design.md section 8: slower, not better
    # per hour.
    "5m": TinyPreset(hidden_size=256, num_layers=6, num_heads=4, intermediate_size=688),
}


def get_preset(name: str) -> TinyPreset:
    """The preset called ``name``; unknown names fail listing the valid ones."""
    if name not in TINY_PRESETS:
        raise ValueError(f"unknown tiny preset {name!r}; valid: {', '.join(TINY_PRESETS)}")
    return TINY_PRESETS[name]


def looks_like_path(s: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else is meant as a local path."""
    return (
        s.startswith(("/", "./", "../", "~", "."))
        or s.count("/") > 1
        or s.endswith("/")
        or (os.sep != "/" and os.sep in s)
    )
