"""Environment text for training the tiny model's tokenizer.

One text per episode: the task description, the first observation, then each action as a
line ``> action`` followed by the environment's reply (the layout of the prompts' earlier
turns). Only training instances are read (TWX train seeds 0-999, ScienceWorld train
variations), so the tokenizer never sees evaluation text.

- TextWorldExpress: ``max_games`` plays, spread round-robin over four settings (coin with 3 and
  6 locations, cookingworld with 1 and 2 ingredients; no distractors, no doors). Cookingworld
  plays follow the gold path. Coin's gold agent walks with an unseeded random generator
  (``new scala.util.Random()`` in TWX 1.1.0's CoinGameGenerator), so its paths change from call
  to call; coin plays use :func:`coin_walk`, a deterministic depth-first exploration, instead.
  (The adapter's ``gold_actions`` is deterministic too now, a shortest plan by seeded search,
  but the corpus keeps its exploration walks: they show the back-and-forth of an agent that
  does not know where the coin is, and changing them would change the tokenizer and so every
  tiny model built from the default corpus.)
- ScienceWorld, when available: every task's description and first observation (one train
  variation each), plus ``scienceworld_games`` gold plays (default 0; ~3 s each). ScienceWorld
  gold paths and the order of listed items (e.g. "containing a, b") vary between processes, so
  gold plays make the corpus, and hence the tokenizer, irreproducible; measured: task
  descriptions and first observations are stable.

With ``scienceworld_games=0`` the corpus is identical for the same arguments, across processes
(at the defaults: 230 texts, 407,449 characters, ~9-12 s on 2 cores). An unavailable
environment is skipped; if none is available, EnvUnavailable says what is missing.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from contextlib import ExitStack
from typing import cast

from factor_cli.envs import EnvUnavailable, availability, make_env
from factor_cli.envs.base import Environment

_NO_CLUTTER = "numDistractorItems=0,includeDoors=0"
TWX_SETTINGS: tuple[tuple[str, str], ...] = (
    ("coin", f"numLocations=3,{_NO_CLUTTER}"),
    ("cookingworld", f"numLocations=1,numIngredients=1,{_NO_CLUTTER},limitInventorySize=0"),
    ("coin", f"numLocations=6,{_NO_CLUTTER}"),
    ("cookingworld", f"numLocations=2,numIngredients=2,{_NO_CLUTTER},limitInventorySize=0"),
)
"""(game, TWX parameters) the gold plays are drawn from, round-robin."""
TWX_TRAIN_SEEDS = range(0, 1000)
SW_LEVELS = ("L0", "L1", "L2")


def format_episode(task: str, observations: Sequence[str], actions: Sequence[str]) -> str:
    """``Task: ...``, the first observation, then ``> action`` and its reply for each action.

    ``observations[k]`` is the reply to ``actions[k - 1]``; ``observations[0]`` the first one.
    """
    lines = [f"Task: {task.strip()}", "", observations[0].strip()]
    for action, obs in zip(actions, observations[1:]):
        lines += [f"> {action}", obs.strip()]
    return "\n".join(lines)


def play_gold(env: Environment, instance_id: str) -> str:
    """Play the gold action sequence of ``instance_id`` and format the episode."""
    gold = env.gold_actions(instance_id)
    observations = [env.reset(instance_id)]
    task = env.task_description()
    actions: list[str] = []
    for action in gold:
        if env.done:
            break
        observations.append(env.step(action).observation)
        actions.append(action)
    return format_episode(task, observations, actions)


_ROOM = re.compile(r"You are in the ([^.]+)\.")
_EXITS = re.compile(r"To the (North|South|East|West) you see the ([^.]+)\.")
_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def coin_walk(env: Environment, instance_id: str, max_steps: int = 60) -> str:
    """Play a coin game deterministically and format the episode.

    Depth-first search over rooms: take the coin as soon as ``take coin`` is valid; otherwise
    move to the first unvisited neighbour (directions in alphabetical order) or step back the
    way we came. Like the gold agent's walk it is an exploration, not a shortest path.
    """
    observations = [env.reset(instance_id)]
    task = env.task_description()
    actions: list[str] = []

    def act(action: str) -> None:
        actions.append(action)
        observations.append(env.step(action).observation)

    def room(obs: str) -> str:
        m = _ROOM.search(obs)
        return m.group(1) if m else obs.splitlines()[0]

    visited, back = {room(observations[0])}, []
    while not env.done and len(actions) < max_steps:
        valid = set(env.valid_actions())
        if "take coin" in valid:
            act("take coin")
            continue
        exits = sorted((d.lower(), r) for d, r in _EXITS.findall(observations[-1]))
        fresh = [(d, r) for d, r in exits if r not in visited and f"move {d}" in valid]
        if fresh:
            direction, name = fresh[0]
            act(f"move {direction}")
            visited.add(name)
            back.append(_OPPOSITE[direction])
        elif back:
            act(f"move {back.pop()}")
        else:
            break
    return format_episode(task, observations, actions)


def twx_texts(max_games: int, rng: random.Random) -> list[str]:
    """``max_games`` TWX plays (coin: :func:`coin_walk`, cookingworld: gold path) on distinct
    train seeds per setting."""
    per_setting = [len(range(k, max_games, len(TWX_SETTINGS))) for k in range(len(TWX_SETTINGS))]
    texts: list[str] = []
    # All adapters stay open until the end: closing the last one stops the shared JVM, and a
    # restart per setting would cost ~1.5 s each.
    with ExitStack() as stack:
        for (game, params), n in zip(TWX_SETTINGS, per_setting):
            if n == 0:
                continue
            env = stack.enter_context(make_env("twx", params={game: params}))
            play = coin_walk if game == "coin" else play_gold
            for seed in rng.sample(TWX_TRAIN_SEEDS, n):
                texts.append(play(env, f"{game}/{seed}"))
    return texts


def scienceworld_texts(gold_games: int, rng: random.Random) -> list[str]:
    """Each task's description and first observation, plus ``gold_games`` gold plays."""
    from factor_cli.envs.scienceworld import ScienceWorldEnv, task_names

    texts: list[str] = []
    with make_env("scienceworld") as opened:
        env = cast(ScienceWorldEnv, opened)
        for task in task_names():
            # Variation 0 is a train variation of every task (scienceworld 1.2.3, checked); asking
            # for the variation lists of all 30 tasks would cost ~4 s more.
            obs = env.reset(f"{task}/L0/0")
            texts.append(format_episode(env.task_description(), [obs], []))
        for task in rng.sample(task_names(), min(gold_games, len(task_names()))):
            variation = rng.choice(env.variations(task)["train"])
            texts.append(play_gold(env, f"{task}/{rng.choice(SW_LEVELS)}/{variation}"))
    return texts


def environment_corpus(
    max_games: int = 200, seed: int = 0, scienceworld_games: int = 0
) -> list[str]:
    """Tokenizer training text from the available environments (module docstring).

    Reproducible across processes unless ``scienceworld_games > 0``.
    """
    if max_games < 0 or scienceworld_games < 0:
        raise ValueError(
            f"max_games ({max_games}) and scienceworld_games ({scienceworld_games}) must be >= 0"
        )
    rng = random.Random(seed)
    texts: list[str] = []
    missing = {name: availability(name) for name in ("twx", "scienceworld")}
    if missing["twx"] is None:
        texts += twx_texts(max_games, rng)
    if missing["scienceworld"] is None:
        texts += scienceworld_texts(scienceworld_games, rng)
    if not texts:
        why = "; ".join(f"{k}: {v}" for k, v in missing.items() if v)
        raise EnvUnavailable(
            f"no environment text for the tokenizer corpus ({why or 'max_games is 0'}); "
            "install an environment or pass texts explicitly"
        )
    return texts
