"""Environments behind one protocol (``base.Environment``), by name in ``ENVIRONMENTS``."""

from . import alfworld, scienceworld, twx, webshop  # noqa: F401  (registers the adapters)
from .base import (
    EnvCrashed,
    EnvError,
    Environment,
    EnvSpec,
    EnvUnavailable,
    Outcome,
    RestoreMismatch,
    Step,
    UnknownInstance,
)
from .registry import ENVIRONMENTS, availability, make_env

__all__ = [
    "ENVIRONMENTS",
    "EnvCrashed",
    "EnvError",
    "EnvSpec",
    "EnvUnavailable",
    "Environment",
    "Outcome",
    "RestoreMismatch",
    "Step",
    "UnknownInstance",
    "availability",
    "make_env",
]
