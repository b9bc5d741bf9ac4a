"""Cell states, launch decisions, the cell job's claim, cost estimates and the heartbeat thread.

Runs are written to a real SQLite ledger (tmp) through :func:`factor_cli.ledger.start_run`, as
``factor train`` writes them (tags ``study`` and ``cell_key``), and closed FINISHED, FAILED (an
exception in the block), KILLED (KeyboardInterrupt in the block) or left RUNNING (never closed:
a SIGKILLed trainer). No training: the whole file runs in seconds. Three small studies of the
smoke base on twx (rows grpo and factor, seeds 42, 43, 44) share one ledger:

    states  grpo: FINISHED / FAILED / KILLED; factor: RUNNING / nothing / (made invalid)
    edge    grpo: RUNNING Slurm cells with a fresh / an old heartbeat, a local one;
            factor: a superseded run only / FINISHED + a newer FAILED / superseded + KILLED
    jobs    no runs beforehand: each CellJob test writes the runs of its own cell

Tests that write attempts files point the matrix at their own study folder (``tmp_path``), so
the ledger fixture is only read by them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from factor_cli.ledger import start_run
from factor_cli.ledger.runs import T_CORE, T_GPU, T_WALL, Heartbeat, LedgerRun
from factor_cli.ledger.store import open_client
from factor_cli.studies.cell import CellJob, Outcome
from factor_cli.studies.estimate import T_SOURCE, estimate_pending
from factor_cli.studies.launch import write_cell_config
from factor_cli.studies.matrix import Cell, Matrix, Options, expand
from factor_cli.studies.spec import load_spec
from factor_cli.studies.state import (
    STALE_AFTER_S,
    STATES,
    T_BASE,
    T_CELL,
    T_HEARTBEAT,
    T_LAUNCHER,
    T_SUPERSEDED,
    T_VARIANTS,
    CellState,
    lock_path,
    matrix_states,
    state_of,
    study_runs,
    to_launch,
    try_lock,
)

SPEC = "name: {name}\nbase: smoke\nenvs: [twx]\nseeds: {seeds}\nrows: [{rows}]\n"
BOOM = "RuntimeError: boom"  # the ``error`` tag of a run closed by RuntimeError("boom")
TWO_HOURS_AGO = (datetime.now(timezone.utc) - timedelta(hours=2)).isoformat(timespec="seconds")


def now_stamp() -> str:
    """A heartbeat written now, in the ledger's format."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- writing runs


def make_matrix(
    root: Path, uri: str, name: str, rows: str = "{name: grpo}, {name: factor}",
    seeds: str = "[42, 43, 44]",
) -> Matrix:  # fmt: skip
    path = root / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, seeds=seeds, rows=rows))
    spec, spec_path = load_spec(str(path))
    options = Options(overrides=[f"output_dir={root}/runs", f"tracking_uri={uri}"])
    return expand(spec, spec_path, options)


def open_run(cell: Cell, uri: str, study: str | None = None, **tags: Any) -> LedgerRun:
    """A new ledger run of ``cell`` (not entered: it stays RUNNING until closed)."""
    cfg = cell.config
    assert cfg is not None
    return start_run(
        cfg, study=study or cfg.study, method=cfg.method, env=cfg.env.name, seed=cfg.seed,
        backbone=Path(cfg.model.path).name, tracking_uri=uri, cpu_cores=2,
        tags={T_CELL: cell.key, **tags},
    )  # fmt: skip


def record(cell: Cell, uri: str, status: str, study: str | None = None, **tags: Any) -> str:
    """A run of ``cell`` ended as a trainer ends it with ``status``; returns its run id."""
    run = open_run(cell, uri, study, **tags)
    if status == "FINISHED":
        with run:
            pass
    elif status == "FAILED":
        with pytest.raises(RuntimeError), run:
            raise RuntimeError("boom")
    elif status == "KILLED":
        with pytest.raises(KeyboardInterrupt), run:
            raise KeyboardInterrupt
    else:
        assert status == "RUNNING", status  # left open: a trainer that was SIGKILLed
    time.sleep(0.01)  # distinct start times: "newest first" must not depend on ties
    return run.run_id


def set_tags(uri: str, run_id: str, tags: dict[str, Any]) -> None:
    client = open_client(uri, create=False)
    for key, value in tags.items():
        client.set_tag(run_id, key, str(value))


