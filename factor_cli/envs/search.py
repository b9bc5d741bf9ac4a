"""Deterministic gold plays: a seeded breadth-first search for a winning plan, verified.

Some engines draw their gold paths from an unseeded generator (TextWorldExpress 1.1.0's coin and
twc gold agents call ``new scala.util.Random()``), so the same instance yields a different gold
path in every call and every process, and so does any model trained on them. This search
depends only on the instance, the engine's (deterministic) transitions and a seed.

Breadth-first over states, one segment at a time: from the current state, search for the
nearest state that wins or has a higher score than the current one, commit to the actions that
reach it, and repeat until the game is won. With one reward at the end (coin) the plan is a
shortest winning plan; with subgoal scores (twc: one point per item put away) it is a chain of
shortest segments, one per subgoal, which keeps the search polynomial where a search for the
whole plan at once is not (twc/0: over 20,000 states without a win; by segments, ~4 s).

- A node is an action prefix; its state is reached by :meth:`Environment.restore` (reset and
  replay, each replayed observation checked against the one recorded when the node was found:
  an engine that does not replay the same raises :class:`~factor_cli.envs.base.RestoreMismatch`).
- Children are the state's valid actions, sorted (so the engine's listing order does not
  matter), then shuffled by ``random.Random(f"{seed}/{instance_id}")``: the tie-break between
  equally short plans is seeded rather than alphabetical, so a model trained on many plans does
  not learn a preference the games do not have (e.g. "move east" first).
- A child whose state key was already seen in the segment is dropped (``look around``,
  ``inventory`` and moves back lead to known states): the search is over states, not prefixes.

The finished plan is played once more from a reset and must win (:func:`verify_plan`): a plan
that does not win is an error, never returned.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Hashable, Sequence

from .base import EnvError, Environment

StateKey = Callable[[], Hashable]
"""The current state's identity (e.g. room description, inventory, score, valid actions)."""


def observation_key(env: Environment) -> StateKey:
    """Default key: the last observation, the score and the sorted valid actions."""
    return lambda: (env.observations[-1], env.score, tuple(sorted(env.valid_actions())))


def search_plan(
    env: Environment,
    instance_id: str,
    *,
    seed: int = 0,
    key: StateKey | None = None,
    max_states: int = 20_000,
) -> list[str]:
    """A winning plan of ``instance_id`` made of shortest segments (module docstring), verified.

    Raises EnvError when a segment finds no better state within ``max_states`` distinct states
    or the turn limit. ``key`` defaults to :func:`observation_key`. The environment is left
    after the verifying play (``reset`` before playing).
    """
    key = key or observation_key(env)
    rng = random.Random(f"{seed}/{instance_id}")
    env.reset(instance_id)
    plan: list[str] = []
    recorded = list(env.observations)
    while not env.success:
        plan, recorded = _next_segment(env, instance_id, plan, recorded, rng, key, max_states)
    return verify_plan(env, instance_id, plan)


def _next_segment(
    env: Environment,
    instance_id: str,
    start: list[str],
    start_obs: list[str],
    rng: random.Random,
    key: StateKey,
    max_states: int,
) -> tuple[list[str], list[str]]:
    """Breadth-first from the state after ``start`` to the nearest win or higher score.

    ``start_obs`` are the observations recorded along ``start`` (replays are checked against
    them). Returns the extended plan and its observations; the engine is left at its end.
    """
    env.restore(instance_id, start, start_obs)
    score, seen = env.score, {key()}
    # Each frontier entry: (actions, observations recorded along them, valid actions there).
    frontier = deque([(start, start_obs, sorted(env.valid_actions()))])
    while frontier:
        prefix, recorded, valid = frontier.popleft()
        rng.shuffle(valid)
        for action in valid:
            env.restore(instance_id, prefix, recorded)
            env.step(action)
            if env.success or (env.score > score and not env.done):
                return [*prefix, action], list(env.observations)
            state = key()
            if env.done or state in seen:
                continue
            seen.add(state)
            if len(seen) > max_states:
                raise EnvError(
                    f"{env.spec.name}: no winning plan for {instance_id}: no state with a score "
                    f"above {score} within {max_states} states after {len(start)} actions"
                )
            frontier.append(
                ([*prefix, action], list(env.observations), sorted(env.valid_actions()))
            )
    raise EnvError(
        f"{env.spec.name}: no winning plan for {instance_id}: no state with a score above "
        f"{score} within {env.max_turns} turns ({len(seen)} states searched)"
    )


def verify_plan(env: Environment, instance_id: str, plan: Sequence[str]) -> list[str]:
    """``plan`` after playing it from a reset, if it wins; EnvError naming the instance if not."""
    env.reset(instance_id)
    for action in plan:
        if env.done:
            break
        env.step(action)
    if not env.success or len(env.actions) != len(plan):
        raise EnvError(
            f"{env.spec.name}: the gold plan for {instance_id} ({len(plan)} actions) does not "
            f"win: after {len(env.actions)} actions success={env.success}, score={env.score}"
        )
    return list(plan)
