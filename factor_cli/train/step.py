"""What the phases of one training step hand each other (:meth:`.trainer.Trainer.train_step`).

    rollout -> teacher, value features -> continuations -> value fit -> pack -> critic
            -> credit -> update -> refresh

Each phase takes and returns these frozen records, so a phase reads only what an earlier one
produced. The one piece of state that does not travel in them is the generation backend's
prefix cache: with ``hf`` and ``rollout.prefix_reuse`` the teacher and the value features
score the rollout's own prompts from the KV the rollout left there. :class:`ScoringSession`
makes that contract explicit: the rollout opens it, continuations played after the rollout
(``continuations.overlap=false``) and the refresh after the update close it, and scoring
through a closed session raises, so a reordering that would silently recompute every prompt
fails instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from factor_cli.policy.generation.scoring import Scorer
from factor_cli.rollout.runner import Episode

T = TypeVar("T")


class ScoringSession:
    """The scorer of the rollout's prompts, usable until something evicts or invalidates the
    prefix cache it reads (module docstring)."""

    def __init__(self, scorer: Scorer, cached: bool) -> None:
        self._scorer = scorer
        self.cached = cached
        """Whether it reads the backend's prefix cache (hf with prefix reuse); a session that
        does not (the trainer model's own forward) never closes."""
        self.closed_by: str | None = None

    @property
    def scorer(self) -> Scorer:
        if self.closed_by is not None:
            raise RuntimeError(
                f"the rollout's scoring session was closed by {self.closed_by}: the teacher "
                "and value-feature passes must run before it (they read the prefix cache the "
                "rollout filled)"
            )
        return self._scorer

    def close(self, by: str) -> None:
        """Mark the cache as gone (``by`` names what evicted or invalidated it)."""
        if self.cached and self.closed_by is None:
            self.closed_by = by


@dataclass(frozen=True)
class Rollout:
    """The step's root episodes that enter the batch, and what the rollout left behind."""

    step: int
    roots: list[Episode]
    """The usable roots, in packing order."""
    keys: list[int]
    """Each usable root's index in the rollout (it seeds its continuation draws)."""
    followed: list[list[Episode]] | None
    """Every rollout root's continuations when they overlapped the rollout, else None."""
    lost: int
    """Episodes cut short by an error (``episodes_lost``)."""
    session: ScoringSession


@dataclass(frozen=True)
class ValueFit:
    """The V(x_t) credit reads at every root state: V_target after this step's value update,
    or for Monte-Carlo methods the continuations' mean return V-hat (None for a method that
    reads neither), and the fit's (or the Monte-Carlo estimate's) metrics."""

    values: torch.Tensor | None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PhaseClock:
    """Wall-clock seconds per phase, as ``time_<phase>`` metrics; a phase timed twice adds."""

    times: dict[str, float] = field(default_factory=dict)

    def time(self, name: str, fn: Callable[[], T]) -> T:
        t0 = time.perf_counter()
        out = fn()
        key = f"time_{name}"
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - t0
        return out


def nonfinite_dropped(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics without NaN floats (a metric undefined at this step is left out)."""
    return {m: v for m, v in metrics.items() if not (isinstance(v, float) and v != v)}
