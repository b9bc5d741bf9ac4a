"""What the suite's rules read (tests/conftest.py): the committed tiny-model corpus, and the
skip reasons a run may show. A module of its own so tests can import it (several conftest.py
files share that module name)."""

from __future__ import annotations

from pathlib import Path

import pytest

TINY_CORPUS = Path(__file__).parent / "data" / "tiny_corpus.json"
"""``environment_corpus(max_games=30, scienceworld_games=0)`` with TextWorldExpress and
ScienceWorld available, saved (tests/policy/test_tiny_corpus.py checks it is still that)."""


ALLOWED_SKIPS = (
    "twx:", "twx needs Java", "scienceworld", "webshop", "alfworld is not installed",
    "vLLM is not installed", "vLLM is installed here", "this machine has a GPU", "mlflow",
    "submitit", "the docs extra", "chromium", "playwright", "running as root",
    "on a shared filesystem", "this checkout has a WebShop manifest",
    "the unprivileged user",
)  # fmt: skip
"""Substrings of the skip reasons a run may show: a missing optional runtime or extra (each
reason carries its install hint), or a machine property. Any other skip fails the run."""


def unexpected_skips(reports: list[pytest.TestReport]) -> list[str]:
    """``node id: reason`` of each skip whose reason matches no :data:`ALLOWED_SKIPS` entry."""
    out = []
    for rep in reports:
        if rep.skipped and isinstance(rep.longrepr, tuple):
            reason = str(rep.longrepr[2]).removeprefix("Skipped: ")
            if not any(allowed in reason for allowed in ALLOWED_SKIPS):
                out.append(f"{rep.nodeid}: {reason}")
    return out
