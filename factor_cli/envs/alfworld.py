"""ALFWorld adapter (``alfworld``): the real ALFWorld TextWorld engine, played offline.

An instance is one game folder (``traj_data.json`` + ``game.tw-pddl``, usually with the
``initial_state.pddl`` it was built from); its id is the folder's path relative to the data root,
e.g. ``json_2.1.1/valid_unseen/pick_heat_then_place_in_recep-Egg-None-Fridge-10/trial_T2019...``
for the official data or ``eval/pick_heat_then_place_in_recep-Egg-None-CounterTop-3/trial_...``
for a generated set (:mod:`factor_cli.envs.alfworld_gen`).

The data root is, in order: the ``data_root`` option; ``$ALFWORLD_DATA`` when it holds the
official ``json_2.1.1`` data or a generated set; ``~/.cache/alfworld`` (where ``alfworld-download``
puts the data) when it holds the official data; :data:`DEFAULT_GENERATED_ROOT` when it holds a
generated set. Official data wins over a generated set in the same folder.

The engine is ALFWorld's own: TextWorld's PDDL backend on the shipped ``alfred.pddl`` domain and
``alfred.twl2`` grammar, wrapped in ALFWorld's ``AlfredDemangler`` (object names such as
``apple 1``). A command that is not admissible is a no-op the engine answers with
"Nothing happens."; it is counted invalid. G_i = 1 when the PDDL goal holds, else 0. The engine has
no clone, so restore is reset + replay (the base class). ``import alfworld`` creates
``~/.cache/alfworld`` (ALFWorld's own side effect); it is imported only when a game is played.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
from functools import cache
from pathlib import Path
from typing import Any

from .base import EnvError, Environment, EnvSpec, EnvUnavailable, Step, UnknownInstance
from .registry import register

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""The six ALFWorld task types, in ALFWorld's own order (its TASK_TYPES 1-6): the categories."""

INSTALL = (
    "`pip install 'factor-cli[alfworld]'` (or `pip install alfworld==0.4.2`; it compiles, ~2 min)"
)
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"
PROBLEM_FILE = "initial_state.pddl"
INVALID_REPLY = "Nothing happens."

OFFICIAL_FOLDS = {"train": "json_2.1.1/train", "eval": "json_2.1.1/valid_unseen"}
"""Official data: where each of our folds comes from, relative to the data root."""
GENERATED_FOLDS = {"train": "train", "eval": "eval"}
"""Generated set: where each fold lives, relative to the data root."""
GENERATED_MARKER = "factor_alfworld_gen.json"
"""File at the root of a generated set recording how each fold was generated."""
DEFAULT_GENERATED_ROOT = Path(
    os.environ.get("FACTOR_ALFWORLD_GEN", "~/.cache/factor/alfworld-gen")
).expanduser()
"""Where ``factor envs alfworld-generate`` writes by default ($FACTOR_ALFWORLD_GEN overrides)."""

NO_DATA = (
    "no ALFWorld games found: set ALFWORLD_DATA to the official data (`alfworld-download`, needs "
    "internet) or generate games offline with `factor envs alfworld-generate` (writes "
    f"{DEFAULT_GENERATED_ROOT})"
)


# -- data layout ------------------------------------------------------------------------------
def data_kind(root: Path) -> str | None:
    """'official' if ``root`` holds ALFWorld's json_2.1.1 data, 'generated' if it holds a set
    written by :func:`factor_cli.envs.alfworld_gen.generate`, else None."""
    if (root / "json_2.1.1").is_dir():
        return "official"
    if (root / GENERATED_MARKER).is_file():
        return "generated"
    return None


def resolve_data_root(data_root: str | Path | None = None) -> Path:
    """The data root to play from (see the module docstring for the order); raises
    :class:`EnvUnavailable` naming the fix when there is none."""
    if data_root is not None:
        root = Path(data_root).expanduser()
        if data_kind(root) is None:
            raise EnvUnavailable(
                f"alfworld: {root} holds no ALFWorld games (neither json_2.1.1/ nor a generated "
                f"set with {GENERATED_MARKER}); run `factor envs alfworld-generate --out {root}`"
            )
        return root
    env_root = os.environ.get("ALFWORLD_DATA")
    if env_root and data_kind(Path(env_root).expanduser()):
        return Path(env_root).expanduser()
    cache_root = Path("~/.cache/alfworld").expanduser()
    if data_kind(cache_root) == "official":
        return cache_root
    if data_kind(DEFAULT_GENERATED_ROOT) == "generated":
        return DEFAULT_GENERATED_ROOT
    raise EnvUnavailable(f"alfworld: {NO_DATA}")


