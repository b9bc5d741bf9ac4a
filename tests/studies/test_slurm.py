"""The Slurm launcher without Slurm (issue 11's proof): fake ``sbatch``/``srun`` on PATH.

``run_study(..., launcher="slurm")`` goes through submitit's real Slurm executor; the fake
``sbatch`` keeps a copy of the script it is given and answers ``Submitted batch job 4242``, the
fake ``srun`` only exists (submitit refuses a machine without it). The tests read back what a
cluster would get: the ``#SBATCH`` lines (array range and parallelism, GPUs and tasks per node,
the pre-timeout signal, requeue, partition/account/time, job name), the setup lines before the
``srun`` line, and the pickled job of every array task (the cell it runs and its ``factor
train``/``torchrun`` command). Nothing is trained and no Slurm command runs for real.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from factor_cli.ledger import store
from factor_cli.studies import cell as cell_module
from factor_cli.studies import launch
from factor_cli.studies.cell import CellJob
from factor_cli.studies.launch import LaunchOptions, SlurmOptions, StudyError, run_study
from factor_cli.studies.matrix import Matrix, Options, cell_key, expand
from factor_cli.studies.spec import load_spec
from factor_cli.studies.state import T_ATTEMPT, T_CELL, T_LAUNCHER, T_SPEC
from factor_cli.train.config import load_config

submitit = pytest.importorskip("submitit", reason="pip install submitit")
from submitit.core.utils import DelayedSubmission  # noqa: E402

JOB_ID = "4242"
SETUP = ("module load cuda", "source venv/bin/activate")
SLURM = SlurmOptions(partition="gpu", account="acct", time_min=120, setup=SETUP, signal_delay_s=120)
SPEC = """\
    name: slurmtest
    base: smoke
    envs: [twx]
    seeds: [42, 43]
    set: {steps: 1}
    rows:
      - {name: grpo}
      - {name: factor}
    """

# Every fake logs its argv to $FAKE_SLURM_LOG; sbatch also keeps the script it submits.
FAKE_SBATCH = """#!/bin/sh
echo "sbatch $*" >> "$FAKE_SLURM_LOG"
n=$(ls "$FAKE_SLURM_CAPTURE" | wc -l)
cp "$1" "$FAKE_SLURM_CAPTURE/sbatch-$n.sh"
echo "Submitted batch job 4242"
"""
FAKE_OTHER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_SLURM_LOG"
"""
FAKE_SRUN = """#!/bin/sh
echo "srun $*" >> "$FAKE_SLURM_LOG"
exit 1
"""


@dataclass
class FakeSlurm:
    """Where the fakes write: the scripts ``sbatch`` got and every fake command's argv."""

    capture: Path
    log: Path

    def scripts(self) -> list[str]:
        return [p.read_text() for p in sorted(self.capture.glob("sbatch-*.sh"))]

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    bin_dir, capture = tmp_path / "fake-bin", tmp_path / "sbatch-capture"
    bin_dir.mkdir()
    capture.mkdir()
    bodies = {"sbatch": FAKE_SBATCH, "srun": FAKE_SRUN}
    for name in ("sbatch", "srun", "sacct", "scontrol", "squeue", "scancel"):
        path = bin_dir / name
        path.write_text(bodies.get(name, FAKE_OTHER))
        path.chmod(0o755)
    log = tmp_path / "slurm-calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_CAPTURE", str(capture))
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    return FakeSlurm(capture, log)


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty, migrated MLflow SQLite database (migrating takes seconds: done once)."""
    path = tmp_path_factory.mktemp("slurm-ledger") / "mlflow.db"
    store.open_client(f"sqlite:///{path}", create=True)
    return path


def _matrix(tmp_path: Path, template_db: Path, **options: object) -> Matrix:
    """The 4-cell spec (2 rows x twx x seeds 42, 43) writing and logging under ``tmp_path``."""
    db = tmp_path / "ledger" / "mlflow.db"
    db.parent.mkdir(exist_ok=True)
    shutil.copy(template_db, db)
    spec_file = tmp_path / "slurmtest.yaml"
    spec_file.write_text(textwrap.dedent(SPEC))
    spec, path = load_spec(str(spec_file))
    overrides = [f"output_dir={tmp_path}/runs", f"tracking_uri=sqlite:///{db}"]
    return expand(spec, path, Options(overrides=overrides, **options))  # type: ignore[arg-type]


@pytest.fixture
def shared_fs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the SQLite ledger sits on NFS (what a cluster's shared home would be)."""
    monkeypatch.setattr(launch, "filesystem_type", lambda path: "nfs")