def write_attempts(study_dir: Path, key: str, outcomes: list[str], torn: bool = False) -> None:
    """``<study dir>/cells/<key>/attempts.jsonl`` by hand, one line per outcome."""
    path = study_dir / "cells" / key / "attempts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"attempt": i, "outcome": o, "reason": f"error: attempt {i} {o}"})
        for i, o in enumerate(outcomes, 1)
    ]
    path.write_text("\n".join(lines) + "\n" + ('{"attempt": 9, "outc' if torn else ""))


def by_label(matrix: Matrix) -> dict[str, Cell]:
    return {c.label: c for c in matrix.cells}


def states_by_label(matrix: Matrix, stale_after: float = STALE_AFTER_S) -> dict[str, CellState]:
    return {st.cell.label: st for st in matrix_states(matrix, stale_after)}  # type: ignore[union-attr]


def moved(matrix: Matrix, study_dir: Path) -> Matrix:
    """The same matrix reading its attempts and locks from ``study_dir``."""
    return dataclasses.replace(matrix, output_dir=study_dir)


# ----------------------------------------------------------------------------- the ledger


@dataclass
class Ledger:
    uri: str
    root: Path
    states: Matrix  # the last cell (factor/twx/44) made invalid
    edge: Matrix
    jobs: Matrix
    ids: dict[str, str]  # "<study>:<label>[:what]" -> run id


INVALID = "env twx: no split manifest splits/twx-train.csv here (run factor splits build)"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    root = tmp_path_factory.mktemp("study-state")
    uri = f"sqlite:///{root}/mlflow.db"
    states, edge, jobs = (make_matrix(root, uri, n) for n in ("states", "edge", "jobs"))
    ids: dict[str, str] = {}
    s = by_label(states)
    ids["states:grpo/twx/42"] = record(s["grpo/twx/42"], uri, "FINISHED")
    ids["states:grpo/twx/43"] = record(s["grpo/twx/43"], uri, "FAILED")
    ids["states:grpo/twx/44"] = record(s["grpo/twx/44"], uri, "KILLED")
    ids["states:factor/twx/42"] = record(s["factor/twx/42"], uri, "RUNNING")
    # Runs that carry factor/twx/43's key but are not its runs: an evaluation, another study.
    pending = s["factor/twx/43"]
    with open_run(pending, uri) as run:
        set_tags(uri, run.run_id, {"kind": "eval"})
    with open_run(pending, uri, study="elsewhere"):
        pass
    invalid = dataclasses.replace(s["factor/twx/44"], config=None, error=INVALID)
    states = dataclasses.replace(states, cells=[*states.cells[:-1], invalid])

    e = by_label(edge)
    for label, stamp in (("grpo/twx/42", now_stamp()), ("grpo/twx/43", TWO_HOURS_AGO)):
        ids[f"edge:{label}"] = record(e[label], uri, "RUNNING", **{T_LAUNCHER: "slurm"})
        set_tags(uri, ids[f"edge:{label}"], {T_HEARTBEAT: stamp})
    ids["edge:grpo/twx/44"] = record(e["grpo/twx/44"], uri, "RUNNING", **{T_LAUNCHER: "local"})
    set_tags(uri, ids["edge:grpo/twx/44"], {T_HEARTBEAT: now_stamp()})
    old = record(e["factor/twx/42"], uri, "FINISHED")
    set_tags(uri, old, {T_SUPERSEDED: "attempt 2"})
    ids["edge:factor/twx/43:finished"] = record(e["factor/twx/43"], uri, "FINISHED")
    ids["edge:factor/twx/43:failed"] = record(e["factor/twx/43"], uri, "FAILED")
    old = record(e["factor/twx/44"], uri, "FAILED")
    set_tags(uri, old, {T_SUPERSEDED: "attempt 2"})
    ids["edge:factor/twx/44"] = record(e["factor/twx/44"], uri, "KILLED")
    return Ledger(uri, root, states, edge, jobs, ids)


# ----------------------------------------------------------------------------- states