def fold_dir(root: Path, split: str) -> Path:
    """The folder of fold ``split`` ('train' | 'eval') under ``root``, official or generated."""
    folds = OFFICIAL_FOLDS if data_kind(root) == "official" else GENERATED_FOLDS
    if split not in folds:
        raise ValueError(f"alfworld split {split!r} is not one of {', '.join(folds)}")
    return root / folds[split]


def is_playable(game: Path) -> bool:
    """ALFWorld's own rule (``AlfredTWEnv.collect_game_files``): a folder with traj_data.json and a
    game file marked solvable, of one of the six task types, not a movable/sliced trajectory."""
    if "movable" in str(game) or "Sliced" in str(game):
        return False
    if not (game / TRAJ_FILE).is_file() or not (game / GAME_FILE).is_file():
        return False
    try:
        solvable = json.loads((game / GAME_FILE).read_text()).get("solvable")
        task_type = json.loads((game / TRAJ_FILE).read_text()).get("task_type")
    except (OSError, ValueError):
        return False
    return bool(solvable) and task_type in TASK_TYPES


def list_games(root: Path, split: str) -> list[str]:
    """Instance ids (paths relative to ``root``, '/'-separated, sorted) of the playable games of a
    fold; raises :class:`EnvUnavailable` when the fold folder is missing."""
    folder = fold_dir(root, split)
    if not folder.is_dir():
        raise EnvUnavailable(f"alfworld: {folder} does not exist; {NO_DATA}")
    games = sorted(p.parent for p in folder.rglob(TRAJ_FILE))
    return [g.relative_to(root).as_posix() for g in games if is_playable(g)]


def game_path(root: Path, instance_id: str) -> Path:
    """The folder of ``instance_id`` under ``root``; :class:`UnknownInstance` if it is not one."""
    parts = instance_id.split("/")
    if not instance_id or instance_id.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise UnknownInstance(
            f"alfworld instance {instance_id!r} is not a game folder path relative to the data "
            f"root (e.g. 'train/<task>/<trial>')"
        )
    game = root / instance_id
    if not (game / GAME_FILE).is_file() or not (game / TRAJ_FILE).is_file():
        raise UnknownInstance(
            f"alfworld has no game {instance_id!r} under {root} (expected {GAME_FILE} and "
            f"{TRAJ_FILE} in {game})"
        )
    return game


def task_type_of(game: Path) -> str:
    """The task type recorded in a game's traj_data.json (one of :data:`TASK_TYPES`)."""
    task_type = json.loads((game / TRAJ_FILE).read_text()).get("task_type")
    if task_type not in TASK_TYPES:
        raise EnvError(
            f"alfworld: {game / TRAJ_FILE} has task_type {task_type!r}, not one of "
            f"{', '.join(TASK_TYPES)}"
        )
    return str(task_type)


# -- the engine ---------------------------------------------------------------------------------
@cache
def shipped_logic() -> tuple[str, str]:
    """The PDDL domain and TWL2 grammar shipped with the alfworld package (alfred.pddl, .twl2)."""
    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise EnvUnavailable(f"alfworld is not installed: {INSTALL}")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()


def make_engine(facts: bool = False) -> Any:
    """A fresh ALFWorld engine: TextWorld's PddlEnv wrapped in ALFWorld's AlfredDemangler.

    ``facts``: also report the state's facts (ALFWorld's handcoded expert needs them).
    """
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from textworld.envs import PddlEnv

    infos = textworld.EnvInfos(admissible_commands=True, won=True, facts=facts)
    return AlfredDemangler(PddlEnv(infos), shuffle=False)


def task_from_intro(intro: str) -> str:
    """The goal sentence of an ALFWorld intro ('Your task is to: ...'), or '' if absent."""
    _, sep, task = intro.rpartition("Your task is to:")
    return task.strip() if sep else ""


