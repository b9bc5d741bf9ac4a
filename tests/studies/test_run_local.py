"""`factor study run` through the local launcher, end to end on the tiny model (CPU).

The CI study (``experiments/studies/ci.yaml``, two steps per cell) less its grpo row, so both
cells run at once under ``--max-parallel 2`` (`.ci/run` runs the whole study after the suite),
is run, stopped with Ctrl-C, resumed, SIGKILLed (runner and cells at once, as a machine dying),
then finished by two runners started at the same time; the ledger must end with exactly one
finished run per cell, the interrupted runs resumed under their own ids, and no cell trained to
the end twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STUDY = "ci"


def _sets(tmp: Path, model: Path) -> list[str]:
    """The overrides every cell of these tests gets: a private ledger, folder and tiny model."""
    return [f"output_dir={tmp}/runs", f"tracking_uri=sqlite:///{tmp}/mlflow.db",
            f"model.path={model}", "model.init_tiny=null"]  # fmt: skip


def _cmd(tmp: Path, model: Path, *args: str, spec: str = STUDY) -> list[str]:
    sets = [part for item in _sets(tmp, model) for part in ("--set", item)]
    return [sys.executable, "-m", "factor_cli", "study", args[0], spec, *args[1:], *sets]


def _invoke(tmp: Path, model: Path, *args: str, spec: str) -> tuple[int, str, str]:
    """A short command (plan, status, report) in this process: (exit code, stdout, stderr).
    The runners, whose processes are what these tests are about, run as subprocesses."""
    from typer.testing import CliRunner

    from factor_cli.cli.main import app

    argv = _cmd(tmp, model, *args, spec=spec)[3:]  # less `python -m factor_cli`
    res = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    return res.exit_code, res.stdout, res.stderr


def _start(cmd: list[str]) -> subprocess.Popen[str]:
    """A runner in its own session, so the test can signal its whole process group, with
    SIGINT at its default as a terminal's foreground job has it: a suite started in the
    background of a non-interactive shell inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler, so the Ctrl-C below would be lost (the cells ran to the end)."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _runs(tmp: Path) -> list:
    """The study's runs (through the ledger's own opening: never migrate beside a runner)."""
    from factor_cli.ledger.store import open_client

    if not (tmp / "mlflow.db").exists():
        return []
    client = open_client(f"sqlite:///{tmp}/mlflow.db", create=False)
    exp = client.get_experiment_by_name("factor")
    if exp is None:
        return []
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("study")]


def _wait(what: str, condition: Callable[[], bool], proc: subprocess.Popen[str], limit: float):
    t0 = time.monotonic()
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            tail = out[-2000:] + err[-3000:]
            pytest.fail(f"runner ended before {what}: rc {proc.returncode}\n{tail}")
        if time.monotonic() - t0 > limit:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def _checkpointed(tmp: Path, status: str = "RUNNING") -> list:
    out = []
    for run in _runs(tmp):
        pointer = tmp / "runs" / "studies" / STUDY / run.info.run_id / "checkpoints" / "latest"
        if run.info.status == status and pointer.exists():
            out.append(run)
    return out


def _attempts(tmp: Path) -> dict[str, list[dict]]:
    cells = tmp / "runs" / "studies" / STUDY / "cells"
    return {
        d.name: [json.loads(line) for line in (d / "attempts.jsonl").read_text().splitlines()]
        for d in cells.iterdir()
        if (d / "attempts.jsonl").exists()
    }


def _two_cells(tmp: Path) -> str:
    """The CI study without its grpo row (two cells: one round at ``--max-parallel 2``), at 6
    steps: with the CI study's 2, a cell could finish between the first checkpoint and the
    Ctrl-C the test sends after it (seen once on a loaded 2-core machine)."""
    text = (Path(__file__).parents[2] / "experiments" / "studies" / "ci.yaml").read_text()
    assert "  - {name: grpo}\n" in text and "  steps: 2\n" in text
    spec = tmp / "ci.yaml"
    spec.write_text(text.replace("  - {name: grpo}\n", "").replace("  steps: 2\n", "  steps: 6\n"))
    return str(spec)


