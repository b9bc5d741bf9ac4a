"""Shared CLI helpers: the one error path, consoles.

Every command reports bad input through :func:`fail`: one line ``error: <message>`` on stderr,
exit code 1 (or the code given). The message is printed as plain text, never parsed as rich
markup, so paths such as ``/tmp/[/bad].json`` or hints such as
``pip install 'factor-cli[alfworld]'`` reach the user unchanged. :func:`run_app` is the safety
net around every command: an error type the package raises for input a user can fix that a
command did not catch still ends as one line, and Ctrl-C ends quietly with 130 (128 + SIGINT).
``FACTOR_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

from factor_cli.interrupts import caused_by_interrupt

console = Console()
err_console = Console(stderr=True)

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""


class UserError(Exception):
    """Bad input the user can fix; rendered as one line, exit code 1."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type name)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def error_line(message: str) -> Text:
    """``error: message`` as rich Text: the message is literal, never markup."""
    flat = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    return Text.assemble(("error:", "bold red"), " ", flat)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on one line to stderr and exit with ``code``."""
    err_console.print(error_line(message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print ``warning: message`` on one line to stderr (literal text, never markup)."""
    err_console.print(
        Text.assemble(("warning:", "bold yellow"), " ", message), highlight=False, soft_wrap=True
    )


def _user_error_types() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input or an unusable resource, never a bug in factor.

    ``ValueError`` covers the package's typed errors (ConfigError, LedgerError, ManifestError,
    RecordError, ...) and the credit core's argument checks; ``OSError`` covers missing,
    unreadable or read-only files; ``EnvError`` a missing Java or a crashed engine.
    """
    from factor_cli.envs.base import EnvError  # light: no Java or engine is started

    return (UserError, ValueError, OSError, EnvError, UnicodeDecodeError)


def run_app(app: Callable[[], object]) -> None:
    """Run the typer ``app`` with the one error path around it."""
    debug = os.environ.get("FACTOR_DEBUG", "") not in ("", "0")
    try:
        app()
    except SystemExit as exc:
        # typer turns a Ctrl-C in plain Python into a silent exit 130 (``Exit(130) from`` the
        # KeyboardInterrupt); say so, as for every other interrupt. Commands that explain their
        # own interrupt (``factor train``) raise their exit without that cause.
        cause = getattr(exc.__context__, "__cause__", None)
        if exc.code == EXIT_INTERRUPTED and isinstance(cause, KeyboardInterrupt):
            err_console.print(Text("interrupted", style="yellow"))
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        err_console.print(Text("interrupted", style="yellow"))
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if caused_by_interrupt(exc) and not debug:
            err_console.print(Text("interrupted", style="yellow"))
            sys.exit(EXIT_INTERRUPTED)
        if debug or not isinstance(exc, _user_error_types()):
            raise
        err_console.print(error_line(first_line(exc)), highlight=False, soft_wrap=True)
        sys.exit(1)
