"""Monte-Carlo continuations from restored intermediate states (docs/design.md section 5.2).

Checkpoint rule (``support``; the state x_t is the one before action t, t = 0..T-1):

* ``paper`` (default): the paper's rule and the authors' code. For T >= 4, t in {0, ..., T-1} is
  split into B contiguous chunks [floor(iT/B), floor((i+1)T/B)) (for B = 2: the first floor(T/2)
  actions {0..floor(T/2)-1} and the rest) and one checkpoint is drawn uniformly from each
  non-empty chunk; for T < 4 one checkpoint at the midpoint floor(T/2) (T = 1: x_0).
* ``interior``: only states whose value credit reads, t in {1, ..., T-1}. V~(x_0) is fixed to
  the baseline b_i by the convention, so a continuation from x_0 calibrates a value the TD
  credit never uses (it still trains the shared head). For T >= 4, {1..T-1} is split into B
  contiguous chunks (numpy.array_split's rule; for B = 2: {1..floor(T/2)} and the rest), one
  draw from each; for 2 <= T < 4 the midpoint floor(T/2); for T = 1 none.
* ``every``: every state whose value credit reads, t in {1, ..., T-1}, whatever B (VinePPO's
  coverage: the methods whose values are the continuations' mean returns, ``vineppo`` and
  ``factor-mc``, choose it, with K = ``PER_STATE`` continuations per state; not a config choice).

What each costs: ``paper`` spends a fraction 1/floor(T/2) of the first chunk's draws (for
B = 2, T >= 4) and every T = 1 trajectory's budget on x_0, so fewer Monte-Carlo targets land on
states whose V~ the credit reads; ``interior`` never does, but differs from the paper's
published rule, so runs that must match the paper keep the default. Both spend the same
interactions per checkpoint.

From each checkpoint the environment is restored (reset + replay, observations checked), then M
continuations run under the frozen behaviour policy (temperature 1.0 by default) for at most
``horizon`` (15) further turns or until the episode ends, batched through the same runner as the
root rollouts: by default (``OVERLAP``) a root's continuations start as soon as it ends and share
the decode batches of the roots still running, which leaves fewer, fuller batches than playing
them after every root has ended, with the same episodes (:class:`ContinuationPlan`). Each
continuation's terminal outcome, mapped to the scale of r_{T-1} (the convention's terminal
reward), is one Monte-Carlo target for V(x_t).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .runner import Episode, Job, RolloutRunner, Start

# The one home of the continuation defaults (docs/design.md sections 4-5); `continuations.*` in the
# training config takes its defaults from here.
BUDGET = 2
"""B: checkpoints per root trajectory."""
PER_CHECKPOINT = 4
"""M: continuations per checkpoint."""
HORIZON = 15
"""Maximum further turns of one continuation."""
TEMPERATURE = 1.0
"""Sampling temperature of the frozen behaviour policy during continuations."""
OVERLAP = True
"""Play each root's continuations as soon as it ends, alongside the other roots."""
PER_STATE = 9
"""K: continuations from every interior state for Monte-Carlo values (VinePPO's K = 9)."""
SUPPORTS = ("paper", "interior", "every")
SUPPORT = "paper"
"""Which states checkpoints are drawn from (module docstring): the paper's rule by default."""
TURN_STRIDE = 1 << 16
"""Under ``every``, checkpoint turn t of a root seeds its own stream slot: turns stay below it."""