def test_each_ledger_status_maps_to_its_cell_state(ledger: Ledger) -> None:
    states = states_by_label(ledger.states)
    assert {label: st.state for label, st in states.items()} == {
        "grpo/twx/42": "finished", "grpo/twx/43": "failed", "grpo/twx/44": "killed",
        "factor/twx/42": "stale", "factor/twx/43": "pending", "factor/twx/44": "invalid",
    }  # fmt: skip
    assert set(st.state for st in states.values()) == set(STATES) - {"running"}
    for label in ("grpo/twx/42", "grpo/twx/43", "grpo/twx/44", "factor/twx/42"):
        assert states[label].run_id == ledger.ids[f"states:{label}"]
        assert states[label].duplicates == 0
    assert states["grpo/twx/43"].reason == BOOM  # the run's ``error`` tag
    assert states["grpo/twx/42"].reason == states["grpo/twx/44"].reason == ""
    # the eval run and the other study's run with its key are not the cell's
    assert states["factor/twx/43"].run_id is None
    assert states["factor/twx/44"].reason == INVALID and states["factor/twx/44"].run_id is None


def test_a_held_cell_lock_makes_a_running_run_and_an_unrun_cell_running(ledger: Ledger) -> None:
    cells = by_label(ledger.states)
    study_dir = ledger.states.output_dir
    with (
        try_lock(lock_path(study_dir, cells["factor/twx/42"].key)) as a,
        try_lock(lock_path(study_dir, cells["factor/twx/43"].key)) as b,
    ):
        assert a is not None and b is not None
        held = states_by_label(ledger.states)
        assert held["factor/twx/42"].state == "running"
        assert held["factor/twx/42"].run_id == ledger.ids["states:factor/twx/42"]
        assert held["factor/twx/43"].state == "running"  # claimed, no ledger run yet
        # a lock says nothing about a closed run
        assert [held[f"grpo/twx/{s}"].state for s in (42, 43, 44)] == [
            "finished", "failed", "killed"
        ]  # fmt: skip
    freed = states_by_label(ledger.states)
    assert (freed["factor/twx/42"].state, freed["factor/twx/43"].state) == ("stale", "pending")


def test_a_slurm_cell_is_alive_while_its_heartbeat_is_fresh(ledger: Ledger) -> None:
    states = states_by_label(ledger.edge)
    assert states["grpo/twx/42"].state == "running"  # slurm, heartbeat now, lock free
    assert states["grpo/twx/43"].state == "stale"  # slurm, heartbeat two hours old
    assert states["grpo/twx/44"].state == "stale"  # local: only its lock says it is alive
    assert states["grpo/twx/43"].heartbeat == TWO_HOURS_AGO
    patient = states_by_label(ledger.edge, stale_after=3 * 3600.0)
    assert patient["grpo/twx/43"].state == "running"  # two hours < stale_after
    assert patient["grpo/twx/44"].state == "stale"


def test_a_heartbeat_without_a_timezone_reads_as_old_not_as_a_crash(ledger: Ledger) -> None:
    cell = by_label(ledger.jobs)["grpo/twx/42"]
    run_id = record(cell, ledger.uri, "RUNNING", study="naive", **{T_LAUNCHER: "slurm"})
    set_tags(ledger.uri, run_id, {T_HEARTBEAT: "2024-01-01T00:00:00"})  # e.g. set by hand
    runs = study_runs("naive", ledger.uri)[cell.key]
    st = state_of(cell.key, ledger.root / "nowhere", runs, STALE_AFTER_S, locked=False)
    assert st.state == "stale"


def test_superseded_runs_are_ignored_and_a_finished_run_wins(ledger: Ledger) -> None:
    states = states_by_label(ledger.edge)
    only_superseded = states["factor/twx/42"]
    assert (only_superseded.state, only_superseded.run_id) == ("pending", None)
    two_live = states["factor/twx/43"]  # FINISHED, then a newer FAILED run of the same key
    assert two_live.state == "finished"
    assert two_live.run_id == ledger.ids["edge:factor/twx/43:finished"]
    assert two_live.duplicates == 1
    resumed = states["factor/twx/44"]  # a superseded FAILED run, then a KILLED one
    assert (resumed.state, resumed.run_id) == ("killed", ledger.ids["edge:factor/twx/44"])
    assert resumed.duplicates == 0


def test_a_study_without_a_ledger_is_all_pending(tmp_path: Path) -> None:
    matrix = make_matrix(tmp_path, f"sqlite:///{tmp_path}/none.db", "fresh", seeds="[42]")
    assert [st.state for st in matrix_states(matrix)] == ["pending", "pending"]
    assert not (tmp_path / "none.db").exists()  # reading states never creates the store


# ----------------------------------------------------------------------------- to_launch