def _sbatch_lines(script: str) -> dict[str, str]:
    """``#SBATCH --key=value`` lines as {key: value} (value "" for a bare flag)."""
    flags = {}
    for m in re.finditer(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, flags=re.M):
        flags[m.group(1)] = m.group(2) or ""
    return flags


def _array_jobs(matrix: Matrix, count: int) -> list[CellJob]:
    """The job each array task ``4242_<i>`` unpickles and runs (submitit's ``_submit``)."""
    folder = matrix.output_dir / "submitit"
    pickles = sorted(folder.glob("*/*_submitted.pkl"))
    expected = [folder / f"{JOB_ID}_{i}" / f"{JOB_ID}_{i}_submitted.pkl" for i in range(count)]
    assert pickles == expected
    jobs = []
    for path in pickles:
        delayed = DelayedSubmission.load(path)
        assert isinstance(delayed.function, CellJob)
        assert delayed.args == () and delayed.kwargs == {}
        jobs.append(delayed.function)
    return jobs


def _slurm_options(gpus: int) -> LaunchOptions:
    return LaunchOptions(launcher="slurm", max_parallel=3, gpus_per_job=gpus, slurm=SLURM)


# ----------------------------------------------------------------------------- the job array


def test_one_array_with_parallelism_gpus_signal_requeue_and_setup(
    tmp_path: Path, template_db: Path, fake_slurm: FakeSlurm, shared_fs: None
) -> None:
    matrix = _matrix(tmp_path, template_db)
    assert len(matrix.cells) == 4
    events: list[tuple[str, str, str]] = []
    plan, outcomes = run_study(
        matrix, _slurm_options(2), lambda what, job, out: events.append((what, job.key, out.reason))
    )
    assert outcomes == []  # a queueing launcher submits and returns
    assert [j.key for j in plan.jobs] == [c.key for c in matrix.cells]

    [script] = fake_slurm.scripts()  # ONE sbatch for all cells
    assert [c.split()[0] for c in fake_slurm.calls()] == ["sbatch"]  # no srun/sacct/scontrol here
    flags = _sbatch_lines(script)
    assert flags["array"] == "0-3%3"  # 4 cells, at most max_parallel=3 at once
    assert flags["gpus-per-node"] == "2"
    assert flags["ntasks-per-node"] == "1"
    assert flags["nodes"] == "1"
    assert flags["signal"] == "USR2@120"  # submitit's pre-timeout signal -> CellJob.checkpoint
    assert flags["requeue"] == ""
    assert flags["partition"] == "gpu"
    assert flags["account"] == "acct"
    assert flags["time"] == "120"
    assert flags["job-name"] == "factor-slurmtest"
    assert "%A_%a" in flags["output"]  # one log per array task

    lines = script.splitlines()
    srun = [i for i, line in enumerate(lines) if line.startswith("srun ")]
    assert len(srun) == 1
    setup_at = [lines.index(line) for line in SETUP]
    assert setup_at == sorted(setup_at) and setup_at[-1] < srun[0]  # in order, before srun
    assert f"-m submitit.core._submit {matrix.output_dir / 'submitit' / '%j'}" in lines[srun[0]]

    assert events == [("submitted", c.key, f"slurm job {JOB_ID}_{i}")
                      for i, c in enumerate(matrix.cells)]  # fmt: skip


