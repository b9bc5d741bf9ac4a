"""The environment protocol every adapter implements (docs/design.md section 6).

An adapter plays one episode at a time: ``reset(instance_id)`` starts it, ``step(action)``
advances it, ``restore(instance_id, actions, observations)`` puts it back at the state after
``actions`` of a recorded episode (by default reset + replay, each replayed observation checked
against ``observations``; an adapter whose engine can clone a state may override it), and
``outcome()`` scores it under the environment's convention.

Static facts (the terminal-outcome convention, evaluation metric, feedback Phi_t, turn limit,
invalid-action handling) live in the adapter's :class:`EnvSpec`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


class EnvError(RuntimeError):
    """An environment cannot do what was asked; the message names the thing and the fix."""


class EnvUnavailable(EnvError):
    """A dependency (package, Java, data, server) is missing; the message says how to get it."""


class RestoreMismatch(EnvError):
    """A replayed observation differs from the recorded one: the state cannot be trusted."""


class EnvCrashed(EnvError):
    """The engine died; it was restarted and the episode is lost (retry it or count it failed)."""


class UnknownInstance(EnvError, ValueError):
    """The instance id does not name an instance of this environment."""


@dataclass(frozen=True)
class EnvSpec:
    name: str
    convention: str
    """Outcome convention of the credit core (leave-one-out, group-standardize, raw)."""
    metric: str
    """Evaluation metric, e.g. 'macro success over task type x level'."""
    feedback: str
    """What Phi_t is for this environment."""
    max_turns: int
    invalid_action: str
    """How an invalid action is handled (e.g. 'no-op with an error message, counted')."""
    instance_format: str
    """How instance ids are written, e.g. '{task}/{level}/{variation}'."""
    role: str = ""
    """The system text's first sentence: who the agent is (``prompt.system`` replaces it all)."""
    shows_admissible: bool = False
    """Default of ``prompt.admissible``: whether prompts list the admissible actions."""


@dataclass(frozen=True)
class Step:
    """The result of one action."""

    observation: str
    """Phi_t: the environment's reply to the action, as the agent sees it."""
    reward: float
    done: bool
    valid: bool
    score: float
    """Cumulative raw score after the action."""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """The terminal outcome of an episode."""

    outcome: float
    """G_i on the convention's scale (binary success, normalised or penalised score)."""
    success: bool
    score: float
    """Raw environment score."""
    invalid_actions: int
    turns: int


_WS = re.compile(r"[ \t]+")


def normalize_observation(text: str) -> str:
    """Whitespace-normalised text used to compare a replayed observation with a recorded one."""
    return "\n".join(_WS.sub(" ", line).strip() for line in text.strip().splitlines())