LAUNCH_PLAIN = {"pending": True, "stale": True, "killed": True, "finished": False,
                "failed": False, "running": False, "invalid": False}  # fmt: skip
LAUNCH_FORCED = {**LAUNCH_PLAIN, "finished": True, "failed": True}


@pytest.mark.parametrize(("force", "expected"), [(False, LAUNCH_PLAIN), (True, LAUNCH_FORCED)])
def test_to_launch_by_state(ledger: Ledger, force: bool, expected: dict[str, bool]) -> None:
    states = {st.state: st for m in (ledger.states, ledger.edge) for st in matrix_states(m)}
    assert set(states) == set(STATES)
    assert {name: to_launch(st, 0, force) for name, st in states.items()} == expected
    # a retry allowance changes nothing but failed cells
    retry = {name: to_launch(st, 5, force) for name, st in states.items()}
    assert retry == {**expected, "failed": True}


@pytest.mark.parametrize(
    ("outcomes", "failures", "retry_failed", "launch"),
    [
        ([], 0, 0, False),  # FAILED run, no attempts file (a plain factor train of the key)
        ([], 0, 1, True),
        (["failed"], 1, 0, False),
        (["failed"], 1, 1, True),
        (["failed", "failed"], 2, 1, False),
        (["failed", "failed"], 2, 2, True),
        (["failed", "killed", "busy", "skipped", "failed"], 2, 2, True),
        (["failed", "killed", "failed", "failed"], 3, 2, False),
    ],
)
def test_a_failed_cell_is_retried_while_its_failures_are_within_retry_failed(
    ledger: Ledger, tmp_path: Path, outcomes: list[str], failures: int, retry_failed: int,
    launch: bool,
) -> None:  # fmt: skip
    cell = by_label(ledger.states)["grpo/twx/43"]  # its run is FAILED
    write_attempts(tmp_path, cell.key, outcomes, torn=True)  # a torn last line is ignored
    st = states_by_label(moved(ledger.states, tmp_path))["grpo/twx/43"]
    assert (st.state, st.failures, st.attempts) == ("failed", failures, len(outcomes))
    assert to_launch(st, retry_failed, force=False) is launch
    assert to_launch(st, retry_failed, force=True)


def test_a_failure_before_the_ledger_run_opened_is_failed_with_its_reason(
    ledger: Ledger, tmp_path: Path
) -> None:
    cell = by_label(ledger.states)["factor/twx/43"]  # no run of its own in the ledger
    write_attempts(tmp_path, cell.key, ["killed", "failed"])
    st = states_by_label(moved(ledger.states, tmp_path))["factor/twx/43"]
    assert (st.state, st.run_id, st.failures, st.attempts) == ("failed", None, 1, 2)
    assert st.reason == "error: attempt 2 failed"
    assert not to_launch(st, 0, False) and to_launch(st, 1, False)
    write_attempts(tmp_path, cell.key, ["failed", "killed"])  # the last attempt decides
    st = states_by_label(moved(ledger.states, tmp_path))["factor/twx/43"]
    assert (st.state, st.reason, st.failures) == ("pending", "", 1)


def test_a_failed_run_without_an_error_tag_takes_the_last_attempts_reason(
    ledger: Ledger, tmp_path: Path
) -> None:
    cell = by_label(ledger.jobs)["factor/twx/44"]
    run = open_run(cell, ledger.uri)
    run.end("FAILED")  # e.g. a trainer that exited non-zero without an exception
    write_attempts(tmp_path, cell.key, ["failed"])
    st = states_by_label(moved(ledger.jobs, tmp_path))["factor/twx/44"]
    assert (st.state, st.run_id, st.reason) == ("failed", run.run_id, "error: attempt 1 failed")


# ----------------------------------------------------------------------------- CellJob


def cell_job(matrix: Matrix, cell: Cell, study_dir: Path, **options: Any) -> CellJob:
    return CellJob(
        key=cell.key, label=cell.label, study=matrix.spec.name, spec_hash=matrix.spec_hash,
        base=matrix.base, variants=cell.variants, study_dir=str(study_dir), cwd=str(study_dir),
        tracking_uri=matrix.tracking_uri, launcher="local", **options,
    )  # fmt: skip


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fail the test if a CellJob starts a child; the job's chdir is undone afterwards."""

    def train(self: CellJob, fd: int, attempt: int, resume: str | None) -> tuple[int, Path]:
        pytest.fail(f"CellJob started training cell {self.label} (attempt {attempt})")

    monkeypatch.setattr(CellJob, "_train", train)
    monkeypatch.chdir(tmp_path)


