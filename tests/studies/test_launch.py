"""The launcher's checks and its local GPU hand-out, without starting any training."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from factor_cli.studies import launch
from factor_cli.studies.launch import LaunchOptions, StudyError, plan_launch
from factor_cli.studies.matrix import Matrix, Options, cell_key, expand
from factor_cli.studies.spec import load_spec

SPEC = """\
name: launchtest
base: smoke
envs: [twx]
seeds: [42, 43]
rows:
  - {name: grpo}
  - {name: factor}
"""


def _matrix(tmp_path: Path, *extra: str, spec_text: str = SPEC) -> Matrix:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(spec_text))
    overrides = (f"output_dir={tmp_path}/runs", f"tracking_uri=sqlite:///{tmp_path}/m.db", *extra)
    spec, spec_path = load_spec(str(path))
    return expand(spec, spec_path, Options(overrides=overrides))


class _FakeExecutor:
    """Records what each submission was given (submitit's LocalExecutor interface)."""

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self.submitted: list[tuple[Any, tuple[int, ...]]] = []

    def update_parameters(self, **kwargs: Any) -> None:
        self.params.update(kwargs)

    def submit(self, job: Any) -> Any:
        self.submitted.append((job, tuple(self.params["visible_gpus"])))
        return object()


def test_local_cells_get_disjoint_gpus_and_at_most_what_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")
    fake = _FakeExecutor()
    monkeypatch.setattr(launch, "_executor", lambda matrix, cluster: fake)
    matrix = _matrix(tmp_path)
    options = LaunchOptions(max_parallel=8, gpus_per_job=2)
    pool = launch._LocalPool(matrix, options, lambda *a: None, jobs=2)
    assert pool.slots == 2  # five GPUs hold two cells of two
    jobs = [launch._job(matrix, cell, options) for cell in matrix.cells[:2]]
    for job in jobs:
        pool.start(job)
    gpus = [set(g) for _, g in fake.submitted]
    assert all(len(g) == 2 for g in gpus) and not gpus[0] & gpus[1]
    assert fake.params["timeout_min"] == launch.LOCAL_TIMEOUT_MIN  # never submitit's 2 minutes
    assert fake.params["gpus_per_node"] == 2


def test_more_gpus_per_cell_than_the_machine_has_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(StudyError, match=r"--gpus-per-job 2: this machine shows 1 GPU"):
        launch._visible_gpus(2)


def test_cells_on_cuda_are_refused_locally_without_a_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    matrix = _matrix(tmp_path, "model.device=cuda")
    with pytest.raises(StudyError, match="no CUDA GPU; run them at CPU scale with --base smoke"):
        plan_launch(matrix, LaunchOptions())


def test_invalid_cells_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    no_manifest = f"{{name: factor, set: {{env.splits_dir: {tmp_path}}}}}"
    broken = SPEC.replace("{name: factor}", no_manifest)
    matrix = _matrix(tmp_path, spec_text=broken)
    with pytest.raises(StudyError, match=r"2 cell\(s\) cannot run here, first factor/twx/42"):
        plan_launch(matrix, LaunchOptions())
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()


def test_dry_run_lists_every_cell_and_writes_nothing(tmp_path: Path) -> None:
    matrix = _matrix(tmp_path)
    plan = plan_launch(matrix, LaunchOptions(dry_run=True))
    assert [j.key for j in plan.jobs] == [c.key for c in matrix.cells]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "m.db").exists()
    command = plan.jobs[0].command(1, None)
    assert command[1:5] == ["-m", "factor_cli", "train", "--config"]
    assert command[5].endswith(f"cells/{matrix.cells[0].key}/config.yaml")


def test_a_real_plan_writes_each_cell_config_that_loads_back_to_its_key(tmp_path: Path) -> None:
    from factor_cli.train.config import load_config

    matrix = _matrix(tmp_path)
    plan = plan_launch(matrix, LaunchOptions())
    for job, cell in zip(plan.jobs, matrix.cells):
        assert cell_key(load_config(str(job.config_path))) == cell.key
    assert (tmp_path / "m.db").exists()  # the store is created once, in the parent


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (LaunchOptions(launcher="pbs"), "unknown launcher 'pbs'"),
        (LaunchOptions(max_parallel=0), "--max-parallel 0: must be >= 1"),
        (LaunchOptions(gpus_per_job=-1), "--gpus-per-job -1: must be >= 0"),
    ],
)
def test_bad_launch_options_are_one_line(tmp_path: Path, bad: LaunchOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_launch(_matrix(tmp_path), bad)


def test_the_cell_key_ignores_defaults_so_new_fields_keep_finished_cells() -> None:
    """A field set to its schema default, or a field added later with a default that keeps the
    old behaviour, leaves the key (and so a study's finished cells) unchanged; a real change
    does not; paths never count."""
    from factor_cli.studies import matrix as m
    from factor_cli.train.config import load_config

    key = cell_key(load_config("smoke"))
    assert cell_key(load_config("smoke", ["optim.clip_eps=0.2"])) == key  # the default
    assert cell_key(load_config("smoke", ["output_dir=/elsewhere"])) == key
    assert cell_key(load_config("smoke", ["optim.clip_eps=0.3"])) != key
    assert cell_key(load_config("smoke", ["seed=43"])) != key
    dump = {"a": 1, "sec": {"x": 2, "y": 3}}
    later = {"a": 1, "sec": {"x": 2, "y": 3, "new": 0.5}, "added": {"z": 1}}
    defaults = {"a": 0, "sec": {"x": 2, "y": 0}}
    defaults_later = {"a": 0, "sec": {"x": 2, "y": 0, "new": 0.5}, "added": {"z": 1}}
    expected = {"a": 1, "sec": {"y": 3}}
    assert m._sparse(dump, defaults) == m._sparse(later, defaults_later) == expected


@pytest.mark.parametrize(
    ("slots", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (3, 2, 1), (2, 16, 8), (3, 16, 5)]
)
def test_each_cell_in_flight_gets_an_equal_share_of_the_cores(
    slots: int, cores: int, threads: int
) -> None:
    assert launch.cell_threads(slots, cores) == threads


def test_local_cells_carry_their_thread_share_and_a_lone_cell_gets_every_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeExecutor()
    monkeypatch.setattr(launch, "_executor", lambda matrix, cluster: fake)
    monkeypatch.setattr(launch, "cell_threads", lambda slots: 12 // slots)
    matrix = _matrix(tmp_path)
    options = LaunchOptions(max_parallel=2)
    for jobs, threads in ((4, 6), (1, 12)):
        pool = launch._LocalPool(matrix, options, lambda *a: None, jobs=jobs)
        pool.start(launch._job(matrix, matrix.cells[0], options))
        assert fake.submitted[-1][0].threads == threads


@pytest.mark.parametrize(("user", "seen"), [(None, "3"), ("5", "5")])
def test_the_child_runs_on_its_thread_share_unless_the_user_set_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None, seen: str
) -> None:
    if user is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user)
    matrix = _matrix(tmp_path)
    job = launch._job(matrix, matrix.cells[0], LaunchOptions())
    job = launch.replace(job, threads=3)
    job.folder.mkdir(parents=True, exist_ok=True)
    probe = [sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"]
    monkeypatch.setattr(type(job), "command", lambda self, attempt, resume: probe)
    with (tmp_path / "lock").open("w") as lock:
        code, log = job._train(lock.fileno(), 1, None)
    assert code == 0 and log.read_text().strip() == seen
