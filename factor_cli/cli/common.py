"""Shared CLI helpers: one-line errors, consoles."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


class UserError(Exception):
    """Bad input the user can fix; rendered as one line, exit code 1."""


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on one line to stderr and exit non-zero."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