def test_ci_study_survives_ctrl_c_sigkill_and_two_concurrent_runners(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    spec = _two_cells(tmp_path)
    run = _cmd(tmp_path, tiny_model_dir, "run", "--max-parallel", "2", spec=spec)
    # 1. Ctrl-C (SIGINT to the foreground group, as a terminal sends it) after a checkpoint.
    first = _start(run)
    _wait("a checkpoint", lambda: bool(_checkpointed(tmp_path)), first, 300)
    os.killpg(first.pid, signal.SIGINT)
    out, err = first.communicate(timeout=180)
    assert first.returncode == 130, out[-2000:] + err[-3000:]
    assert "interrupted: stopped" in err and "resumes them" in err
    killed = {r.info.run_id: r for r in _runs(tmp_path) if r.info.status == "KILLED"}
    assert killed, [(r.info.run_id, r.info.status) for r in _runs(tmp_path)]

    # 2. The next run resumes them; SIGKILL it and its cells at once (a machine dying).
    second = _start(run)
    resumed = lambda: any(  # noqa: E731
        r.info.run_id in killed and r.info.status == "RUNNING" for r in _runs(tmp_path)
    )
    _wait("a killed cell to resume", resumed, second, 300)
    os.killpg(second.pid, signal.SIGKILL)
    second.wait()

    # 3. Two runners at once finish the study: no cell starts twice.
    both = [_start(run), _start(run)]
    results = [p.communicate(timeout=600) for p in both]
    for proc, (out, err) in zip(both, results):
        assert proc.returncode == 0, out[-2000:] + err[-3000:]

    runs = _runs(tmp_path)
    live = [r for r in runs if "study.superseded_by" not in r.data.tags]
    keys = [r.data.tags["cell_key"] for r in live]
    assert len(keys) == len(set(keys)) == 2, [(k[:8], r.info.status) for k, r in zip(keys, live)]
    assert all(r.info.status == "FINISHED" for r in live)
    by_id = {r.info.run_id: r for r in runs}
    for run_id in killed:  # resumed under its own id, from its checkpoint
        if run_id in by_id and "study.superseded_by" not in by_id[run_id].data.tags:
            assert int(by_id[run_id].data.tags["ledger.session"]) >= 2
    assert any(run_id in {r.info.run_id for r in live} for run_id in killed)
    for key, attempts in _attempts(tmp_path).items():
        assert sum(a["outcome"] == "finished" for a in attempts) <= 1, (key, attempts)
    for r in live:
        assert r.data.tags["spec_hash"] and r.data.tags["launcher"] == "local"
        assert r.data.tags["study.base"] == "smoke"

    # 4. Run again: nothing starts; plan says every cell is finished, with its run id.
    again = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to start" in again.stdout, again.stderr[-2000:]
    code, plan, err = _invoke(tmp_path, tiny_model_dir, "plan", "--json", spec=spec)
    assert code == 0, err[-2000:]
    cells = json.loads(plan)["cells"]
    assert {c["state"] for c in cells} == {"finished"}
    assert {c["run_id"] for c in cells} == {r.info.run_id for r in live}

    # 5. The report: the main table of both methods, bootstrap, costs; files written.
    out = tmp_path / "report"
    code, report, err = _invoke(
        tmp_path, tiny_model_dir, "report", "--out", str(out), "--resamples", "200", spec=spec
    )
    assert code == 0, err[-2000:]
    assert "2 of 2 cells finished" in report
    for name in ("report.md", "table.csv", "costs.csv", "bootstrap.csv"):
        assert (out / name).stat().st_size > 0
    assert list(out.glob("*.png"))
    table = (out / "table.csv").read_text()
    assert all(method in table for method in ("serl-repro", "factor"))


FAILING = """\
name: ci
base: smoke
envs: [twx]
seeds: [42]
set: {steps: 1, sft.enabled: false, rollout.groups: 1, rollout.k: 2, eval.max_items: 2}
rows:
  - {name: grpo, set: {env.options: {bogus: 1}}}
"""


def test_a_failing_cell_is_reported_and_retried_only_when_asked(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "failing.yaml"
    spec.write_text(FAILING)

    def study(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = _cmd(tmp_path, tiny_model_dir, *args, spec=str(spec))
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    def launches(retry_failed: int) -> int:
        """How many cells `study run --retry-failed K` would start (decided in-process: the
        CLI's "nothing to start" is covered by the test above)."""
        from factor_cli.studies.launch import LaunchOptions, plan_launch
        from factor_cli.studies.matrix import Options, expand
        from factor_cli.studies.spec import load_spec

        overrides = tuple(_sets(tmp_path, tiny_model_dir))
        matrix = expand(*load_spec(str(spec)), Options(overrides=overrides))
        plan = plan_launch(matrix, LaunchOptions(retry_failed=retry_failed, dry_run=True))
        (state,) = plan.states
        assert state.state == "failed" and "bogus" in state.reason, state
        return len(plan.jobs)

    first = study("run")
    assert first.returncode == 1
    assert "unexpected keyword argument 'bogus'" in first.stderr, first.stderr[-2000:]
    assert launches(0) == 0  # reported, not retried unless asked
    assert launches(1) == 1
    retried = study("run", "--retry-failed", "1")
    assert retried.returncode == 1 and "bogus" in retried.stderr
    assert launches(1) == 0  # failed twice > 1
    code, status, err = _invoke(tmp_path, tiny_model_dir, "status", spec=str(spec))
    assert code == 0 and "failed" in status and "bogus" in status, status + err[-2000:]
    (attempts,) = _attempts(tmp_path).values()
    assert [a["outcome"] for a in attempts] == ["failed", "failed"]
    runs = _runs(tmp_path)  # no checkpoint to resume: the retry is a new run, the old superseded
    live = [r for r in runs if "study.superseded_by" not in r.data.tags]
    assert [r.info.status for r in live] == ["FAILED"] and len(runs) == 2