def test_each_array_task_runs_its_cell_through_torchrun(
    tmp_path: Path, template_db: Path, fake_slurm: FakeSlurm, shared_fs: None
) -> None:
    matrix = _matrix(tmp_path, template_db)
    run_study(matrix, _slurm_options(2))
    jobs = _array_jobs(matrix, len(matrix.cells))
    assert [j.key for j in jobs] == [c.key for c in matrix.cells]  # task i runs cell i
    for job, cell in zip(jobs, matrix.cells):
        assert (job.launcher, job.gpus, job.study) == ("slurm", 2, "slurmtest")
        assert job.study_dir == str(matrix.output_dir.resolve())
        assert job.tracking_uri == matrix.tracking_uri
        config = job.config_path
        assert config == matrix.output_dir.resolve() / "cells" / cell.key / "config.yaml"
        assert cell_key(load_config(str(config))) == cell.key  # what the node trains = the cell
        command = job.command(1, None)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node=2", "-m", "factor_cli", "train", "--config",
                    str(config)]  # fmt: skip
        assert command[: len(torchrun)] == torchrun
        tags = _tags(command)
        assert tags[T_CELL] == cell.key
        assert tags[T_LAUNCHER] == "slurm"
        assert tags[T_ATTEMPT] == "1"
        assert tags[T_SPEC] == matrix.spec_hash
        assert "--resume" not in command
        assert job.command(2, "run123")[-2:] == ["--resume", "run123"]


def _tags(command: list[str]) -> dict[str, str]:
    values = [command[i + 1] for i, part in enumerate(command) if part == "--tag"]
    return dict(v.split("=", 1) for v in values)


def test_cpu_cells_have_no_gpu_line_and_run_plain_factor_train(
    tmp_path: Path, template_db: Path, fake_slurm: FakeSlurm, shared_fs: None
) -> None:
    matrix = _matrix(tmp_path, template_db)
    run_study(matrix, _slurm_options(0))
    [script] = fake_slurm.scripts()
    flags = _sbatch_lines(script)
    assert not [k for k in flags if "gpu" in k or k == "gres"]
    assert flags["array"] == "0-3%3"
    for job in _array_jobs(matrix, 4):
        assert job.gpus == 0
        command = job.command(1, None)
        head = [sys.executable, "-m", "factor_cli", "train", "--config", str(job.config_path)]
        assert command[: len(head)] == head
        assert "torch.distributed.run" not in command


def test_one_pending_cell_is_a_plain_job_still_requeued(
    tmp_path: Path, template_db: Path, fake_slurm: FakeSlurm, shared_fs: None
) -> None:
    """submitit submits a batch of one as a plain job (no --array): same signal and requeue."""
    matrix = _matrix(tmp_path, template_db, rows=["factor"], seeds=[42])
    assert len(matrix.cells) == 1
    run_study(matrix, _slurm_options(1))
    [script] = fake_slurm.scripts()
    flags = _sbatch_lines(script)
    assert "array" not in flags
    assert (flags["signal"], flags["requeue"], flags["gpus-per-node"]) == ("USR2@120", "", "1")
    pickle = matrix.output_dir / "submitit" / JOB_ID / f"{JOB_ID}_submitted.pkl"
    job = DelayedSubmission.load(pickle).function
    assert job.key == matrix.cells[0].key
    assert job.command(1, None)[1:3] == ["-m", "factor_cli"]  # one GPU: no torchrun


# ----------------------------------------------------------------------------- the ledger check


def test_sqlite_ledger_on_a_local_disk_is_refused(
    tmp_path: Path, template_db: Path, fake_slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "filesystem_type", lambda path: "ext4")
    matrix = _matrix(tmp_path, template_db)
    with pytest.raises(StudyError) as err:
        run_study(matrix, _slurm_options(2))
    message = str(err.value)
    assert "\n" not in message
    assert "tracking server" in message and "--tracking-uri" in message
    assert "ext4" in message and "mlflow.db" in message
    assert fake_slurm.calls() == []  # nothing submitted
    assert not (matrix.output_dir / "cells").exists()  # and no cell config written


def test_sqlite_ledger_on_this_machines_tmp_is_refused(
    tmp_path: Path, template_db: Path, fake_slurm: FakeSlurm
) -> None:
    """The real filesystem check: the test's tmp folder is not a network filesystem."""
    if launch.filesystem_type(tmp_path) in launch.SHARED_FS:
        pytest.skip(f"{tmp_path} is on a shared filesystem here")
    matrix = _matrix(tmp_path, template_db)
    with pytest.raises(StudyError, match="tracking server"):
        run_study(matrix, _slurm_options(2))
    assert fake_slurm.calls() == []


