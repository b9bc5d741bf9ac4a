"""factor: credit-conserving action-to-token allocation for multi-turn agent RL."""

__version__ = "0.1.0"
