"""Recognise a Ctrl-C that a library turned into an ordinary exception.

Some libraries fail inside their own ``KeyboardInterrupt`` handler (py4j 0.10.9 calls a method its
connection class lacks), so what reaches us is an ``AttributeError`` whose context is the
interrupt. Code that treats exceptions as recoverable (the environment pool retries a crashed
engine) must hand such an error back as the interrupt, or Ctrl-C is swallowed as a crash.
"""

from __future__ import annotations

__all__ = ["caused_by_interrupt", "interrupt_in"]


def interrupt_in(exc: BaseException) -> KeyboardInterrupt | None:
    """The ``KeyboardInterrupt`` (or subclass) in ``exc``'s cause/context chain, if any."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        if isinstance(node, KeyboardInterrupt):
            return node
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    return None


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while handling a Ctrl-C (anywhere in its context chain)."""
    return interrupt_in(exc) is not None
