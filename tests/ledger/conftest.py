"""Ledger fixtures: one migrated template store per session, copied for every test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from factor_cli.ledger import store


@pytest.fixture(scope="session")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, fully migrated MLflow SQLite database (migrating takes seconds: done once)."""
    path = tmp_path_factory.mktemp("ledger-template") / "mlflow.db"
    store.open_client(f"sqlite:///{path}", create=True)
    return path


@pytest.fixture
def uri(template_db: Path, tmp_path: Path) -> str:
    """A fresh per-test store (a copy of the template)."""
    path = tmp_path / "ledger" / "mlflow.db"
    path.parent.mkdir()
    shutil.copy(template_db, path)
    return f"sqlite:///{path}"
