"""A tiny name -> object registry: every family of the package (methods, estimators,
allocations, reductions, aggregates, table kinds, planners, backends, environments).

Registering a name twice is an error and an unknown name fails listing the valid ones, so a typo
in a config never silently falls back to something else.

Standard library only and importing nothing from ``factor_cli``: it is the one module that the
self-contained layers ``credit/`` and ``stats/`` may import from the rest of the package (a test
enforces it), so they stay importable on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Ordered mapping from a unique name to an entry of one family."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name`` and return it.

        Raises:
            ValueError: ``name`` is already registered.
        """
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def deco(entry: T) -> T:
            return self.add(name, entry)

        return deco

    def get(self, name: str) -> T:
        """The entry registered under ``name``.

        Raises:
            ValueError: ``name`` is unknown; the message lists the valid names.
        """
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self._entries)
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
