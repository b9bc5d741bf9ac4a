"""One cell's job, as submitit runs it: claim the cell, then start or resume its ``factor train``.

The job (:class:`CellJob`, a picklable callable) runs on the machine that executes the cell:

1. it takes the cell's lock (``<study dir>/cells/<key>/cell.lock``, an ``flock``); if another
   process holds it, the cell is being run elsewhere and the job returns ``busy`` at once;
2. holding the lock, it reads the cell's ledger runs again and decides: a FINISHED run is
   skipped; a KILLED, FAILED (when retries allow) or stale RUNNING run with a checkpoint is
   resumed under its run id (``factor train --resume``); without a checkpoint, or with
   ``force``, a new run starts and the old one is tagged ``study.superseded_by``, so the
   ledger's live runs stay one per cell;
3. it runs ``factor train --config <cell>/config.yaml --tag ...`` (``torchrun`` of it when the
   cell has several GPUs) as a child process that inherits the lock, so the lock is held until
   the training process itself is gone, and appends the attempt to ``attempts.jsonl``.

Deciding under the lock is what makes two runners of one study safe: the second finds the cell
claimed, or finds the first one's finished run. Ctrl-C reaches the child (same process group)
and closes its ledger run KILLED; the Slurm pre-timeout signal calls :meth:`CellJob.checkpoint`,
which stops the child (SIGTERM: KILLED, checkpoint intact) and requeues the same job, which then
resumes the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .state import (
    T_ATTEMPT,
    T_BASE,
    T_CELL,
    T_LAUNCHER,
    T_SLURM_JOB,
    T_SPEC,
    T_SUPERSEDED,
    T_VARIANTS,
    Attempt,
    cell_dir,
    lock_path,
    read_attempts,
    state_of,
    study_runs,
    to_launch,
    try_lock,
)

EXIT_INTERRUPTED = (130, 143, -2, -15)  # Ctrl-C / SIGTERM of the training process
CHILD_GRACE_S = 120.0  # how long a stopped child may take to close its ledger run


def _ignore_preemption_signal() -> None:
    """In the child: Slurm's pre-timeout USR2 reaches every process of the job step, but only
    the job acts on it (:meth:`CellJob.checkpoint` stops the child with SIGTERM). An ignored
    signal stays ignored across exec, so torchrun's workers ignore it too."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def slurm_job_id() -> str:
    """This Slurm job's id (``ARRAYJOB_TASK`` for an array task); "" outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID", "")


@dataclass(frozen=True)
class Outcome:
    """What a cell's job did (returned to the runner through submitit)."""

    key: str
    outcome: str  # finished | failed | killed | skipped | busy
    run_id: str | None = None
    exit_code: int | None = None
    reason: str = ""
    attempt: int = 0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _last_line(log: Path) -> str:
    """The last meaningful line of a log: the one-line error ``factor train`` prints."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error:")]
    return (errors or lines or [""])[-1][:500]


@dataclass
class CellJob:
    """The submitit job of one cell (see the module docstring)."""

    key: str
    label: str
    study: str
    spec_hash: str
    base: str
    variants: list[str]
    study_dir: str
    cwd: str
    tracking_uri: str | None
    launcher: str
    gpus: int = 0
    retry_failed: int = 0
    force: bool = False
    stale_after: float = 600.0
    threads: int = 0  # intra-op threads of the child (OMP_NUM_THREADS); 0: torch's default
    _child: Any = field(default=None, repr=False, compare=False)
    _attempt: Any = field(default=None, repr=False, compare=False)  # (n, started, log, resume)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_child"] = state["_attempt"] = None  # a process does not travel
        return state

    @property
    def folder(self) -> Path:
        return cell_dir(Path(self.study_dir), self.key)

    @property
    def config_path(self) -> Path:
        return self.folder / "config.yaml"

    def __call__(self) -> Outcome:
        os.chdir(self.cwd)
        for _ in range(5):  # a runner's lock probe holds the lock for microseconds
            with try_lock(lock_path(Path(self.study_dir), self.key)) as fd:
                if fd is not None:
                    return self._run_claimed(fd)
            time.sleep(0.1)
        return Outcome(self.key, "busy", reason="another process is running this cell")

    def _run_claimed(self, fd: int) -> Outcome:
        runs = study_runs(self.study, self.tracking_uri).get(self.key, [])
        study_dir = Path(self.study_dir)
        state = state_of(self.key, study_dir, runs, self.stale_after, locked=False)
        this_job = slurm_job_id()
        if state.state == "running" and this_job and state.tags.get(T_SLURM_JOB) == this_job:
            state.state = "stale"  # Slurm requeued this job (node failure): its old run is dead
        if state.state == "running":  # a Slurm cell alive on another node
            return Outcome(self.key, "busy", state.run_id, reason="running on another node")
        if not to_launch(state, self.retry_failed, self.force):
            outcome = "skipped" if state.state == "finished" else state.state
            return Outcome(self.key, outcome, state.run_id, reason=state.reason)
        attempt = len(read_attempts(study_dir, self.key)) + 1
        resume = state.run_id if state.state != "finished" or not self.force else None
        if resume is not None and not self._has_checkpoint(resume):
            resume = None
        if state.run_id is not None and resume is None:
            self._supersede(state.run_id, attempt)
        started = _now()
        code, log = self._train(fd, attempt, resume)
        return self._record(attempt, started, code, log, resume)

    def _has_checkpoint(self, run_id: str) -> bool:
        from factor_cli.train.checkpoint import latest
        from factor_cli.train.config import load_config

        output_dir = Path(load_config(str(self.config_path)).output_dir)
        last = latest(output_dir / run_id)
        return last is not None and last.is_dir()

    def _supersede(self, run_id: str, attempt: int) -> None:
        from factor_cli.ledger.store import open_client, resolve_tracking_uri

        client = open_client(resolve_tracking_uri(self.tracking_uri), create=False)
        client.set_tag(run_id, T_SUPERSEDED, f"attempt {attempt} of cell {self.key[:12]}")

    def command(self, attempt: int, resume: str | None) -> list[str]:
        """The ``factor train`` (or ``torchrun ... train``) command of this attempt."""
        tags = {
            T_CELL: self.key, T_SPEC: self.spec_hash, T_ATTEMPT: attempt,
            T_LAUNCHER: self.launcher, T_BASE: self.base, T_VARIANTS: json.dumps(self.variants),
        }  # fmt: skip
        if slurm_job_id():
            tags[T_SLURM_JOB] = slurm_job_id()
        args = ["train", "--config", str(self.config_path)]
        args += [part for k, v in tags.items() for part in ("--tag", f"{k}={v}")]
        if resume is not None:
            args += ["--resume", resume]
        if self.gpus > 1:
            run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            return [*run, f"--nproc_per_node={self.gpus}", "-m", "factor_cli", *args]
        return [sys.executable, "-m", "factor_cli", *args]

    def _train(self, fd: int, attempt: int, resume: str | None) -> tuple[int, Path]:
        """Run the child with the lock fd inherited; Ctrl-C waits for it to close its run."""
        log = self.folder / f"attempt-{attempt}.log"
        env = {**os.environ, "FACTOR_STUDY_CELL": self.key}
        if self.threads and "OMP_NUM_THREADS" not in os.environ:  # the user's setting wins
            env["OMP_NUM_THREADS"] = str(self.threads)
        self._attempt = (attempt, _now(), log, resume)
        with log.open("ab") as out:
            child = self._child = subprocess.Popen(
                self.command(attempt, resume), stdout=out, stderr=subprocess.STDOUT,
                pass_fds=(fd,), env=env, preexec_fn=_ignore_preemption_signal,
            )  # fmt: skip
            try:  # poll, not wait(): checkpoint() runs in a signal handler on this thread and
                # must be able to wait on the child itself (wait() holds Popen's waitpid lock)
                while (code := child.poll()) is None:
                    time.sleep(0.5)
                return code, log
            except KeyboardInterrupt:
                self._stop_child(signal.SIGINT)
                return child.returncode if child.returncode is not None else 130, log

    def _stop_child(self, sig: int) -> None:
        child = self._child
        if child is None or child.poll() is not None:
            return
        child.send_signal(sig)
        try:
            child.wait(CHILD_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def _record(
        self, attempt: int, started: str, code: int, log: Path, resumed: str | None
    ) -> Outcome:
        runs = study_runs(self.study, self.tracking_uri).get(self.key, [])
        live = [r for r in runs if T_SUPERSEDED not in r.data.tags]
        run_id = live[0].info.run_id if live else resumed
        if code == 0:
            outcome, reason = "finished", ""
        elif code in EXIT_INTERRUPTED:
            outcome, reason = "killed", "interrupted"
        else:
            tags = live[0].data.tags if live else {}
            outcome, reason = "failed", tags.get("error") or _last_line(log)
        record = Attempt(attempt, outcome, run_id, code, reason, started, _now(), self.launcher)
        with (self.folder / "attempts.jsonl").open("a") as fh:
            fh.write(json.dumps(asdict(record)) + "\n")
        return Outcome(self.key, outcome, run_id, code, reason, attempt)

    def checkpoint(self) -> Any:
        """Slurm's pre-timeout signal: stop the child (its run closes KILLED), record the
        attempt, and requeue this job (which then resumes the run)."""
        from submitit.helpers import DelayedSubmission

        child = self._child
        self._stop_child(signal.SIGTERM)
        if child is not None and self._attempt is not None:
            attempt, started, log, resume = self._attempt
            self._record(attempt, started, child.returncode or 143, log, resume)
        self._attempt = None  # recorded once
        return DelayedSubmission(self)