def attempts_file(study_dir: Path, key: str) -> Path:
    return study_dir / "cells" / key / "attempts.jsonl"


@pytest.mark.usefixtures("no_training")
def test_a_job_whose_cell_lock_is_held_is_busy_and_starts_nothing(
    ledger: Ledger, tmp_path: Path
) -> None:
    cell = by_label(ledger.jobs)["grpo/twx/42"]  # pending: it would start if it got the lock
    with try_lock(lock_path(tmp_path, cell.key)) as fd:
        assert fd is not None
        out = cell_job(ledger.jobs, cell, tmp_path)()
    assert (out.key, out.outcome, out.run_id) == (cell.key, "busy", None)
    assert not attempts_file(tmp_path, cell.key).exists()
    assert matrix_states(moved(ledger.jobs, tmp_path))[0].state == "pending"


@pytest.mark.usefixtures("no_training")
def test_a_job_of_a_finished_cell_is_skipped(ledger: Ledger, tmp_path: Path) -> None:
    cell = by_label(ledger.states)["grpo/twx/42"]
    out = cell_job(ledger.states, cell, tmp_path)()
    assert out == Outcome(cell.key, "skipped", ledger.ids["states:grpo/twx/42"])
    assert not attempts_file(tmp_path, cell.key).exists()


@pytest.mark.usefixtures("no_training")
def test_a_job_of_a_failed_cell_is_not_retried_unless_asked(ledger: Ledger, tmp_path: Path) -> None:
    cell = by_label(ledger.states)["grpo/twx/43"]
    out = cell_job(ledger.states, cell, tmp_path, retry_failed=0)()
    assert out == Outcome(cell.key, "failed", ledger.ids["states:grpo/twx/43"], reason=BOOM)
    write_attempts(tmp_path, cell.key, ["failed", "failed"])
    out = cell_job(ledger.states, cell, tmp_path, retry_failed=1)()  # failed twice > 1
    assert out.outcome == "failed"
    assert len(attempts_file(tmp_path, cell.key).read_text().splitlines()) == 2


@pytest.mark.usefixtures("no_training")
def test_a_job_of_a_slurm_cell_alive_elsewhere_is_busy(ledger: Ledger, tmp_path: Path) -> None:
    cell = by_label(ledger.edge)["grpo/twx/42"]  # RUNNING, launcher slurm, fresh heartbeat
    out = cell_job(ledger.edge, cell, tmp_path)()
    assert (out.outcome, out.run_id) == ("busy", ledger.ids["edge:grpo/twx/42"])


def fake_train(calls: list[tuple[int, str | None]], code: int) -> Callable[..., Any]:
    """A ``CellJob._train`` that records (attempt, resume) and exits with ``code``."""

    def train(self: CellJob, fd: int, attempt: int, resume: str | None) -> tuple[int, Path]:
        assert fd >= 0  # the job holds the cell's lock while it trains
        calls.append((attempt, resume))
        log = self.folder / f"attempt-{attempt}.log"
        log.write_text("error: the fake trainer says no\n" if code else "done\n")
        return code, log

    return train


@pytest.mark.parametrize("checkpoint", [True, False])
def test_a_killed_cell_resumes_its_run_from_a_checkpoint_else_supersedes_it(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: bool
) -> None:
    cell = by_label(ledger.jobs)["grpo/twx/43" if checkpoint else "grpo/twx/44"]
    run_id = record(cell, ledger.uri, "KILLED")
    matrix = moved(ledger.jobs, tmp_path)
    write_cell_config(matrix, cell)
    if checkpoint:  # <output_dir>/<run id>/checkpoints/latest -> a checkpoint folder
        ckpts = Path(cell.config.output_dir) / run_id / "checkpoints"  # type: ignore[union-attr]
        (ckpts / "step-1").mkdir(parents=True)
        (ckpts / "latest").write_text(json.dumps({"dir": "step-1"}))
    calls: list[tuple[int, str | None]] = []
    monkeypatch.setattr(CellJob, "_train", fake_train(calls, 0))
    monkeypatch.chdir(tmp_path)
    out = cell_job(matrix, cell, tmp_path)()
    assert calls == [(1, run_id if checkpoint else None)]
    tags = open_client(ledger.uri, create=False).get_run(run_id).data.tags
    assert (T_SUPERSEDED in tags) is not checkpoint
    assert (out.outcome, out.attempt, out.exit_code) == ("finished", 1, 0)
    (line,) = attempts_file(tmp_path, cell.key).read_text().splitlines()
    assert json.loads(line)["outcome"] == "finished"


