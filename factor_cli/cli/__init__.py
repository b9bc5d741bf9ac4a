"""Typer command-line shell: parse, call the library, render with rich."""
