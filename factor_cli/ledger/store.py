"""Where the ledger lives: tracking-URI resolution, opening an MLflow client, the experiment.

Resolution order of the tracking URI: ``--tracking-uri`` (the ``uri`` argument) >
``MLFLOW_TRACKING_URI`` (MLflow's standard variable) > ``sqlite:///<root>/ledger/mlflow.db``,
where ``<root>`` is the nearest folder above the working directory that holds ``.git`` (else the
working directory). MLflow 3.17 refuses the old file store (``./mlruns``), so the default is a
local SQLite database; artifacts of a SQLite ledger go next to it (``ledger/artifacts``) instead of
MLflow's default ``./mlruns`` under whatever folder a command was started from.

Every failure a user can fix (a refused URI, a missing database, a file that is not an SQLite
database, a read-only database or folder, an unreachable server) is a :class:`LedgerError` with a
one-line message naming the store and the fix.

Concurrent jobs on one SQLite file (a study launching many runs at once):

* creating and migrating a new database is not safe to run twice at once (MLflow's tracking
  store runs its alembic migrations unguarded; two at once leave ``_alembic_tmp_*`` tables behind
  and the file unusable), so :func:`open_client` opens a SQLite store only while holding an
  exclusive ``flock`` on ``<db>.lock`` beside it: one process creates and migrates, the others
  then find it migrated;
* MLflow 3.17 sets ``PRAGMA busy_timeout = 20000`` (20 s) on every session it opens, so a write
  waits for another's lock instead of failing at once; what SQLite still refuses without waiting
  (a transaction that read first and then wants to write while another writes) fails with
  "database is locked" and rolls back, so every call of the returned client is retried
  (:class:`RetryingClient`: exponential backoff with jitter, up to :data:`RETRY_SECONDS`).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

try:
    import fcntl
except ImportError:  # Windows: no flock; the store is opened unguarded there
    fcntl = None  # type: ignore[assignment]

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
LOCK_SUFFIX = ".lock"  # <db>.lock: the flock that serialises opening (and creating) a store
LOCK_TIMEOUT_S = 600.0  # a migration takes ~7 s; ten minutes means a stuck process
SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database
RETRY_SECONDS = 300.0  # give up on a "database is locked" store after this long
_LOCKED = ("database is locked", "database table is locked")
_jitter = random.Random()  # backoff jitter only: unseeded on purpose (desynchronises writers)
_sleep = time.sleep  # module-level so tests can skip the pauses
_T = TypeVar("_T")
log = logging.getLogger(__name__)


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
    db_logger = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _LockedRecordFilter) for f in db_logger.filters):
        db_logger.addFilter(_LockedRecordFilter())


class _LockedRecordFilter(logging.Filter):
    """Drop MLflow's logged traceback of a "database is locked" error: the call is retried."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return not any(marker in text for marker in _LOCKED)


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


def _store_error(db: Path, problem: str, fix: str) -> LedgerError:
    """``ledger <db> <problem>; <fix>, or use another store (...)`` as one line."""
    return LedgerError(
        f"ledger {db} {problem}; {fix}, or point --tracking-uri, the config's tracking_uri or "
        f"{ENV_VAR} at another store"
    )


def check_sqlite_file(db: Path, *, write: bool) -> None:
    """Refuse a SQLite store that cannot work, before MLflow turns it into a traceback.

    Checks that ``db`` (when it exists) is a file that starts with the SQLite header, and for a
    writer (``write``) that the file, its folder (SQLite writes its journal beside the database)
    and the artifacts folder beside it are writable.

    Raises:
        LedgerError: naming the file and the fix.
    """
    if db.is_dir():
        raise _store_error(db, "is a folder, not a database file", "pass the mlflow.db inside")
    if db.exists():
        try:
            with db.open("rb") as fh:
                head = fh.read(len(SQLITE_HEADER))
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror})"
            raise _store_error(db, problem, "fix its permissions") from None
        if head and head != SQLITE_HEADER:  # an empty file is a valid empty database
            raise _store_error(
                db, "is not an SQLite database (it lacks the SQLite header)",
                "move it away (a new ledger is created on the next run)",
            )  # fmt: skip
    if not write:
        return
    if db.exists() and not os.access(db, os.W_OK):
        raise _store_error(db, "is read-only", f"make it writable (chmod u+w {db})")
    folder = db.parent
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise _store_error(
            db, f"is in the read-only folder {folder} (SQLite writes its journal beside it)",
            f"make the folder writable (chmod u+w {folder})",
        )  # fmt: skip
    artifacts = folder / ARTIFACTS_NAME
    if artifacts.is_dir() and not os.access(artifacts, os.W_OK | os.X_OK):
        raise _store_error(
            db, f"keeps its artifacts in the read-only folder {artifacts}",
            f"make it writable (chmod -R u+w {artifacts})",
        )  # fmt: skip