def test_filesystem_type_reads_the_longest_mount_point() -> None:
    assert launch.filesystem_type(Path("/proc/self")) == "proc"
    assert launch.filesystem_type(Path("/proc")) == "proc"


def test_a_tracking_server_is_never_refused() -> None:
    launch.check_slurm_store("http://mlflow.example:5000")  # not a file: nothing to check


# ----------------------------------------------------------------------------- requeue


def _job(tmp_path: Path) -> CellJob:
    return CellJob(
        key="k" * 64, label="factor/twx/42", study="slurmtest", spec_hash="h", base="smoke",
        variants=["factor"], study_dir=str(tmp_path), cwd=str(tmp_path), tracking_uri=None,
        launcher="slurm", gpus=2,
    )  # fmt: skip


def test_checkpoint_without_a_child_requeues_the_same_job(tmp_path: Path) -> None:
    job = _job(tmp_path)
    delayed = job.checkpoint()
    assert isinstance(delayed, DelayedSubmission)
    assert delayed.function is job and delayed.args == () and delayed.kwargs == {}
    path = tmp_path / "requeued.pkl"
    delayed.dump(path)  # what submitit writes for the requeued job
    again = DelayedSubmission.load(path).function
    assert again == job and again.key == job.key and again.gpus == 2


def test_checkpoint_stops_a_finished_child_quietly(tmp_path: Path) -> None:
    job = _job(tmp_path)
    job._child = subprocess.Popen([sys.executable, "-c", "pass"])
    job._child.wait()
    assert isinstance(job.checkpoint(), DelayedSubmission)


PROBE = """
import os, signal, sys, tempfile, threading
from pathlib import Path
from factor_cli.studies import cell
cell.CHILD_GRACE_S = 3.0
study = Path(tempfile.mkdtemp())
job = cell.CellJob(key="k", label="l", study="s", spec_hash="h", base="smoke", variants=[],
                   study_dir=str(study), cwd=str(study), tracking_uri=None, launcher="slurm")
job.folder.mkdir(parents=True)
job.command = lambda attempt, resume: [sys.executable, "-c", "import time; time.sleep(30)"]
done = {}
def on_usr2(signum, frame):  # what submitit's handler does on the pre-timeout signal
    done["delayed"] = type(job.checkpoint()).__name__
signal.signal(signal.SIGUSR2, on_usr2)
target = {"parent": lambda: os.kill(os.getpid(), signal.SIGUSR2),  # srun --signal=B:USR2
          "step": lambda: os.killpg(0, signal.SIGUSR2)}[sys.argv[1]]  # Slurm: every process
threading.Timer(0.5, target).start()
fd = os.open(study / "lock", os.O_CREAT | os.O_RDWR)
code, log = job._train(fd, 1, None)
print(code, done["delayed"])
"""


@pytest.mark.parametrize("delivery", ["parent", "step"])
def test_pre_timeout_signal_while_the_child_trains_stops_it_and_requeues(delivery: str) -> None:
    """submitit calls ``checkpoint()`` from its USR2 handler while ``_train`` waits on the child:
    the child must end by checkpoint's SIGTERM (so its ledger run closes KILLED), be reaped, and
    checkpoint must return the requeued job. Slurm's ``--signal=USR2@T`` (no ``B:``) reaches
    every process of the step, the training child too ("step"), which must not die of it."""
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE, delivery], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=Path(cell_module.__file__).parents[2], start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = probe.communicate(timeout=25)  # the child sleeps 30 s
    except subprocess.TimeoutExpired:
        os.killpg(probe.pid, signal.SIGKILL)  # the probe and its sleeping child
        probe.communicate()
        pytest.fail("checkpoint() in the USR2 handler hung while _train waited on the child")
    assert probe.returncode == 0, stderr
    assert stdout.split() == [str(-signal.SIGTERM), "DelayedSubmission"]
