"""A pool of environment instances that survives engine crashes.

Rollouts hold one environment per concurrent episode. When an engine dies mid-episode (a JVM
killed by the OOM killer, a segfault in native code), the pool restarts the engine, replaces the
environment, records the crash and raises :class:`EnvCrashed`, so the caller retries the
episode or counts it as failed, and logs it. Closing the pool (also on Ctrl-C or an error, via
``with``) closes every environment.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..interrupts import interrupt_in
from .base import EnvCrashed, EnvError, Environment, Step
from .registry import make_env

T = TypeVar("T")


class EnvSettings(Protocol):
    """What :meth:`EnvPool.of` reads of an env config (the training config's ``env``)."""

    name: str
    max_turns: int | None
    options: dict[str, Any]


@dataclass(frozen=True)
class Crash:
    slot: int
    instance_id: str | None
    error: str
    time: float


class EnvPool:
    """``size`` environments of one adapter, addressed by slot 0..size-1."""

    def __init__(
        self,
        name: str,
        size: int,
        on_crash: Callable[[Crash], None] | None = None,
        max_turns: int | None = None,
        **options: object,
    ) -> None:
        """``max_turns``: the episode's turn limit, which each environment enforces on the
        actions of an episode, a restored prefix's included, so a continuation from x_t plays at
        most max_turns - t turns: it ends when the episode would (None: the adapter's default)."""
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        if max_turns is not None:
            options = {**options, "max_turns": max_turns}
        self.name, self.options, self.on_crash = name, options, on_crash
        self.envs: list[Environment] = []
        self.crashes: list[Crash] = []
        try:
            for _ in range(size):
                self.envs.append(make_env(name, **options))
        except BaseException:
            self.close()
            raise

    @classmethod
    def of(cls, env: EnvSettings, size: int) -> EnvPool:
        """``size`` environments as an env config describes them (``env.name``, its turn limit
        ``env.max_turns`` and adapter ``env.options``): the one way training, evaluation and the
        replays open a pool, so none of them can leave out the episode's turn limit."""
        return cls(env.name, size, max_turns=env.max_turns, **env.options)

    def __len__(self) -> int:
        return len(self.envs)

    def __getitem__(self, slot: int) -> Environment:
        return self.envs[slot]

    def reset(self, slot: int, instance_id: str) -> str:
        return self._guard(slot, lambda env: env.reset(instance_id))

    def step(self, slot: int, action: str) -> Step:
        return self._guard(slot, lambda env: env.step(action))

    def restore(
        self,
        slot: int,
        instance_id: str,
        actions: Sequence[str],
        observations: Sequence[str] | None = None,
    ) -> str:
        return self._guard(slot, lambda env: env.restore(instance_id, actions, observations))

    def _guard(self, slot: int, call: Callable[[Environment], T]) -> T:
        env = self.envs[slot]
        try:
            return call(env)
        except EnvError:
            raise
        except Exception as exc:  # anything else from an engine means it is no longer usable
            interrupt = interrupt_in(exc)
            if interrupt is not None:  # Ctrl-C that the engine's client library mangled
                raise type(interrupt)(*interrupt.args) from exc
            crash = Crash(
                slot, env.instance_id, f"{type(exc).__name__}: {exc}".splitlines()[0], time.time()
            )
            self.crashes.append(crash)
            self._replace(slot)
            if self.on_crash:
                self.on_crash(crash)
            raise EnvCrashed(
                f"{self.name}: the engine crashed in slot {slot} ({crash.error}); it was restarted "
                "and the episode must be retried or counted as failed"
            ) from exc

    def _replace(self, slot: int) -> None:
        old = self.envs[slot]
        jvm = getattr(old, "_jvm", None)
        if jvm is not None and not jvm.alive():
            jvm.restart()  # every environment of this JVM gets a fresh interface object lazily
            for env in self.envs:
                env._end_episode(lost="its JVM crashed and was restarted")
        try:
            old.close()
        finally:
            self.envs[slot] = make_env(self.name, **self.options)

    def close(self) -> None:
        envs, self.envs = self.envs, []
        for env in envs:
            with contextlib.suppress(Exception):  # closing must reach every environment
                env.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
