"""Where every cell of a study stands, read from the ledger and the cells' lock files.

A cell's ledger run is the training run tagged ``study`` = the spec's name and ``cell_key`` = the
cell's config hash that no later run superseded (tag ``study.superseded_by``, written when a
cell without a checkpoint had to start over). Its state:

    finished  the run is FINISHED (re-runs skip it)
    running   the run is RUNNING and alive: its cell lock is held, or (a Slurm cell on another
              node) its heartbeat is younger than ``stale_after`` seconds
    stale     RUNNING but nobody holds its lock and its heartbeat is old: a killed runner or
              machine; re-runs resume it
    killed    KILLED (Ctrl-C, SIGTERM, a Slurm pre-timeout): re-runs resume it
    failed    FAILED, or its last attempt failed before a ledger run opened; retried only with
              ``--retry-failed K`` while it has failed at most K times
    pending   never started
    invalid   its config cannot run here (:attr:`Cell.error`)

Attempts (every launch of a cell, with outcome and reason) are kept in
``<study dir>/cells/<key>/attempts.jsonl`` by :mod:`factor_cli.studies.cell`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .matrix import Cell, Matrix

# Ledger tags a cell's run carries (besides the identity tags study/method/env/seed/backbone).
T_CELL = "cell_key"
T_SPEC = "spec_hash"
T_ATTEMPT = "attempt"
T_LAUNCHER = "launcher"
T_BASE = "study.base"
T_VARIANTS = "study.variants"
T_SUPERSEDED = "study.superseded_by"
T_SLURM_JOB = "study.slurm_job"
T_HEARTBEAT = "ledger.heartbeat"
STATES = ("finished", "running", "stale", "killed", "failed", "pending", "invalid")
RESUMABLE = ("stale", "killed")
STALE_AFTER_S = 600.0  # a remote (Slurm) cell silent this long is presumed dead


@dataclass(frozen=True)
class Attempt:
    """One launch of a cell (a line of its ``attempts.jsonl``)."""

    attempt: int
    outcome: str  # finished | failed | killed | skipped | busy
    run_id: str | None = None
    exit_code: int | None = None
    reason: str = ""
    started: str = ""
    ended: str = ""
    launcher: str = ""


@dataclass
class CellState:
    """A cell and where it stands (see the module docstring for the states)."""

    key: str
    state: str
    run_id: str | None = None
    reason: str = ""
    attempts: int = 0
    failures: int = 0
    heartbeat: str = ""
    git_commit: str = ""
    tags: dict[str, str] = field(default_factory=dict, repr=False)
    hours: dict[str, float] = field(default_factory=dict)
    duplicates: int = 0  # more live runs claimed this cell (should stay 0)
    cell: Cell | None = field(default=None, repr=False)


# ----------------------------------------------------------------------------- folders & locks


def cell_dir(study_dir: Path, key: str) -> Path:
    """``<study dir>/cells/<key>``: the cell's config, attempts and logs."""
    return Path(study_dir) / "cells" / key


def lock_path(study_dir: Path, key: str) -> Path:
    return cell_dir(study_dir, key) / "cell.lock"


@contextlib.contextmanager
def try_lock(path: Path) -> Iterator[int | None]:
    """Hold the cell's lock (an ``flock``) for the block; yields its fd, or None if held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_locked(path: Path) -> bool:
    """Whether some process holds the cell's lock now (a probe of microseconds)."""
    if not path.exists():
        return False
    with try_lock(path) as fd:
        return fd is None


def read_attempts(study_dir: Path, key: str) -> list[Attempt]:
    """The cell's attempts, oldest first (a torn last line from a crash is ignored)."""
    path = cell_dir(study_dir, key) / "attempts.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(Attempt(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out


# ----------------------------------------------------------------------------- the ledger


def search_runs(tracking_uri: str | None, filter_string: str) -> list[Any]:
    """Runs of the ledger's experiment matching ``filter_string`` (MLflow search syntax).

    An empty list when the store or the experiment does not exist yet (nothing was run).
    """
    from factor_cli.ledger.report import _search
    from factor_cli.ledger.store import (
        DEFAULT_EXPERIMENT,
        LedgerError,
        get_experiment_id,
        open_client,
        resolve_tracking_uri,
        sqlite_path,
    )

    uri = resolve_tracking_uri(tracking_uri)
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        return []
    client = open_client(uri, create=False)
    exp_id = get_experiment_id(client, DEFAULT_EXPERIMENT, uri, create=False)
    if exp_id is None:
        return []
    try:
        return list(_search(client, exp_id, filter_string))
    except Exception as exc:
        raise LedgerError(f"cannot search the runs in {uri} ({filter_string}): {exc}") from None


def study_runs(study: str, tracking_uri: str | None) -> dict[str, list[Any]]:
    """Training runs of ``study`` that carry a cell key, by key, newest first."""
    from factor_cli.ledger.report import _quote

    found: dict[str, list[Any]] = {}
    for run in search_runs(tracking_uri, f"tags.study = {_quote(study)}"):
        tags = run.data.tags
        if tags.get("kind", "train") == "train" and T_CELL in tags:
            found.setdefault(tags[T_CELL], []).append(run)
    for runs in found.values():
        runs.sort(key=lambda r: r.info.start_time or 0, reverse=True)
    return found


def _age_s(stamp: str) -> float:
    """Seconds since an ISO stamp (one without a zone is UTC, as the ledger writes them)."""
    try:
        then = datetime.fromisoformat(stamp)
    except ValueError:
        return float("inf")
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - then).total_seconds()


def _hours(tags: dict[str, str]) -> dict[str, float]:
    from factor_cli.ledger.runs import GPUS_PER_NODE, T_CORE, T_GPU, T_WALL

    def num(key: str) -> float:
        try:
            return float(tags.get(key, 0.0))
        except ValueError:
            return 0.0

    return {
        "wall_clock_hours": num(T_WALL) / 3600,
        "node_hours": num(T_GPU) / 3600 / GPUS_PER_NODE,
        "cpu_core_hours": num(T_CORE) / 3600,
    }


def _run_state(run: Any, locked: bool, stale_after: float) -> str:
    status = run.info.status
    if status == "FINISHED":
        return "finished"
    if status == "FAILED":
        return "failed"
    if status == "KILLED":
        return "killed"
    if locked:
        return "running"
    tags = run.data.tags
    remote = tags.get(T_LAUNCHER) == "slurm"
    if remote and _age_s(tags.get(T_HEARTBEAT, "")) < stale_after:
        return "running"
    return "stale"


def cell_state(
    cell: Cell, study_dir: Path, runs: list[Any], stale_after: float = STALE_AFTER_S
) -> CellState:
    """One cell's :class:`CellState` from its ledger runs (newest first) and attempts file."""
    if cell.error is not None:
        return CellState(cell.key, "invalid", reason=cell.error, cell=cell)
    locked = is_locked(lock_path(study_dir, cell.key))
    state = state_of(cell.key, study_dir, runs, stale_after, locked)
    state.cell = cell
    return state


def state_of(
    key: str, study_dir: Path, runs: list[Any], stale_after: float, locked: bool
) -> CellState:
    """The state of cell ``key`` given its runs and whether another process holds its lock."""
    attempts = read_attempts(study_dir, key)
    failures = sum(a.outcome == "failed" for a in attempts)
    live = [r for r in runs if T_SUPERSEDED not in r.data.tags]
    if not live:
        last = attempts[-1] if attempts else None
        if locked:
            state = "running"
        elif last is not None and last.outcome == "failed":
            state = "failed"
        else:
            state = "pending"
        reason = last.reason if last is not None and state == "failed" else ""
        return CellState(key, state, reason=reason, attempts=len(attempts), failures=failures)
    run = next((r for r in live if r.info.status == "FINISHED"), live[0])
    tags = dict(run.data.tags)
    state = _run_state(run, locked, stale_after)
    reason = tags.get("error", "") if state == "failed" else ""
    if state == "failed" and not reason and attempts:
        reason = attempts[-1].reason
    return CellState(
        key, state, run.info.run_id, reason, len(attempts), failures,
        tags.get(T_HEARTBEAT, ""), tags.get("git_commit", ""), tags, _hours(tags),
        len(live) - 1,
    )  # fmt: skip


def matrix_states(matrix: Matrix, stale_after: float = STALE_AFTER_S) -> list[CellState]:
    """Every cell's state, in matrix order (one ledger query for the whole study)."""
    runs = study_runs(matrix.spec.name, matrix.tracking_uri)
    return [
        cell_state(c, matrix.output_dir, runs.get(c.key, []), stale_after) for c in matrix.cells
    ]


def to_launch(state: CellState, retry_failed: int, force: bool) -> bool:
    """Whether ``study run`` starts (or resumes) this cell."""
    if state.state in ("pending", *RESUMABLE):
        return True
    if state.state == "failed":
        return force or (retry_failed > 0 and state.failures <= retry_failed)
    if state.state == "finished":
        return force
    return False