def select_checkpoints(
    num_actions: int, budget: int, rng: random.Random, support: str = SUPPORT
) -> list[int]:
    """Checkpoint turns t (restore to the state before action t) for a T-action trajectory."""
    if support not in SUPPORTS:
        raise ValueError(f"unknown checkpoint support {support!r}; valid: {', '.join(SUPPORTS)}")
    t_total = num_actions
    if support == "paper":
        return _paper_checkpoints(t_total, budget, rng)
    if support == "every":
        return list(range(1, t_total))
    if t_total < 2 or budget < 1:
        return []
    if t_total < 4:
        return [t_total // 2]
    turns = list(range(1, t_total))
    # numpy.array_split's rule: the first len % budget chunks hold one extra turn.
    size, extra = divmod(len(turns), budget)
    chunks, start = [], 0
    for i in range(budget):
        end = start + size + (1 if i < extra else 0)
        chunks.append(turns[start:end])
        start = end
    return [int(rng.choice(c)) for c in chunks if c]


def _paper_checkpoints(t_total: int, budget: int, rng: random.Random) -> list[int]:
    """The paper's rule: B chunks [floor(iT/B), floor((i+1)T/B)) of {0..T-1}, one draw each."""
    if t_total < 1 or budget < 1:
        return []
    if t_total < 4:
        return [t_total // 2]
    bounds = [i * t_total // budget for i in range(budget + 1)]
    return [rng.randrange(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


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


@dataclass(frozen=True)
class ContinuationPlan:
    """Which continuations a root trajectory gets, and how they sample: the checkpoints of
    root ``key`` are drawn from a stream of its own, seeded by (seed, key), and continuation m
    of its checkpoint j samples from reply stream (seed, (key * B + j) * M + m) (under the
    ``every`` support, which has up to T - 1 checkpoints whatever B, (key * 2^16 + j) * M + m,
    with M the plan's ``per_checkpoint``: K for Monte-Carlo values). A root's
    continuations therefore depend on that root alone, so they can start as soon as it ends,
    alongside the roots still running (``continuations.overlap``), or after every root has
    ended, and be the same episodes."""

    budget: int = BUDGET
    per_checkpoint: int = PER_CHECKPOINT
    horizon: int = HORIZON
    temperature: float = TEMPERATURE
    seed: int = 0
    support: str = SUPPORT

    def turns(self, key: int, root: Episode) -> list[int]:
        """The checkpoint turns of root ``key``; none for a root cut short by an error."""
        if root.error is not None:
            return []
        rng = random.Random(f"checkpoints:{self.seed}:{key}")
        return select_checkpoints(len(root.turns), self.budget, rng, self.support)

    def jobs(self, key: int, root: Episode) -> list[Job]:
        """M continuation jobs per checkpoint of root ``key``, in checkpoint order."""
        prefix, m = len(root.start.prefix_actions), self.per_checkpoint
        stride = TURN_STRIDE if self.support == "every" else self.budget
        turns = self.turns(key, root)
        if len(turns) > stride:
            raise ValueError(f"root {key}: {len(turns)} checkpoints exceed the stride {stride}")
        return [
            Job(
                Start(
                    instance_id=root.start.instance_id,
                    group=root.start.group,
                    prefix_actions=root.actions[: prefix + t],
                    prefix_observations=root.observations[: prefix + t + 1],
                    max_turns=self.horizon,
                ),
                key=(key * stride + j) * m + i,
                seed=self.seed,
                temperature=self.temperature,
                scored=False,  # the teacher and the value head read the roots' prompts only
            )
            for j, t in enumerate(turns)
            for i in range(m)
        ]

    def result(
        self,
        roots: Sequence[Episode],
        keys: Sequence[int],
        played: Sequence[Sequence[Episode]],
        convention: str,
    ) -> ContinuationResult:
        """The result over ``roots`` (root r has key ``keys[r]``) from the continuation
        episodes each one's :meth:`jobs` played (``played[r]``, in job order)."""
        checkpoints: list[Checkpoint] = []
        episodes: list[Episode] = []
        owner: list[int] = []
        for r, (key, root, conts) in enumerate(zip(keys, roots, played)):
            turns = self.turns(key, root)
            if len(conts) != len(turns) * self.per_checkpoint:
                raise ValueError(
                    f"root {key} has {len(conts)} continuations, its plan "
                    f"{len(turns) * self.per_checkpoint}"
                )
            for t in turns:
                owner += [len(checkpoints)] * self.per_checkpoint
                checkpoints.append(Checkpoint(r, t))
            episodes += conts
        return ContinuationResult(
            checkpoints=checkpoints,
            episodes=episodes,
            targets=continuation_targets(roots, episodes, convention),
            checkpoint_of=owner,
            interactions=sum(len(ep.turns) for ep in episodes),
            replay_steps=sum(
                len(ep.start.prefix_actions) for ep in episodes if not ep.start_failed
            ),
            failed=sum(ep.start_failed for ep in episodes),
        )


def run_continuations(
    runner: RolloutRunner,
    roots: Sequence[Episode],
    convention: str,
    budget: int = BUDGET,
    per_checkpoint: int = PER_CHECKPOINT,
    horizon: int = HORIZON,
    temperature: float = TEMPERATURE,
    seed: int = 0,
    on_turn: Callable[[int, int], None] | None = None,
    support: str = SUPPORT,
    keys: Sequence[int] | None = None,
) -> ContinuationResult:
    """B checkpoints per root trajectory (``budget``), M continuations each (``per_checkpoint``),
    drawn by the ``support`` rule (module docstring) and played after every root has ended.
    ``keys``: each root's index in its rollout (default 0, 1, ...), which seeds its draws
    (:class:`ContinuationPlan`)."""
    plan = ContinuationPlan(budget, per_checkpoint, horizon, temperature, seed, support)
    keys = list(range(len(roots))) if keys is None else list(keys)
    jobs = [plan.jobs(k, root) for k, root in zip(keys, roots)]
    played, _ = runner.play([j for js in jobs for j in js], on_turn=on_turn)
    bounds = list(itertools.accumulate((len(js) for js in jobs), initial=0))
    per_root = [played[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    return plan.result(roots, keys, per_root, convention)


def outcome_of(ep: Episode) -> float:
    """G of an episode; one that never finished (crash, failed restore) counts as 0."""
    return ep.outcome.outcome if ep.outcome is not None else 0.0


def continuation_targets(
    roots: Sequence[Episode], conts: Sequence[Episode], convention: str
) -> list[float]:
    """Each continuation's outcome on the scale of r_{T-1} (``credit.terminal_targets``), with
    the statistics of its root group where the convention needs them (group-standardize)."""
    # torch and the credit core load here, not at import: the training config takes its
    # `continuations.*` defaults from this module and must load without torch.
    import torch

    from factor_cli.credit import terminal_targets

    if not conts:
        return []
    dense = {g: i for i, g in enumerate(sorted({ep.start.group for ep in roots}))}
    targets = terminal_targets(
        convention,
        torch.tensor([outcome_of(ep) for ep in conts], dtype=torch.float64),
        torch.tensor([dense[ep.start.group] for ep in conts]),
        torch.tensor([outcome_of(ep) for ep in roots], dtype=torch.float64),
        torch.tensor([dense[ep.start.group] for ep in roots]),
    )
    return targets.tolist()
