"""Unusable SQLite stores end as one line naming the store and the fix, never a traceback: a
file that is not a database, a folder, a damaged database, a read-only database or folder; and
the store's lock and "database is locked" retries.

Read-only cases need an unprivileged process (root writes through any mode bits): as root they
run in a subprocess as user ``nobody``; otherwise as the current user.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("mlflow", reason="install with: pip install 'mlflow>=3.10'")

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from factor_cli.cli.main import app
from factor_cli.ledger import LedgerError, start_run, store

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")
runner = CliRunner()
NOBODY = 65534


def _start(uri: str, **kw):
    args = {"study": "s", "method": "m", "env": "twx", "seed": 0, "backbone": "b"}
    return start_run({"a": 1}, tracking_uri=uri, **{**args, **kw})


def _one_line_error(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    line = res.output.strip()
    assert line.startswith("error:") and "\n" not in line and "Traceback" not in line, line
    return line


# ----------------------------------------------------------------------------- bad files


def test_garbage_bytes_db_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(bytes(range(256)) * 16)
    line = _one_line_error(["ledger", "report", "--tracking-uri", str(bad)])
    assert f"ledger {bad} is not an SQLite database" in line and "move it away" in line
    with pytest.raises(LedgerError, match="is not an SQLite database") as info:
        _start(str(bad))
    assert "\n" not in str(info.value)
    assert bad.read_bytes() == bytes(range(256)) * 16  # left as it was


def test_folder_and_damaged_db_are_one_line(tmp_path: Path, template_db: Path) -> None:
    folder = tmp_path / "dir.db"
    folder.mkdir()
    line = _one_line_error(["ledger", "report", "--tracking-uri", str(folder)])
    assert f"ledger {folder} is a folder" in line
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(template_db.read_bytes()[:8192])  # header intact, pages missing
    line = _one_line_error(["ledger", "report", "--tracking-uri", str(damaged)])
    assert f"ledger {damaged} cannot be opened" in line and "move it away" in line
    with pytest.raises(LedgerError, match="cannot be opened"):
        _start(str(damaged))


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder an unprivileged user can enter (pytest's tmp_path is private to its owner)."""
    path = Path(tempfile.mkdtemp(prefix="factor-ro-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):
        if sub.is_dir():
            sub.chmod(0o755)
    shutil.rmtree(path)


def _unprivileged() -> list[str]:
    """Command prefix that runs as ``nobody`` when we are root (else nothing)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root: read-only files need setpriv (util-linux) to drop root")
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import factor_cli.ledger"],
        capture_output=True, text=True, timeout=120, cwd="/",
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    if probe.returncode != 0:
        # A clone in a private folder (mktemp -d, a home others cannot enter): the unprivileged
        # user cannot run this checkout's Python or read its package at all.
        pytest.skip(
            f"the unprivileged user (uid {NOBODY}) cannot import factor_cli from this checkout "
            f"({Path(__file__).parents[2]} is not readable by others); run the suite from a "
            "world-readable clone to cover read-only ledgers"
        )
    return prefix


READ_ONLY_PROBE = textwrap.dedent(
    """
    import json, sys
    from factor_cli.ledger import LedgerError, runs_table, start_run

    out = {}
    for name in sys.argv[2:]:
        db = f"{sys.argv[1]}/{name}/mlflow.db"
        try:
            with start_run({"a": 1}, study="ro", method="m", env="twx", seed=0,
                           backbone="b", tracking_uri=db):
                pass
            out[name] = {"write": "ok"}
        except LedgerError as exc:
            out[name] = {"write": str(exc)}
        try:
            out[name]["read"] = len(runs_table(None, db))
        except LedgerError as exc:
            out[name]["read"] = str(exc)
    print(json.dumps(out))
    """
)


def test_read_only_database_and_folders_are_one_line(shared_dir: Path, template_db: Path) -> None:
    """file: a read-only database; folder: a writable database in a read-only folder; empty: no
    database yet in a read-only folder; artifacts: the artifacts folder is read-only."""
    for name in ("file", "folder", "empty", "artifacts"):
        (shared_dir / name).mkdir()
        if name != "empty":
            shutil.copy(template_db, shared_dir / name / "mlflow.db")
    (shared_dir / "file" / "mlflow.db").chmod(0o444)
    (shared_dir / "file").chmod(0o777)
    (shared_dir / "folder" / "mlflow.db").chmod(0o666)
    (shared_dir / "artifacts" / "mlflow.db").chmod(0o666)
    (shared_dir / "artifacts").chmod(0o777)
    (shared_dir / "artifacts" / "artifacts").mkdir(mode=0o555)
    for name in ("folder", "empty"):
        (shared_dir / name).chmod(0o555)
    script = shared_dir / "probe.py"
    script.write_text(READ_ONLY_PROBE)
    script.chmod(0o644)
    home = shared_dir / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    command = [sys.executable, str(script), str(shared_dir), "file", "folder", "empty", "artifacts"]
    proc = subprocess.run(
        [*_unprivileged(), *command], capture_output=True, text=True, timeout=300,
        cwd=shared_dir, env={**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    db = {name: shared_dir / name / "mlflow.db" for name in got}
    assert got["file"]["write"].startswith(f"ledger {db['file']} is read-only; make it writable")
    assert f"ledger {db['folder']} is in the read-only folder" in got["folder"]["write"]
    assert f"ledger {db['empty']} is in the read-only folder" in got["empty"]["write"]
    assert "artifacts in the read-only folder" in got["artifacts"]["write"]
    for result in got.values():
        assert "\n" not in result["write"] and "another store" in result["write"]
    # Reading a read-only ledger is fine: reports and exports work (the template has no runs).
    assert (got["file"]["read"], got["folder"]["read"]) == (0, 0)
    assert got["empty"]["read"].startswith("no ledger at")


# ----------------------------------------------------------------------------- lock and retries


def test_store_lock_is_exclusive(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    order: list[str] = []
    with store.store_lock(db, required=True):
        thread = threading.Thread(target=lambda: _locked_append(db, order))
        thread.start()
        time.sleep(0.3)
        order.append("first released")
    thread.join(10)
    assert order == ["first released", "second held"]
    assert (tmp_path / "mlflow.db.lock").exists()


def _locked_append(db: Path, order: list[str]) -> None:
    with store.store_lock(db, required=True):
        order.append("second held")


def test_retry_locked_retries_only_locked_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_sleep", lambda s: None)
    calls: list[int] = []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            cause = sqlite3.OperationalError("database is locked")
            raise MlflowException("(sqlite3.OperationalError) write failed") from cause
        return x * 2

    assert store.retry_locked(flaky, 21) == 42 and calls == [21, 21, 21]

    def broken() -> None:
        calls.append(0)
        raise MlflowException("no such table: runs")

    calls.clear()
    with pytest.raises(MlflowException, match="no such table"):
        store.retry_locked(broken)
    assert calls == [0]  # not retried

    def always_locked() -> None:
        calls.append(1)
        raise sqlite3.OperationalError("database is locked")

    calls.clear()
    monkeypatch.setattr(store, "RETRY_SECONDS", 0.0)  # no time left: the error goes through
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        store.retry_locked(always_locked)
    assert calls == [1]


def test_client_calls_are_retried(
    tmp_path: Path, template_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write SQLite refuses as locked is repeated by every ledger call, not lost."""
    db = tmp_path / "mlflow.db"
    shutil.copy(template_db, db)
    failures = [2]
    original = MlflowClient.log_batch

    def locked_twice(self, *args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            raise MlflowException("(sqlite3.OperationalError) database is locked")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(store, "_sleep", lambda s: None)
    with _start(f"sqlite:///{db}") as run:
        monkeypatch.setattr(MlflowClient, "log_batch", locked_twice)
        run.log_metrics({"loss": 0.5}, step=0)
    assert failures == [0]
    got = MlflowClient(f"sqlite:///{db}").get_run(run.run_id)
    assert got.data.metrics["loss"] == 0.5 and got.info.status == "FINISHED"


def test_writer_waits_for_another_transaction(tmp_path: Path, template_db: Path) -> None:
    """SQLite's busy timeout: a run logged while another connection holds the write lock for
    two seconds waits and lands, instead of failing with "database is locked"."""
    db = tmp_path / "mlflow.db"
    shutil.copy(template_db, db)
    uri = f"sqlite:///{db}"
    with _start(uri) as run:
        holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN EXCLUSIVE")
        release = threading.Timer(2.0, lambda: holder.execute("COMMIT"))
        release.start()
        t0 = time.monotonic()
        run.log_metrics({"loss": 1.0}, step=0)
        waited = time.monotonic() - t0
        release.join()
        holder.close()
    assert waited >= 1.5
    assert MlflowClient(uri).get_run(run.run_id).data.metrics["loss"] == 1.0