@contextmanager
def store_lock(db: Path, *, required: bool) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<db>.lock`` (created beside the database).

    Every process opening the SQLite store ``db`` takes it, so one alone creates and migrates
    a new database. A reader that cannot create the lock file (a read-only folder) opens
    without it (``required=False``); nobody can create or migrate a store there anyway.

    Raises:
        LedgerError: the lock file cannot be created by a writer, or another process holds the
            lock for more than :data:`LOCK_TIMEOUT_S`.
    """
    if fcntl is None:
        yield
        return
    lock = db.with_name(db.name + LOCK_SUFFIX)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        if required:
            raise _store_error(
                db, f"cannot get its lock file {lock} ({exc.strerror})",
                f"make {db.parent} writable",
            ) from None  # fmt: skip
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    problem = f"is locked: a process has held {lock} {LOCK_TIMEOUT_S:.0f} s"
                    raise _store_error(db, problem, f"stop it (fuser -v {lock})") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def is_locked_error(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) is SQLite's "database is locked"."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(marker in str(current) for marker in _LOCKED):
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_locked(call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``call(*args, **kwargs)``, again after a pause while SQLite says "database is locked".

    A locked write is rolled back by SQLite and MLflow, so repeating it is safe. Pauses double
    from 50 ms to 2 s, each stretched by a random factor in [1, 2) so that colliding writers do
    not collide again; after :data:`RETRY_SECONDS` the last error is raised.
    """
    delay, deadline = 0.05, time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not is_locked_error(exc) or time.monotonic() + delay > deadline:
                raise
            name = getattr(call, "__name__", "call")
            log.debug("ledger: %s: database is locked; retrying in %.2f s", name, delay)
            _sleep(delay * (1.0 + _jitter.random()))
            delay = min(2 * delay, 2.0)


class RetryingClient:
    """An ``MlflowClient`` whose every method call goes through :func:`retry_locked`.

    Attributes and methods are looked up on the wrapped client at each call (so patching
    ``MlflowClient`` methods still takes effect); ``client`` is the wrapped client.
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr
        return functools.partial(retry_locked, attr)


def _open_failure(uri: str, db: Path | None, exc: BaseException) -> LedgerError:
    if db is None:
        return LedgerError(f"cannot reach the tracking store {uri}: {first_line(exc)}")
    return _store_error(
        db, f"cannot be opened ({first_line(exc)})",
        "if it is damaged, move it away (a new ledger is created on the next run)",
    )  # fmt: skip


def open_client(uri: str, *, create: bool):  # -> MlflowClient or RetryingClient (lazy import)
    """A client on ``uri`` after checking the store answers.

    A SQLite store is checked (:func:`check_sqlite_file`), opened (created and migrated when
    new) under :func:`store_lock`, and returned as a :class:`RetryingClient`; other stores as a
    plain ``MlflowClient``.

    Args:
        uri: a resolved tracking URI (:func:`resolve_tracking_uri`).
        create: a writer: create a missing SQLite database and require a writable store
            (training, evaluation); else refuse a missing one (reports, exports).

    Raises:
        LedgerError: the database is missing (``create=False``), cannot be created, is not an
            SQLite database, is read-only (``create=True``), or the store does not answer.
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
        check_sqlite_file(db, write=create)
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"cannot create the ledger folder {db.parent}: {exc}") from None
        # Import MLflow's SQL store (seconds) before taking the lock, which then covers only
        # the opening itself, so concurrent jobs wait for each other milliseconds, not seconds.
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    guard = store_lock(db, required=create) if db is not None else nullcontext()
    try:
        with guard:
            client = MlflowClient(tracking_uri=uri)  # MLflow 3 builds (and migrates) the store
            with _probe_env():
                client.search_experiments(max_results=1)
    except LedgerError:
        raise
    except Exception as exc:
        raise _open_failure(uri, db, exc) from None
    return RetryingClient(client) if db is not None else client


def check_store(tracking_uri: str | None = None, *, write: bool = True) -> str:
    """Resolve and open the store now; returns its URI (call before hours of work start).

    Raises:
        LedgerError: as :func:`open_client` (``create=write``).
    """
    uri = resolve_tracking_uri(tracking_uri)
    open_client(uri, create=write)
    return uri


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
