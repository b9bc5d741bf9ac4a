"""Crash-safe file writes: write to a temporary file beside the target, then rename onto it.

A crashed or interrupted write leaves the previous file (or nothing) in place, never half a file.
:func:`build_lock` serialises builders of one shared output (a tiny model, a warm start) across
processes, so concurrent jobs (a study's cells) build it once and the others reuse it.
"""

from __future__ import annotations

import os
import tempfile

try:
    import fcntl
except ImportError:  # Windows: no flock; builders are not serialised there
    fcntl = None  # type: ignore[assignment]
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it gets the usual
    permissions and replaces ``path``; when it fails the temporary file is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (flushed to disk before the rename)."""
    with atomic_target(path) as tmp, tmp.open("w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``.<name>.lock`` beside ``target`` while building it.

    Blocks until no other process holds it; the caller re-checks whether ``target`` exists
    inside the block (another process may have built it meanwhile). The lock is released when
    the block ends or the process dies, so a crashed builder never blocks the next one.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    fd = os.open(target.parent / f".{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock
