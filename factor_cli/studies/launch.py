"""Launching a study's cells through submitit: local processes, a Slurm job array, or debug.

``run_study(matrix, options)`` prepares everything in the parent before any job starts (the
ledger store migrated and its experiment created once, every selected cell's config valid and
written to ``<study dir>/cells/<key>/config.yaml``), picks the cells to launch from their ledger
state (:func:`factor_cli.studies.state.to_launch`), and hands them to a launcher:

``local``  submitit's ``LocalExecutor`` (one process tree per cell). It has no queue, so the
           runner keeps at most ``max_parallel`` cells in flight, hands each its own GPUs
           (``visible_gpus``) and an equal share of this machine's cores (``OMP_NUM_THREADS``:
           two cells each on torch's default of every core spin at OpenMP barriers for cores
           the other holds, 3-5x slower per step; docs/benchmarks.md "Cells in parallel"),
           and waits; a cell another runner holds is waited for and then re-examined.
           ``timeout_min`` is set explicitly (submitit's local default is 2 min).
``slurm``  all cells in ONE job array (``--array=0-N%max_parallel``) with ``--requeue`` and
           submitit's pre-timeout signal (``--signal=USR2@signal_delay_s``): the job's
           ``checkpoint()`` stops the cell and requeues it, and the requeued job resumes the run.
           The runner submits and returns; ``factor study status`` follows the cells.
``debug``  submitit's ``DebugExecutor``: cells run one after another inside this process.

Ctrl-C on a local study stops its cells (each closes its ledger run KILLED, checkpoint intact),
waits for them to let go of their locks, and raises :class:`StudyInterrupted`; the next run
resumes them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from factor_cli.atomic import atomic_write_text
from factor_cli.registry import Registry

from .cell import CHILD_GRACE_S, CellJob, Outcome
from .matrix import Cell, Matrix, invalid_cells
from .state import CellState, is_locked, lock_path, matrix_states, to_launch

LOCAL_TIMEOUT_MIN = 7 * 24 * 60  # a week: a local cell is never cut by submitit's clock
SHARED_FS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs",
             "fuse.glusterfs", "panfs", "wekafs", "fuse.sshfs")  # fmt: skip


class StudyError(ValueError):
    """A study that cannot be launched as asked; one line naming the fix."""


class StudyInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a local study; ``cells`` are the labels of the cells that were stopped."""

    def __init__(self, cells: list[str]) -> None:
        super().__init__(f"{len(cells)} cell(s) stopped")
        self.cells = cells


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time_min: int = 24 * 60
    cpus_per_task: int | None = None
    mem: str | None = None
    setup: tuple[str, ...] = ()
    signal_delay_s: int = 120
    max_requeues: int = 20  # pre-timeout requeues per cell before submitit gives up
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchOptions:
    launcher: str = "local"
    max_parallel: int = 2
    gpus_per_job: int = 0
    retry_failed: int = 0
    force: bool = False
    dry_run: bool = False
    stale_after: float = 600.0
    timeout_min: int = LOCAL_TIMEOUT_MIN
    slurm: SlurmOptions = field(default_factory=SlurmOptions)


@dataclass
class LaunchPlan:
    """What ``run`` decided before launching: the states and the jobs to start."""

    states: list[CellState]
    jobs: list[CellJob]
    warnings: list[str]


# (what, job, outcome): "start", "end" (with its outcome), "wait" (busy elsewhere), "submitted"
Event = Callable[[str, CellJob, Outcome | None], None]


class Launcher(Protocol):
    """Starts the jobs; returns the outcomes it waited for (none for a queueing launcher)."""

    def __call__(
        self, matrix: Matrix, jobs: list[CellJob], options: LaunchOptions, on_event: Event
    ) -> list[Outcome]: ...


LAUNCHERS: Registry[Launcher] = Registry("launcher")


# ----------------------------------------------------------------------------- preparing


def _prepare_store(matrix: Matrix) -> str:
    """Create / migrate the store and its experiment once, here, before any job writes."""
    from factor_cli.ledger.store import (
        DEFAULT_EXPERIMENT,
        get_experiment_id,
        open_client,
        resolve_tracking_uri,
    )

    uri = resolve_tracking_uri(matrix.tracking_uri)
    client = open_client(uri, create=True)
    get_experiment_id(client, DEFAULT_EXPERIMENT, uri, create=True)
    return uri


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (from /proc/mounts; "" when unknown)."""
    try:
        mounts = [line.split()[:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return ""
    target = str(path.resolve())
    best, kind = "", ""
    for _, point, fstype in (m for m in mounts if len(m) == 3):
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind


def check_slurm_store(uri: str) -> None:
    """Refuse a SQLite ledger that compute nodes may not share (not on a network filesystem)."""
    from factor_cli.ledger.store import sqlite_path

    db = sqlite_path(uri)
    if db is None:
        return
    kind = filesystem_type(db.parent if not db.exists() else db)
    if kind not in SHARED_FS:
        raise StudyError(
            f"--launcher slurm: the ledger {db} is a SQLite file on a {kind or 'local'} "
            "filesystem that compute nodes may not share; run an MLflow tracking server and "
            "pass --tracking-uri http://HOST:PORT (see ledger/README.md)"
        )


def write_cell_config(matrix: Matrix, cell: Cell) -> Path:
    """``<study dir>/cells/<key>/config.yaml``: the cell's resolved config (what it trains)."""
    assert cell.config is not None
    path = matrix.output_dir / "cells" / cell.key / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = cell.config.model_dump()
    header = (
        f"# study {matrix.spec.name}, cell {cell.label}\n# = factor train --config "
        f"{matrix.base} " + " ".join(f"--set {item}" for item in cell.overrides) + "\n"
    )
    text = header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
    return path


def _job(matrix: Matrix, cell: Cell, options: LaunchOptions) -> CellJob:
    return CellJob(
        key=cell.key, label=cell.label, study=matrix.spec.name, spec_hash=matrix.spec_hash,
        base=matrix.base, variants=cell.variants, study_dir=str(matrix.output_dir.resolve()),
        cwd=os.getcwd(), tracking_uri=matrix.tracking_uri, launcher=options.launcher,
        gpus=options.gpus_per_job, retry_failed=options.retry_failed, force=options.force,
        stale_after=options.stale_after,
    )  # fmt: skip


def _check_local_devices(matrix: Matrix) -> None:
    """Cells that train on CUDA need a GPU here (a local launcher runs them on this machine)."""
    devices = [c.config.model.device for c in matrix.cells if c.config is not None]
    cuda = [d for d in devices if d.startswith("cuda")]
    if not cuda:
        return
    import torch

    if not torch.cuda.is_available():
        raise StudyError(
            f"{len(cuda)} cell(s) train on {cuda[0]} (base {matrix.base}) but this machine has "
            "no CUDA GPU; run them at CPU scale with --base smoke, or on a cluster with "
            "--launcher slurm"
        )


def plan_launch(matrix: Matrix, options: LaunchOptions) -> LaunchPlan:
    """The cells ``run`` would start, after checking everything that can be checked here.

    Raises:
        StudyError: an invalid cell is selected, an unknown launcher, a bad option.
        LedgerError: the store is unusable.
    """
    LAUNCHERS.get(options.launcher)  # an unknown launcher fails before anything is written
    if options.max_parallel < 1:
        raise StudyError(f"--max-parallel {options.max_parallel}: must be >= 1")
    if options.gpus_per_job < 0:
        raise StudyError(f"--gpus-per-job {options.gpus_per_job}: must be >= 0")
    bad = invalid_cells(matrix)
    if bad:
        envs = sorted({c.env for c in bad})
        raise StudyError(
            f"{len(bad)} cell(s) cannot run here, first {bad[0].label}: {bad[0].error}; leave "
            f"them out (e.g. --envs without {', '.join(envs)}) or fix the cause"
        )
    if options.launcher in ("local", "debug"):
        _check_local_devices(matrix)
    if options.dry_run:
        states = matrix_states(matrix, options.stale_after)
    else:
        uri = _prepare_store(matrix)
        if options.launcher == "slurm":
            check_slurm_store(uri)
        states = matrix_states(matrix, options.stale_after)
    jobs, warnings = [], []
    from factor_cli.ledger.provenance import git_state

    commit = git_state().commit
    for state in states:
        assert state.cell is not None
        if state.state == "finished" and state.git_commit and state.git_commit != commit:
            warnings.append(
                f"{state.cell.label}: finished at commit {state.git_commit[:10]}, this checkout "
                f"is {commit[:10]}; kept (--force runs it again)"
            )
        if to_launch(state, options.retry_failed, options.force):
            if not options.dry_run:
                write_cell_config(matrix, state.cell)
            jobs.append(_job(matrix, state.cell, options))
    return LaunchPlan(states, jobs, warnings)


def run_study(
    matrix: Matrix,
    options: LaunchOptions,
    on_event: Event | None = None,
    plan: LaunchPlan | None = None,
) -> tuple[LaunchPlan, list[Outcome]]:
    """Plan (unless given), then launch (unless ``dry_run``); returns the plan and the outcomes
    waited for."""
    plan = plan if plan is not None else plan_launch(matrix, options)
    if options.dry_run or not plan.jobs:
        return plan, []
    launcher = LAUNCHERS.get(options.launcher)
    return plan, launcher(matrix, plan.jobs, options, on_event or (lambda *a: None))


# ----------------------------------------------------------------------------- launchers


def _executor(matrix: Matrix, cluster: str, max_requeues: int = 3) -> Any:
    """submitit's executor for ``cluster``: the local one directly (AutoExecutor does not pass
    ``visible_gpus`` through), the others through ``AutoExecutor``."""
    import submitit

    folder = matrix.output_dir / "submitit" / "%j"
    if cluster == "local":
        return submitit.LocalExecutor(folder=str(folder))
    if cluster == "slurm":
        return submitit.AutoExecutor(
            folder=str(folder), cluster=cluster, slurm_max_num_timeout=max_requeues
        )
    return submitit.AutoExecutor(folder=str(folder), cluster=cluster)


def _visible_gpus(per_job: int) -> list[int]:
    if per_job == 0:
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        count = len([d for d in listed.split(",") if d.strip()])
    else:
        import torch

        count = torch.cuda.device_count()
    if count < per_job:
        raise StudyError(f"--gpus-per-job {per_job}: this machine shows {count} GPU(s)")
    return list(range(count))


class _LocalPool:
    """At most ``max_parallel`` cells in flight, each with its own GPUs."""

    def __init__(self, matrix: Matrix, options: LaunchOptions, on_event: Event, jobs: int) -> None:
        self.matrix, self.options, self.on_event = matrix, options, on_event
        self.executor = _executor(matrix, "local")
        self.free = _visible_gpus(options.gpus_per_job)
        per_job = max(options.gpus_per_job, 1)
        limit = len(self.free) // per_job if options.gpus_per_job else options.max_parallel
        self.slots = max(1, min(options.max_parallel, limit))
        self.threads = cell_threads(min(self.slots, jobs))
        self.flight: list[tuple[Any, CellJob, list[int]]] = []
        self.outcomes: list[Outcome] = []

    def start(self, job: CellJob) -> None:
        gpus = [self.free.pop(0) for _ in range(self.options.gpus_per_job)]
        job = replace(job, threads=self.threads)
        self.executor.update_parameters(
            timeout_min=self.options.timeout_min, tasks_per_node=1, gpus_per_node=len(gpus),
            visible_gpus=tuple(gpus),
        )  # fmt: skip
        self.flight.append((self.executor.submit(job), job, gpus))
        self.on_event("start", job, None)

    def collect(self) -> list[CellJob]:
        """Finished jobs' outcomes; returns the jobs that found their cell busy."""
        busy, still = [], []
        for sub, job, gpus in self.flight:
            if not sub.done():
                still.append((sub, job, gpus))
                continue
            self.free.extend(gpus)
            outcome = _result(sub, job)
            if outcome.outcome == "busy":
                busy.append(job)
                self.on_event("wait", job, outcome)
            else:
                self.outcomes.append(outcome)
                self.on_event("end", job, outcome)
        self.flight = still
        return busy

    def stop(self) -> list[str]:
        """Ctrl-C: stop every cell in flight and wait until each let go of its lock."""
        for sub, _, _ in self.flight:
            sub.cancel(check=False)
        deadline = time.monotonic() + CHILD_GRACE_S
        study_dir = self.matrix.output_dir
        for _, job, _ in self.flight:
            while is_locked(lock_path(study_dir, job.key)) and time.monotonic() < deadline:
                time.sleep(0.5)
        return [job.label for _, job, _ in self.flight]


def cell_threads(slots: int, cores: int | None = None) -> int:
    """Each of ``slots`` cells' share of the cores this process may use (at least one)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(slots, 1))


def _result(sub: Any, job: CellJob) -> Outcome:
    try:
        return sub.result()
    except Exception as exc:  # the job process itself died (not the training: that is caught)
        text = str(exc).strip().splitlines()
        return Outcome(job.key, "failed", reason=(text[-1] if text else repr(exc))[:500])


@LAUNCHERS.register("local")
def launch_local(
    matrix: Matrix, jobs: list[CellJob], options: LaunchOptions, on_event: Event
) -> list[Outcome]:
    """Run the cells here, ``max_parallel`` at a time; waits for all of them."""
    pool = _LocalPool(matrix, options, on_event, len(jobs))
    queue, waiting = list(jobs), []
    try:
        while queue or pool.flight or waiting:
            while queue and len(pool.flight) < pool.slots:
                pool.start(queue.pop(0))
            waiting += pool.collect()
            ready = [j for j in waiting if not is_locked(lock_path(matrix.output_dir, j.key))]
            waiting = [j for j in waiting if j not in ready]
            queue += ready  # re-examined under its lock: finished elsewhere, or resumable
            time.sleep(0.5)
    except KeyboardInterrupt:
        raise StudyInterrupted(pool.stop()) from None
    return pool.outcomes


@LAUNCHERS.register("debug")
def launch_debug(
    matrix: Matrix, jobs: list[CellJob], options: LaunchOptions, on_event: Event
) -> list[Outcome]:
    """Run the cells one by one in this process (submitit's debug executor)."""
    executor = _executor(matrix, "debug")
    executor.update_parameters(timeout_min=options.timeout_min)
    outcomes = []
    for job in jobs:
        on_event("start", job, None)
        outcome = _result(executor.submit(job), job)
        outcomes.append(outcome)
        on_event("end", job, outcome)
    return outcomes


def slurm_parameters(matrix: Matrix, options: LaunchOptions, count: int) -> dict[str, Any]:
    """The submitit parameters of the study's job array (one task per cell, G GPUs each)."""
    s = options.slurm
    params: dict[str, Any] = {
        "name": f"factor-{matrix.spec.name}",
        "timeout_min": s.time_min,
        "tasks_per_node": 1,
        "nodes": 1,
        "slurm_array_parallelism": min(options.max_parallel, count),
        "slurm_signal_delay_s": s.signal_delay_s,
        "slurm_setup": list(s.setup),
        "slurm_additional_parameters": {"requeue": True, **s.extra},
    }
    if options.gpus_per_job:
        params["gpus_per_node"] = options.gpus_per_job
    optional = {"slurm_partition": s.partition, "slurm_account": s.account,
                "cpus_per_task": s.cpus_per_task, "slurm_mem": s.mem}  # fmt: skip
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


@LAUNCHERS.register("slurm")
def launch_slurm(
    matrix: Matrix, jobs: list[CellJob], options: LaunchOptions, on_event: Event
) -> list[Outcome]:
    """Submit every cell in one job array and return (the cells run on the cluster)."""
    executor = _executor(matrix, "slurm", options.slurm.max_requeues)
    executor.update_parameters(**slurm_parameters(matrix, options, len(jobs)))
    with executor.batch():
        subs = [executor.submit(job) for job in jobs]
    for sub, job in zip(subs, jobs):
        on_event("submitted", job, Outcome(job.key, "submitted", reason=f"slurm job {sub.job_id}"))
    return []
