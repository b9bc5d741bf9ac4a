"""Entry point of the ``factor`` command (the console script).

The command tree lives in :mod:`factor_cli.cli.app`; it is imported inside :func:`main`, so a
Ctrl-C while Python is still importing ends as quietly as one during a command.
"""

from __future__ import annotations

import sys
from typing import Any

from .common import EXIT_INTERRUPTED, run_app


def main() -> None:
    """The console script: every command behind the one error path (:func:`run_app`)."""
    try:
        from .app import app
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    run_app(app)


def __getattr__(name: str) -> Any:
    if name == "app":  # `from factor_cli.cli.main import app`, as the tests and docs do
        from .app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