@register("alfworld")
class AlfWorldEnv(Environment):
    spec = EnvSpec(
        name="alfworld",
        convention="leave-one-out",
        metric="macro success over the 6 task categories",
        feedback="the simulator's text reply to the action",
        max_turns=50,
        invalid_action="no-op: the engine replies 'Nothing happens.'; counted invalid",
        instance_format="{game folder relative to the data root}",
        role="You are an expert agent operating in the ALFRED embodied household environment.",
        shows_admissible=True,  # verl-agent's ALFWorld template lists them (about 10-40)
    )

    def __init__(self, data_root: str | Path | None = None, max_turns: int | None = None) -> None:
        super().__init__(max_turns)
        self.root = resolve_data_root(data_root)
        self.kind = data_kind(self.root)
        self._engine: Any = None
        self._loaded: Path | None = None
        self._state: Any = None
        self._task = ""

    @staticmethod
    def availability(data_root: str | Path | None = None) -> str | None:
        if importlib.util.find_spec("alfworld") is None:
            return f"alfworld is not installed: {INSTALL}"
        if importlib.util.find_spec("fast_downward") is None:
            return f"alfworld's planner (fast-downward-textworld) is missing: {INSTALL}"
        try:
            resolve_data_root(data_root)
        except EnvUnavailable as exc:
            return NO_DATA if data_root is None else str(exc)
        return None

    def _load(self, instance_id: str) -> Any:
        game = game_path(self.root, instance_id)
        if self._engine is None:
            self._engine = make_engine()
        if self._loaded != game:
            self._loaded = None
            try:
                self._engine.load(str(game / GAME_FILE))
            except Exception as err:  # bad JSON, PDDL the planner rejects, a broken grammar
                raise EnvError(
                    f"alfworld: the engine cannot load {game / GAME_FILE}: "
                    f"{type(err).__name__}: {err}"
                ) from err
            self._loaded = game
        return self._engine

    def _reset(self, instance_id: str) -> str:
        self._state = self._load(instance_id).reset()
        obs = str(self._state.feedback)
        self._task = task_from_intro(obs)
        return obs

    def _step(self, action: str) -> Step:
        self._state, _, done = self._engine.step(action)
        obs = str(self._state.feedback)
        won = bool(self._state["won"])
        return Step(
            observation=obs,
            reward=1.0 if won else 0.0,
            done=bool(done) or won,
            valid=obs.strip() != INVALID_REPLY,
            score=1.0 if won else 0.0,
            info={"success": won},
        )

    def task_description(self) -> str:
        return self._task

    def valid_actions(self) -> list[str]:
        return [] if self._state is None else list(self._state["admissible_commands"])

    def gold_actions(self, instance_id: str) -> list[str]:
        """The game's walkthrough when its game file has one (generated sets always do), else a
        run of ALFWorld's handcoded expert (seeded, at most 150 steps) that must win."""
        game = game_path(self.root, instance_id)
        walkthrough = json.loads((game / GAME_FILE).read_text()).get("walkthrough")
        if walkthrough:
            return [str(a) for a in walkthrough]
        return self._expert_plan(game)

    def _expert_plan(self, game: Path, max_steps: int = 150) -> list[str]:
        from alfworld.agents.environment.alfred_tw_env import AlfredExpert, AlfredExpertType

        engine = AlfredExpert(make_engine(facts=True), expert_type=AlfredExpertType.HANDCODED)
        saved = random.getstate()  # the expert draws from the global generator
        random.seed(0)
        try:
            engine.load(str(game / GAME_FILE))
            state, plan = engine.reset(), []
            while not state["won"] and len(plan) < max_steps:
                plan.append(str(state["extra.expert_plan"][0]))
                state, _, _ = engine.step(plan[-1])
        except Exception as err:  # the expert raises bare Exceptions (timeouts, failures)
            raise EnvError(f"alfworld: the handcoded expert failed on {game}: {err}") from err
        finally:
            random.setstate(saved)
            engine.close()
        if not state["won"]:
            raise EnvError(
                f"alfworld: the handcoded expert did not win {game} in {max_steps} steps"
            )
        return plan

    def category(self, instance_id: str) -> str:
        return task_type_of(game_path(self.root, instance_id))

    def canonical_description(self, instance_id: str) -> str:
        """The game file's text (domain, grammar with the goal sentence, and PDDL problem)."""
        return (game_path(self.root, instance_id) / GAME_FILE).read_text()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine, self._loaded, self._state = None, None, None
