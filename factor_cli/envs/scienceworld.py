"""ScienceWorld adapter: instance ids ``"{task}/{level}/{variation}"``.

Levels: L0 = simplifications "easy", L1 = "openDoors", L2 = none. Success is task completion
(score 100); a negative score (e.g. focusing on the wrong object: -100) ends the episode as a
failure. Steps call the engine directly (the reference wrapper recomputes look, inventory and
every valid action after each step, ~15x slower); valid actions are computed on request only.
All instances of a process share one JVM (memory-capped), each with its own interface object.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from typing import Any

from .base import Environment, EnvSpec, Step, UnknownInstance, normalize_observation
from .jvm import SharedJVM, java_missing
from .registry import register

LEVELS = {"L0": "easy", "L1": "openDoors", "L2": ""}
INVALID_PREFIX = "No known action matches that input."


@cache
def task_names() -> tuple[str, ...]:
    """The 30 task types, in ScienceWorld's own order (its tasks.json)."""
    import json
    from pathlib import Path

    import scienceworld

    tasks = json.loads((Path(scienceworld.__file__).parent / "tasks.json").read_text())
    return tuple(str(t["task_name"]) for t in tasks)


def normalize_lines(observation: str) -> str:
    """Replays reproduce everything but the order of listed items (e.g. the doors of a room), so
    replay checks compare the multiset of whitespace-normalised lines."""
    return "\n".join(sorted(normalize_observation(observation).splitlines()))


def parse_instance(instance_id: str) -> tuple[str, str, int]:
    parts = instance_id.split("/")
    if len(parts) != 3 or parts[1] not in LEVELS or not parts[2].isdigit():
        raise UnknownInstance(
            f"scienceworld instance {instance_id!r} is not '{{task}}/{{L0|L1|L2}}/{{variation}}'"
        )
    return parts[0], parts[1], int(parts[2])


@register("scienceworld")
class ScienceWorldEnv(Environment):
    spec = EnvSpec(
        name="scienceworld",
        convention="raw",
        metric="macro success over task type x level",
        feedback="the environment's observation string after the action",
        max_turns=50,
        invalid_action="no-op: 'No known action matches that input.'; counted invalid",
        instance_format="{task}/{L0|L1|L2}/{variation}",
        role="You are an expert agent doing science experiments in the ScienceWorld simulator.",
        # Off: the list is every object x verb combination, thousands long (the capped prefix
        # would show the engine's first few dozen, not the useful ones).
        shows_admissible=False,
    )

    def __init__(self, max_turns: int | None = None) -> None:
        super().__init__(max_turns)
        from scienceworld.constants import BASEPATH, JAR_PATH

        self._jvm = SharedJVM.get(JAR_PATH, BASEPATH)
        self._jvm.acquire()
        self._closed = False
        self._iface: Any = None
        self._generation = -1

    @staticmethod
    def availability() -> str | None:
        if importlib.util.find_spec("scienceworld") is None:
            return "scienceworld is not installed: `pip install scienceworld==1.2.3`"
        return java_missing()

    def _interface(self) -> Any:
        if self._iface is None or self._generation != self._jvm.generation:
            self._iface = self._jvm.jvm().scienceworld.runtime.pythonapi.PythonInterface()
            self._generation = self._jvm.generation
        return self._iface

    def _load(self, instance_id: str, gold: bool = False) -> Any:
        task, level, variation = parse_instance(instance_id)
        iface = self._interface()
        if task not in task_names():
            raise UnknownInstance(
                f"scienceworld has no task {task!r}; valid: {', '.join(task_names())}"
            )
        n_var = int(iface.getTaskMaxVariations(task))
        if variation >= n_var:
            raise UnknownInstance(
                f"scienceworld task {task!r} has variations 0-{n_var - 1}, not {variation}"
            )
        iface.load(task, variation, LEVELS[level], gold)
        return iface

    def _reset(self, instance_id: str) -> str:
        iface = self._load(instance_id)
        return str(iface.freeActionLook())

    def _step(self, action: str) -> Step:
        iface = self._interface()
        prev = self.score
        obs = str(iface.step(action))
        score = float(round(100 * float(iface.getScore())))
        completed = bool(iface.getCompleted())
        success = completed and score >= 100
        failed = score < 0
        return Step(
            observation=obs,
            reward=score - prev,
            done=completed or failed,
            valid=not obs.startswith(INVALID_PREFIX),
            score=score,
            info={"success": success, "failure": failed},
        )

    def normalize(self, observation: str) -> str:
        return normalize_lines(observation)

    def task_description(self) -> str:
        return str(self._interface().getTaskDescription())

    def valid_actions(self) -> list[str]:
        return [str(a) for a in self._interface().getValidActionObjectCombinations()]

    def gold_actions(self, instance_id: str) -> list[str]:
        iface = self._load(instance_id, gold=True)
        self._end_episode()
        return [str(a) for a in iface.getGoldActionSequence()]

    def variations(self, task: str) -> dict[str, list[int]]:
        """ScienceWorld's own train / dev / test variation lists of a task."""
        iface = self._interface()
        if task not in task_names():
            raise UnknownInstance(f"scienceworld has no task {task!r}")
        iface.load(task, 0, "", False)
        self._end_episode()
        return {
            "train": [int(v) for v in iface.getVariationsTrain()],
            "dev": [int(v) for v in iface.getVariationsDev()],
            "test": [int(v) for v in iface.getVariationsTest()],
        }

    def category(self, instance_id: str) -> str:
        task, level, _ = parse_instance(instance_id)
        return f"{task}/{level}"

    def canonical_description(self, instance_id: str) -> str:
        task, level, variation = parse_instance(instance_id)
        iface = self._load(instance_id)
        self._end_episode()
        return "\n".join([task, level, str(variation), str(iface.getTaskDescription())])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._iface = None
            self._jvm.release()