class Environment(ABC):
    """One episode at a time of one environment; subclasses register in ``ENVIRONMENTS``."""

    spec: ClassVar[EnvSpec]

    @staticmethod
    def availability() -> str | None:
        """None when the adapter can run here, else one line saying what is missing and how to
        get it (a package, Java, data, a server). Adapters override it; keyword options a
        subclass's check declares (e.g. ALFWorld's ``data_root``) are passed from the env
        config by :func:`~factor_cli.envs.registry.availability`."""
        return None

    def __init__(self, max_turns: int | None = None) -> None:
        self.max_turns = max_turns or self.spec.max_turns
        self.instance_id: str | None = None
        self.actions: list[str] = []
        self.observations: list[str] = []
        self.invalid_actions = 0
        self.score = 0.0
        self.done = False
        self.success = False
        self.lost: str | None = None

    # -- the protocol -------------------------------------------------------------------------
    def reset(self, instance_id: str) -> str:
        """Start a new episode of ``instance_id``; returns the first observation."""
        obs = self._reset(instance_id)
        self.instance_id, self.lost = instance_id, None
        self.actions, self.observations = [], [obs]
        self.invalid_actions, self.score, self.done, self.success = 0, 0.0, False, False
        return obs

    def step(self, action: str) -> Step:
        """Execute one action; an episode that is done, or out of turns, refuses more."""
        if self.instance_id is None:
            if self.lost:
                raise EnvCrashed(f"{self.spec.name}: episode lost: {self.lost}; reset to continue")
            raise EnvError(
                f"{self.spec.name}: step() before reset(); call reset(instance_id) first"
            )
        if self.done:
            raise EnvError(f"{self.spec.name}: the episode of {self.instance_id} is over; reset it")
        result = self._step(action)
        self.actions.append(action)
        self.observations.append(result.observation)
        self.invalid_actions += 0 if result.valid else 1
        self.score = result.score
        done = result.done or len(self.actions) >= self.max_turns
        self.done = done
        self.success = bool(result.info.get("success", False))
        if done != result.done:
            result = Step(
                result.observation,
                result.reward,
                done,
                result.valid,
                result.score,
                {**result.info, "truncated": True},
            )
        return result

    def restore(
        self, instance_id: str, actions: Sequence[str], observations: Sequence[str] | None = None
    ) -> str:
        """Put the environment in the state after ``actions`` of an episode of ``instance_id``.

        Default: reset and replay, checking each replayed observation against the recorded one
        (``observations[k]`` is the reply to ``actions[k - 1]``, ``observations[0]`` the first
        observation) after :meth:`normalize`; a mismatch raises :class:`RestoreMismatch`.
        Returns the current observation.
        """
        obs = self.reset(instance_id)
        self._check_replay(0, obs, observations)
        for k, action in enumerate(actions, start=1):
            obs = self.step(action).observation
            self._check_replay(k, obs, observations)
        return obs

    def _check_replay(self, k: int, got: str, recorded: Sequence[str] | None) -> None:
        if recorded is None or k >= len(recorded):
            return
        if self.normalize(got) != self.normalize(recorded[k]):
            raise RestoreMismatch(
                f"{self.spec.name}: replaying {self.instance_id} diverged at observation {k}: "
                f"expected {recorded[k][:80]!r}, got {got[:80]!r}"
            )

    def normalize(self, observation: str) -> str:
        """Canonical form for replay checks; adapters remove known order-only differences."""
        return normalize_observation(observation)

    def outcome(self) -> Outcome:
        """The episode's terminal outcome G_i under this environment's convention."""
        return Outcome(
            outcome=self._outcome_value(),
            success=self.success,
            score=self.score,
            invalid_actions=self.invalid_actions,
            turns=len(self.actions),
        )

    def _outcome_value(self) -> float:
        return 1.0 if self.success else 0.0

    def close(self) -> None:  # noqa: B027  (engines without resources need no override)
        """Release engine resources (JVMs, servers). Safe to call twice."""

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what adapters provide ----------------------------------------------------------------
    @abstractmethod
    def _reset(self, instance_id: str) -> str: ...

    @abstractmethod
    def _step(self, action: str) -> Step: ...

    @abstractmethod
    def task_description(self) -> str:
        """The current instance's task, as given to the agent."""

    def valid_actions(self) -> list[str]:
        """Admissible actions in the current state (for constrained decoding), if known."""
        return []

    def gold_actions(self, instance_id: str) -> list[str]:
        """A winning action sequence for ``instance_id``, if the engine provides one.

        It may load the instance in the engine: call :meth:`reset` before playing again.
        """
        raise EnvError(f"{self.spec.name} does not provide gold action sequences")

    def _end_episode(self, lost: str | None = None) -> None:
        """Forget the current episode (after a read that loaded an instance in the engine, or
        when the engine died: ``lost`` says why, and the next step raises EnvCrashed)."""
        if lost and self.instance_id is not None:
            self.lost = lost
        self.instance_id = None

    @abstractmethod
    def category(self, instance_id: str) -> str:
        """Evaluation category of an instance (the macro metric averages over categories)."""

    @abstractmethod
    def canonical_description(self, instance_id: str) -> str:
        """Text whose SHA-256 identifies the instance in split manifests, read from the engine."""
