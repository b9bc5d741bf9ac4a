"""Monte-Carlo continuations from restored intermediate states (DESIGN section 5).

Checkpoint rule. Only intermediate states x_t with 0 < t < T carry a learned value (V~(x_0) and
V~(x_T) are fixed by the convention), so checkpoints are drawn from t in {1, ..., T-1}:

* T >= 4: that range is split into B contiguous chunks (for B = 2: the first floor(T/2) actions
  {1..floor(T/2)} and the rest) and one checkpoint is drawn uniformly from each non-empty chunk;
* 2 <= T < 4: one checkpoint, at the midpoint floor(T/2);
* T = 1: none.

From each checkpoint the environment is restored (reset + replay, observations checked), then M
continuations run under the frozen behaviour policy (temperature 1.0 by default) for at most
``horizon`` (15) further turns or until the episode ends, all batched together through the same
runner as the root rollouts. Each continuation's terminal outcome, mapped to the scale of
r_{T-1} (the convention's terminal reward), is one Monte-Carlo target for V(x_t).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .runner import Episode, RolloutRunner, Start


def select_checkpoints(num_actions: int, budget: int, rng: random.Random) -> list[int]:
    """Checkpoint turns t (restore to the state before action t) for a T-action trajectory."""
    t_total = num_actions
    if t_total < 2 or budget < 1:
        return []
    if t_total < 4:
        return [t_total // 2]
    chunks = np.array_split(np.arange(1, t_total), budget)
    return [int(rng.choice(list(c))) for c in chunks if len(c)]


@dataclass(frozen=True)
class Checkpoint:
    episode: int
    """Index of the root episode."""
    turn: int
    """t: the state x_t before action t."""


@dataclass
class ContinuationResult:
    checkpoints: list[Checkpoint]
    episodes: list[Episode]
    """M continuation episodes per checkpoint, in checkpoint order."""
    targets: list[float]
    """Monte-Carlo target of each continuation (scale of r_{T-1})."""
    checkpoint_of: list[int]
    """Index into ``checkpoints`` of each continuation."""
    interactions: int
    """Environment steps taken by the policy in continuations."""
    replay_steps: int
    """Environment steps spent replaying prefixes to restore states."""
    failed: int
    """Continuations that could not start (failed restore, engine crash)."""


def terminal_target(
    outcome: float,
    convention: str,
    group_stats: tuple[float, float] | None,
    eps: float = 1e-8,
    min_std: float = 1e-6,
) -> float:
    """A continuation's outcome on the scale of r_{T-1} under ``convention``.

    leave-one-out / raw: r_{T-1} = G, so the target is G. group-standardize: r_{T-1} = A^seq =
    (G~ - mean_g) / (std_g + eps) with the root group's mean and std (0 when std < min_std).
    """
    if convention == "group-standardize":
        if group_stats is None:
            raise ValueError("group-standardize targets need the root group's (mean, std)")
        mean, std = group_stats
        return 0.0 if std < min_std else (outcome - mean) / (std + eps)
    return outcome


def run_continuations(
    runner: RolloutRunner,
    roots: Sequence[Episode],
    convention: str,
    budget: int = 2,
    per_checkpoint: int = 4,
    horizon: int = 15,
    temperature: float = 1.0,
    seed: int = 0,
    on_turn: Callable[[int, int], None] | None = None,
) -> ContinuationResult:
    """B checkpoints per root trajectory (``budget``), M continuations each (``per_checkpoint``)."""
    rng = random.Random(seed)
    checkpoints: list[Checkpoint] = []
    for i, ep in enumerate(roots):
        if ep.error is None:
            checkpoints += [
                Checkpoint(i, t) for t in select_checkpoints(len(ep.turns), budget, rng)
            ]
    starts: list[Start] = []
    owner: list[int] = []
    for c, cp in enumerate(checkpoints):
        ep = roots[cp.episode]
        for _ in range(per_checkpoint):
            starts.append(
                Start(
                    instance_id=ep.start.instance_id,
                    group=ep.start.group,
                    prefix_actions=ep.actions[: len(ep.start.prefix_actions) + cp.turn],
                    prefix_observations=ep.observations[
                        : len(ep.start.prefix_actions) + cp.turn + 1
                    ],
                    max_turns=horizon,
                )
            )
            owner.append(c)
    steps0, replay0 = runner.env_steps, runner.replay_steps
    conts = runner.run(starts, temperature=temperature, seed=seed, on_turn=on_turn)
    stats = _group_stats(roots) if convention == "group-standardize" else {}
    targets = []
    for ep in conts:
        value = ep.outcome.outcome if ep.outcome is not None else 0.0
        targets.append(terminal_target(value, convention, stats.get(ep.start.group)))
    return ContinuationResult(
        checkpoints=checkpoints,
        episodes=conts,
        targets=targets,
        checkpoint_of=owner,
        interactions=runner.env_steps - steps0,
        replay_steps=runner.replay_steps - replay0,
        failed=sum(ep.start_failed for ep in conts),
    )


def _group_stats(roots: Sequence[Episode]) -> dict[int, tuple[float, float]]:
    """(mean, population std) of the root outcomes G~ of each group."""
    by: dict[int, list[float]] = {}
    for ep in roots:
        by.setdefault(ep.start.group, []).append(ep.outcome.outcome if ep.outcome else 0.0)
    out = {}
    for g, xs in by.items():
        mean = sum(xs) / len(xs)
        out[g] = (mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)))
    return out