def test_a_failing_attempt_is_recorded_with_its_reason(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cell = by_label(ledger.jobs)["factor/twx/42"]  # pending: a first attempt
    matrix = moved(ledger.jobs, tmp_path)
    write_cell_config(matrix, cell)
    calls: list[tuple[int, str | None]] = []
    monkeypatch.setattr(CellJob, "_train", fake_train(calls, 1))
    monkeypatch.chdir(tmp_path)
    out = cell_job(matrix, cell, tmp_path)()
    assert calls == [(1, None)]
    assert (out.outcome, out.reason, out.run_id) == ("failed", "error: the fake trainer says no",
                                                     None)  # fmt: skip
    st = states_by_label(matrix)["factor/twx/42"]  # failed before a ledger run opened
    assert (st.state, st.failures, st.reason) == ("failed", 1, out.reason)
    again = cell_job(matrix, cell, tmp_path)()  # no retries asked: nothing starts
    assert again.outcome == "failed" and calls == [(1, None)]


# ----------------------------------------------------------------------------- estimates


HOUR = 3600.0


def test_pending_cells_are_estimated_from_finished_runs_of_the_same_method_env_and_base(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rows = "{name: grpo}, {name: factor}, {name: serl-repro}"
    matrix = make_matrix(tmp_path, uri, "est", rows=rows, seeds="[42, 43]")
    history = make_matrix(tmp_path, uri, "history", rows=rows, seeds="[7]")
    past, cells = by_label(history), by_label(matrix)

    def finished(cell: Cell, wall: float, gpus: int, status: str = "FINISHED", **tags: Any):
        run_id = record(cell, uri, status, **tags)
        set_tags(uri, run_id, {T_WALL: wall, T_GPU: gpus * wall, T_CORE: 2 * wall})

    smoke = {T_BASE: "smoke"}
    # grpo/twx/smoke: 1 h, 2 h and this study's own finished cell 1.5 h -> mean 1.5 h, no GPU
    finished(past["grpo/twx/7"], HOUR, 0, **smoke)
    finished(past["grpo/twx/7"], 2 * HOUR, 0, **smoke)
    finished(cells["grpo/twx/42"], 1.5 * HOUR, 0, **smoke)
    # factor/twx/smoke from a plain `factor train --config smoke`: 0.5 h on 8 GPUs
    finished(past["factor/twx/7"], 0.5 * HOUR, 8, **{T_SOURCE: "smoke"})
    # none of these counts: another base, not finished, an evaluation, no base at all
    finished(past["grpo/twx/7"], 100 * HOUR, 8, **{T_BASE: "paper"})
    finished(past["grpo/twx/7"], 100 * HOUR, 8, status="FAILED", **smoke)
    finished(past["serl-repro/twx/7"], 100 * HOUR, 8, status="KILLED", **smoke)
    finished(past["serl-repro/twx/7"], 100 * HOUR, 8)
    with open_run(past["factor/twx/7"], uri, **smoke) as run:
        set_tags(uri, run.run_id, {"kind": "eval"})
    set_tags(uri, run.run_id, {T_WALL: 100 * HOUR})

    states = matrix_states(matrix)
    assert [st.state for st in states].count("pending") == 5
    estimate = estimate_pending(matrix, states)
    # pending: grpo/43 (1.5 h), factor/42, factor/43 (0.5 h, 0.5 node-h each), serl-repro x2
    assert (estimate["pending"], estimate["known"]) == (5, 3)
    assert estimate["wall_clock_hours"] == pytest.approx(1.5 + 2 * 0.5)
    assert estimate["node_hours"] == pytest.approx(2 * 0.5)
    assert estimate["cpu_core_hours"] == pytest.approx(2 * (1.5 + 2 * 0.5))


def test_a_cell_is_estimated_from_its_own_variant_first_then_from_its_method(
    tmp_path: Path,
) -> None:
    """An axis (here the horizon) can change a cell's cost tenfold: seed 2 of a variant costs
    what that variant's seed 1 cost, not the mean over the method's every variant."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = tmp_path / "axis.yaml"
    path.write_text(SPEC.format(name="axis", seeds="[1, 2]", rows="{name: grpo}")
                    + "axes: {env.max_turns: [6, 12, 24]}\n")  # fmt: skip
    spec, spec_path = load_spec(str(path))
    options = Options(overrides=[f"output_dir={tmp_path}/runs", f"tracking_uri={uri}"])
    matrix = expand(spec, spec_path, options)
    cells = by_label(matrix)
    variants = {turns: f"grpo[env.max_turns={turns}]" for turns in (6, 12, 24)}

    def finished(cell: Cell, wall: float, **tags: Any) -> None:
        run_id = record(cell, uri, "FINISHED", **{T_BASE: "smoke", **tags})
        set_tags(uri, run_id, {T_WALL: wall, T_GPU: 0.0, T_CORE: 2 * wall})

    short, long_ = cells[f"{variants[6]}/twx/1"], cells[f"{variants[24]}/twx/1"]
    finished(short, 0.1 * HOUR, **{T_VARIANTS: json.dumps([variants[6]])})
    finished(long_, 2.0 * HOUR, **{T_VARIANTS: json.dumps([variants[24]])})
    # another study's run of the same variant label says nothing about this one's cost
    finished(short, 50 * HOUR, study="other", **{T_VARIANTS: json.dumps([variants[6]])})

    states = matrix_states(matrix)
    pending = {st.cell.label: st for st in states if st.state == "pending"}  # type: ignore[union-attr]
    assert len(pending) == 4  # 12 turns x both seeds, and seed 2 of the other two
    for label, wall in [(f"{variants[6]}/twx/2", 0.1), (f"{variants[24]}/twx/2", 2.0),
                        (f"{variants[12]}/twx/1", (0.1 + 2.0 + 50) / 3)]:  # fmt: skip
        one = estimate_pending(matrix, [pending[label]])
        assert one["known"] == 1
        assert one["wall_clock_hours"] == pytest.approx(wall), label


def test_an_estimate_of_nothing_pending_reads_no_ledger(ledger: Ledger) -> None:
    states = [dataclasses.replace(st, state="finished") for st in matrix_states(ledger.jobs)]
    gone = dataclasses.replace(ledger.jobs, tracking_uri="sqlite:////nonexistent/x/mlflow.db")
    assert estimate_pending(gone, states) == {
        "pending": 0, "known": 0, "wall_clock_hours": 0.0, "node_hours": 0.0,
        "cpu_core_hours": 0.0,
    }  # fmt: skip


# ----------------------------------------------------------------------------- heartbeat


def test_the_heartbeat_thread_beats_while_open_and_stops_on_exit(ledger: Ledger) -> None:
    cell = by_label(ledger.jobs)["factor/twx/43"]
    client = open_client(ledger.uri, create=False)

    def tags(run_id: str) -> dict[str, str]:
        return client.get_run(run_id).data.tags

    with open_run(cell, ledger.uri) as run:
        assert T_HEARTBEAT not in tags(run.run_id)
        with Heartbeat(run, every_s=0.05) as beat:
            time.sleep(0.3)
            first = tags(run.run_id)
            assert T_HEARTBEAT in first
            deadline = time.monotonic() + 3.0  # the stamp has one-second resolution
            while tags(run.run_id)[T_HEARTBEAT] == first[T_HEARTBEAT]:
                assert time.monotonic() < deadline, "the heartbeat tag never changed"
                time.sleep(0.05)
            later = tags(run.run_id)
            assert float(later[T_WALL]) > float(first[T_WALL])  # compute time written too
        assert not beat._thread.is_alive()
        stopped = tags(run.run_id)
        time.sleep(0.3)
        assert tags(run.run_id) == stopped  # nothing beats after the exit
    st = states_by_label(moved(ledger.jobs, ledger.root / "nowhere"))["factor/twx/43"]
    assert st.state == "finished" and st.heartbeat == tags(run.run_id)[T_HEARTBEAT]


def test_a_preset_named_by_path_or_by_name_is_one_base() -> None:
    """`factor train --config experiments/smoke.yaml` estimates cells of base `smoke`."""
    from factor_cli.resources import presets_dir
    from factor_cli.studies.estimate import source_id

    assert source_id("smoke") == source_id(str(presets_dir() / "smoke.yaml")) == "smoke"
    assert source_id("paper") != source_id("smoke")
    assert source_id("/no/such/config.yaml") == "/no/such/config.yaml"
