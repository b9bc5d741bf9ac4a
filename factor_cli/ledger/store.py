"""Where the ledger lives: tracking-URI resolution, opening an MLflow client, the experiment.

Resolution order of the tracking URI: ``--tracking-uri`` (the ``uri`` argument) >
``MLFLOW_TRACKING_URI`` (MLflow's standard variable) > ``sqlite:///<root>/ledger/mlflow.db``,
where ``<root>`` is the nearest folder above the working directory that holds ``.git`` (else the
working directory). MLflow 3.17 refuses the old file store (``./mlruns``), so the default is a
local SQLite database; artifacts of a SQLite ledger go next to it (``ledger/artifacts``) instead of
MLflow's default ``./mlruns`` under whatever folder a command was started from.

Every failure a user can fix (a refused URI, a missing database, an unreachable server) is a
:class:`LedgerError` with a one-line message.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

LEDGER_DIR = "ledger"
DB_NAME = "mlflow.db"
ARTIFACTS_NAME = "artifacts"
DEFAULT_EXPERIMENT = "factor"
ENV_VAR = "MLFLOW_TRACKING_URI"
# Schemes MLflow's tracking client serves besides the refused file store.
DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https", "databricks")
# While probing a server: fail in seconds instead of MLflow's minutes of retries.
_PROBE_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


class LedgerError(ValueError):
    """Bad input or an unusable store; the message is one line that says what to do."""


def quiet_mlflow() -> None:
    """Silence MLflow's INFO chatter (database creation, migrations) and its progress bars.

    MLflow sets its logger's level when imported, so this imports it first; a level the user
    set above WARNING is kept, as is an explicit ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow  # noqa: F401  (configures its loggers on import)

    for name in ("mlflow", "alembic"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type name)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def project_root(start: Path | None = None) -> Path:
    """Nearest folder at or above ``start`` (default: the working directory) holding ``.git``."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


def default_tracking_uri(root: Path | None = None) -> str:
    """``sqlite:///<root>/ledger/mlflow.db`` (absolute path, so four slashes on POSIX)."""
    return f"sqlite:///{project_root(root) / LEDGER_DIR / DB_NAME}"


def resolve_tracking_uri(uri: str | None = None, root: Path | None = None) -> str:
    """The tracking URI to use: ``uri`` > ``$MLFLOW_TRACKING_URI`` > the local SQLite default.

    A bare path ending in ``.db``/``.sqlite`` is taken as a SQLite file; other bare paths and
    ``file:`` URIs are refused (MLflow 3.17's file store is in maintenance mode).
    """
    chosen = (uri or "").strip() or os.environ.get(ENV_VAR, "").strip()
    if not chosen:
        return default_tracking_uri(root)
    scheme = urlparse(chosen).scheme.split("+")[0].lower()
    if scheme in DB_SCHEMES or scheme in SERVER_SCHEMES:
        return chosen
    is_path = not scheme or len(scheme) == 1  # a one-letter scheme is a Windows drive
    if is_path and chosen.endswith((".db", ".sqlite", ".sqlite3")):
        return f"sqlite:///{Path(chosen).expanduser().resolve()}"
    raise LedgerError(
        f"tracking URI {chosen!r} is not supported; use sqlite:///PATH/mlflow.db, "
        f"http(s)://HOST:PORT of an MLflow server, or a database URI "
        f"({', '.join(DB_SCHEMES)}); MLflow 3.17 refuses the old file store"
    )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:`` URI (None for other schemes or in-memory)."""
    if urlparse(uri).scheme.split("+")[0].lower() != "sqlite":
        return None
    rest = uri.split(":", 1)[1]
    if not rest.startswith("///"):  # sqlite:// is an in-memory database
        return None
    path = unquote(rest[3:]).split("?", 1)[0]  # sqlite:///x is relative, sqlite:////x absolute
    if not path or path == ":memory:":
        return None
    return Path(path) if Path(path).is_absolute() else Path.cwd() / path


def artifact_location(uri: str) -> str | None:
    """Where a new experiment keeps artifacts: next to a SQLite file, else the server's choice."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / ARTIFACTS_NAME).resolve().as_uri()


@contextmanager
def _probe_env() -> Iterator[None]:
    """Temporarily make MLflow's HTTP client fail fast (no retries, short timeout)."""
    saved = {k: os.environ.get(k) for k in _PROBE_ENV}
    os.environ.update(_PROBE_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def open_client(uri: str, *, create: bool):  # -> mlflow.MlflowClient (lazy import)
    """An ``MlflowClient`` on ``uri`` after checking the store answers.

    Args:
        uri: a resolved tracking URI (:func:`resolve_tracking_uri`).
        create: create a missing SQLite database (training) or refuse it (reports, exports).

    Raises:
        LedgerError: the database is missing (``create=False``) or cannot be created, or the
            store does not answer.
    """
    quiet_mlflow()
    from mlflow import MlflowClient

    db = sqlite_path(uri)
    if db is not None:
        if not db.exists() and not create:
            raise LedgerError(
                f"no ledger at {db}: nothing has been logged there yet; pass --tracking-uri "
                f"or set {ENV_VAR} to the store that holds the runs"
            )
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create the ledger folder {db.parent}: {exc}") from None
    client = MlflowClient(tracking_uri=uri)
    try:
        with _probe_env():
            client.search_experiments(max_results=1)
    except Exception as exc:
        raise LedgerError(f"cannot reach the tracking store {uri}: {first_line(exc)}") from None
    return client


def get_experiment_id(client, name: str, uri: str, *, create: bool) -> str | None:
    """Id of experiment ``name``; created (artifacts next to a SQLite file) when ``create``.

    Returns None when the experiment does not exist and ``create`` is false.
    """
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage != "active":
            raise LedgerError(
                f"experiment {name!r} is deleted in {uri}; restore it "
                f"(mlflow experiments restore) or choose another --experiment"
            )
        return found.experiment_id
    if not create:
        return None
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri))
    except MlflowException:  # created meanwhile by another process
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id
