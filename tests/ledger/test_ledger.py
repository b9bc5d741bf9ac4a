"""The ledger: MLflow runs with provenance, batch metrics, statuses, resume, compute, export.

Every test gets its own SQLite store: a copy of one migrated empty database made once per
session (creating a fresh MLflow database takes ~7 s here, copying it milliseconds).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("mlflow", reason="install with: pip install 'mlflow>=3.10'")

from mlflow import MlflowClient

from factor_cli.cli.main import app
from factor_cli.ledger import (
    LedgerError,
    canonical_json,
    config_hash,
    export_items,
    git_state,
    report,
    resolve_tracking_uri,
    runs_table,
    start_run,
    store,
)
from factor_cli.ledger import runs as runs_mod
from factor_cli.stats.io import read_results

runner = CliRunner()
# MLflow's SQL store triggers a SQLAlchemy deprecation warning of its own.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")
CONFIG = {
    "train": {"lr": 5e-7, "steps": 150, "clip": 0.2, "envs": ["twx", "alfworld"]},
    "model": {"name": "tiny-1m", "value_head": {"tau": 1.0}},
    "flag": True,
    "nothing": None,
    "empty": {},
}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Drive the ledger's session clock by hand: ``clock[0]`` is now, in seconds."""
    now = [1000.0]
    monkeypatch.setattr(runs_mod, "_clock", lambda: now[0])
    yield now


def _start(uri: str, **kw):
    args = {
        "study": "main", "method": "factor", "env": "twx", "seed": 0, "backbone": "tiny-1m",
        "tracking_uri": uri, "cpu_cores": 2,
    }  # fmt: skip
    args.update(kw)
    config = args.pop("config", CONFIG)
    return start_run(config, **args)


def _items(n: int = 8, seed: int = 0, shift: int = 0) -> pd.DataFrame:
    """n items in 2 categories; success pattern shifted by ``shift`` (method differences)."""
    return pd.DataFrame(
        {
            "item_id": [f"{i:03d}" for i in range(n)],
            "category": ["pick" if i % 2 else "clean" for i in range(n)],
            "success": [int((i + shift + seed) % 3 != 0) for i in range(n)],
            "score": [float((i + shift + seed) % 3 != 0) for i in range(n)],
        }
    )


# ----------------------------------------------------------------------------- store


def test_tracking_uri_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / ".git").mkdir()
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert resolve_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/ledger/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert resolve_tracking_uri() == "http://mlflow.internal:5000"
    assert resolve_tracking_uri("sqlite:///x.db") == "sqlite:///x.db"  # the flag wins
    assert resolve_tracking_uri("runs/x.db") == f"sqlite:///{(sub / 'runs/x.db').resolve()}"
    for bad in ("file:///tmp/mlruns", "./mlruns"):
        with pytest.raises(LedgerError, match="not supported"):
            resolve_tracking_uri(bad)
    assert store.sqlite_path("sqlite:////abs/m.db") == Path("/abs/m.db")
    assert store.sqlite_path("sqlite:///rel/m.db") == sub / "rel/m.db"
    assert store.sqlite_path("http://h:1") is None


def test_git_state_and_config_hash(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    assert git_state(tmp_path).commit == "unknown"
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = git_state(tmp_path)
    assert len(clean.commit) == 40 and not clean.dirty and clean.diff == ""
    (tmp_path / "a.py").write_text("x = 2\n")
    dirty = git_state(tmp_path)
    assert dirty.dirty and dirty.changed_files == 1 and "+x = 2" in dirty.diff
    assert dirty.commit == clean.commit and len(dirty.diff_sha256) == 64
    assert config_hash({"b": 1, "a": {"y": 2, "x": 1}}) == config_hash(
        {"a": {"x": 1, "y": 2}, "b": 1}
    )
    assert config_hash({"a": 1}) != config_hash({"a": 1.5})


# ----------------------------------------------------------------------------- round trip


def test_params_tags_metrics_round_trip(uri: str, tmp_path: Path) -> None:
    lock = tmp_path / "splits.lock"
    lock.write_text(json.dumps({"twx_ids.csv": "ab" * 32, "sciworld_ids.csv": "cd" * 32}))
    config = {**CONFIG, "long": "x" * 7000, "odd key!": {"a/../b": 1}}
    with _start(uri, config=config, splits_lock=lock, tags={"reduction": "token-mean"}) as run:
        run.log_metrics({"return/mean": 0.5, "kl": 0.01}, step=0)
        run.log_metrics({"return/mean": 0.75, "kl": 0.02}, step=1)
        run.set_tags({"note": "hello"})
        run.log_params(config)  # the trainer logging the same config again is a no-op
        run.log_text("# notes", "notes.md")
    client = MlflowClient(uri)
    got = client.get_run(run.run_id)
    p, t = got.data.params, got.data.tags
    assert got.info.status == "FINISHED"
    assert p["train.lr"] == "5e-07" and p["train.steps"] == "150"
    assert p["train.envs"] == '["twx","alfworld"]' and p["model.value_head.tau"] == "1.0"
    assert p["flag"] == "true" and p["nothing"] == "null" and p["empty"] == "{}"
    assert len(p["long"]) == 6000 and p["long"].endswith("]") and "cut: 7000 chars" in p["long"]
    assert p["odd key_.a/_/b"] == "1"  # MLflow-valid key, no path tricks
    assert t["ledger.params_cut"] == "1"
    for key, value in {
        "study": "main", "method": "factor", "env": "twx", "seed": "0", "backbone": "tiny-1m",
        "reduction": "token-mean", "note": "hello", "cpu_cores": "2", "gpus": "0",
        "split.twx_ids.csv": "ab" * 32, "split.sciworld_ids.csv": "cd" * 32,
        "config_hash": config_hash(config), "ledger.session": "1", "kind": "train",
    }.items():  # fmt: skip
        assert t[key] == value, key
    assert len(t["git_commit"]) == 40 or t["git_commit"] == "unknown"
    assert t["git_dirty"] in ("true", "false")
    assert "CPU cores" in t["hardware"]
    history = client.get_metric_history(run.run_id, "return/mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 0.75)]
    assert client.get_run(run.run_id).data.metrics["node_hours"] == 0.0
    local = client.download_artifacts(run.run_id, "config.json", str(tmp_path))
    assert Path(local).read_text() == canonical_json(config)
    assert config_hash({"b": 1, "a": {"y": 2, "x": 1}}) == config_hash(
        {"a": {"x": 1, "y": 2}, "b": 1}
    )
    # artifacts live next to the database, not in ./mlruns of the working directory
    assert (Path(uri[len("sqlite:///") :]).parent / "artifacts").is_dir()


def test_log_metrics_is_one_log_batch_call(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    original = MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), synchronous=True):
        calls.append((len(metrics), len(tags)))
        return original(self, run_id, metrics, params, tags, synchronous)

    with _start(uri) as run:
        monkeypatch.setattr(MlflowClient, "log_batch", spy)
        run.log_metrics({f"m{i}": float(i) for i in range(50)}, step=3)
        assert len(calls) == 1 and calls[0][0] == 50
        run.log_metrics({"ok": 1.0, "bad": float("nan"), "worse": float("inf")}, step=4)
        assert len(calls) == 2 and calls[1][0] == 1
        run.log_metrics({f"w{i}": 1.0 for i in range(1500)}, step=5)  # MLflow splits requests
        assert len(calls) == 3
        with pytest.raises(TypeError, match="'s' must be a number"):
            run.log_metrics({"s": "text"}, step=6)
        with pytest.raises(ValueError, match="step must be an integer"):
            run.log_metrics({"x": 1.0}, step=-1)
    assert run.nonfinite == {"bad": 1, "worse": 1}
    got = MlflowClient(uri).get_run(run.run_id).data
    assert got.metrics["m49"] == 49.0 and got.metrics["w1499"] == 1.0 and "bad" not in got.metrics
    assert json.loads(got.tags["ledger.nonfinite_skipped"]) == {"bad": 1, "worse": 1}


# ----------------------------------------------------------------------------- statuses


def test_failed_run_records_error(uri: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="loss is nan"), _start(uri) as run:
        run.log_metrics({"loss": 1.0}, step=0)
        raise ValueError("loss is nan at step 1")
    client = MlflowClient(uri)
    got = client.get_run(run.run_id)
    assert got.info.status == "FAILED"
    assert got.data.tags["error"] == "ValueError: loss is nan at step 1"
    text = Path(client.download_artifacts(run.run_id, "error.txt", str(tmp_path))).read_text()
    assert "Traceback" in text and "loss is nan at step 1" in text
    with pytest.raises(RuntimeError, match="is closed"):
        run.log_metrics({"loss": 1.0}, step=2)


def test_keyboard_interrupt_is_killed_and_handler_restored(uri: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), _start(uri) as run:
        assert signal.getsignal(signal.SIGTERM) != before
        raise KeyboardInterrupt
    assert signal.getsignal(signal.SIGTERM) == before
    got = MlflowClient(uri).get_run(run.run_id)
    assert got.info.status == "KILLED" and "error" not in got.data.tags
    assert "wall_clock_hours" in got.data.metrics


def test_sigterm_in_subprocess_is_killed(uri: str, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from factor_cli.ledger import start_run
        with start_run({{"a": 1}}, study="main", method="grpo", env="twx", seed=1,
                       backbone="tiny", tracking_uri={uri!r}) as run:
            run.log_metrics({{"loss": 1.0}}, step=0)
            print(run.run_id, flush=True)
            time.sleep(120)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "RunTerminated" in err
    got = MlflowClient(uri).get_run(run_id)
    assert got.info.status == "KILLED"
    assert got.data.metrics["wall_clock_hours"] > 0


# ----------------------------------------------------------------------------- resume, compute


def test_resume_continues_the_same_run(uri: str, clock: list[float]) -> None:
    with _start(uri, gpus=4, cpu_cores=16) as run:
        run.log_metrics({"loss": 3.0}, step=0)
        clock[0] += 3600.0  # one hour
    first = run.run_id
    client = MlflowClient(uri)
    assert client.get_run(first).data.metrics["node_hours"] == pytest.approx(0.5)

    config = {**CONFIG, "train": {**CONFIG["train"], "steps": 200}}  # an edited config
    run2 = _start(uri, gpus=8, cpu_cores=16, resume_run_id=first, config=config)
    assert run2.run_id == first and run2.session == 2
    assert client.get_run(first).info.status == "RUNNING"
    with run2:
        run2.log_metrics({"loss": 2.0}, step=1)
        clock[0] += 1800.0  # half an hour on a full node
    got = client.get_run(first)
    assert got.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(first, "loss")] == [3.0, 2.0]
    assert got.data.tags["ledger.wall_clock_seconds"] == "5400.0"
    assert got.data.metrics["wall_clock_hours"] == pytest.approx(1.5)
    assert got.data.metrics["node_hours"] == pytest.approx(0.5 + 0.5)  # 1 h x 4/8 + 0.5 h x 8/8
    assert got.data.metrics["cpu_core_hours"] == pytest.approx(1.5 * 16)
    assert [m.step for m in client.get_metric_history(first, "node_hours")] == [1, 2]
    assert got.data.params["train.steps"] == "150"  # params are immutable in MLflow
    assert got.data.tags["changed.train.steps"] == "200"
    assert got.data.tags["session.2.config_hash"] == config_hash(config)
    assert got.data.tags["gpus"] == "8"
    assert len(client.search_runs([got.info.experiment_id])) == 1


def test_resume_errors(uri: str) -> None:
    with pytest.raises(LedgerError, match=r"unknown run id 'deadbeef'") as info:
        _start(uri, resume_run_id="deadbeef")
    assert "\n" not in str(info.value)
    with _start(uri) as run:
        pass
    with pytest.raises(LedgerError, match="has method=factor, not grpo"):
        _start(uri, method="grpo", resume_run_id=run.run_id)
    with pytest.raises(LedgerError, match="has kind=train, not eval"):
        _start(uri, kind="eval", resume_run_id=run.run_id)
    with pytest.raises(LedgerError, match="unknown run kind 'sweep'; valid: train, eval"):
        _start(uri, kind="sweep")


@pytest.mark.parametrize(
    ("gpus", "hours", "cores", "node_hours", "core_hours"),
    [
        (8, 1.0, 96, 1.0, 96.0),
        (4, 2.0, 8, 1.0, 16.0),
        (1, 8.0, 2, 1.0, 16.0),
        (0, 3.0, 2, 0.0, 6.0),
    ],
)
def test_node_hours_formula(
    uri: str, clock: list[float], gpus: int, hours: float, cores: int, node_hours: float,
    core_hours: float,
) -> None:  # fmt: skip
    with _start(uri, gpus=gpus, cpu_cores=cores) as run:
        clock[0] += hours * 3600.0
        assert run.compute_hours()["node_hours"] == pytest.approx(hours * gpus / 8)
    m = MlflowClient(uri).get_run(run.run_id).data.metrics
    assert m["node_hours"] == pytest.approx(node_hours)
    assert m["cpu_core_hours"] == pytest.approx(core_hours)
    assert m["wall_clock_hours"] == pytest.approx(hours)


# ----------------------------------------------------------------------------- report, export


def _populate(uri: str, clock: list[float]) -> dict[str, str]:
    """main: factor seeds 0,1 (finished, 2 GPUs, 1 h each); grpo seed 0 failed, seed 1 killed,
    seed 2 never closed (as after SIGKILL); ablation: one finished run."""
    ids = {}
    for seed in (0, 1):
        with _start(uri, seed=seed, gpus=2) as run:
            run.log_items(_items(seed=seed, shift=0))
            clock[0] += 3600.0
        ids[f"factor{seed}"] = run.run_id
    with pytest.raises(RuntimeError), _start(uri, method="grpo", gpus=8) as run:
        clock[0] += 1800.0
        raise RuntimeError("CUDA out of memory")
    ids["failed"] = run.run_id
    with pytest.raises(KeyboardInterrupt), _start(uri, method="grpo", seed=1, gpus=8) as run:
        clock[0] += 900.0
        raise KeyboardInterrupt
    ids["killed"] = run.run_id
    stale = _start(uri, method="grpo", seed=2, gpus=8)  # never closed
    clock[0] += 3600.0
    stale.heartbeat()
    ids["stale"] = stale.run_id
    with _start(uri, study="ablation", method="wo-tac") as run:
        clock[0] += 60.0
    return ids


def test_report_aggregates(uri: str, clock: list[float]) -> None:
    ids = _populate(uri, clock)
    rep = report(None, uri)
    assert list(rep[["study", "method"]].itertuples(index=False, name=None)) == [
        ("ablation", "wo-tac"), ("main", "factor"), ("main", "grpo"),
    ]  # fmt: skip
    factor = rep.set_index(["study", "method"]).loc[("main", "factor")]
    assert (factor["runs"], factor["finished"], factor["failed"]) == (2, 2, 0)
    assert factor["node_hours"] == pytest.approx(2 * 1.0 * 2 / 8)
    assert factor["cpu_core_hours"] == pytest.approx(2 * 1.0 * 2)
    grpo = rep.set_index(["study", "method"]).loc[("main", "grpo")]
    assert (grpo["runs"], grpo["finished"], grpo["failed"], grpo["killed"], grpo["running"]) == (
        3, 0, 1, 1, 1,
    )  # fmt: skip
    assert grpo["node_hours"] == pytest.approx(0.5 + 0.25 + 1.0)  # x 8/8 each
    assert list(report("ablation", uri)["method"]) == ["wo-tac"]
    runs = runs_table("main", uri).set_index("run_id")
    assert runs.loc[ids["failed"], "error"] == "RuntimeError: CUDA out of memory"
    assert runs.loc[ids["stale"], "status"] == "RUNNING"
    with pytest.raises(LedgerError, match=r"unknown study .mian.*known studies: ablation, main"):
        report("mian", uri)


def test_export_round_trip_into_stats(uri: str, clock: list[float], tmp_path: Path) -> None:
    _populate(uri, clock)
    with _start(uri, method="grpo", seed=0, tags={"reduction": "action-mean"}) as run:
        run.log_items(_items(seed=0, shift=1).assign(env="twx", method="grpo", seed=0))
    with _start(uri, method="grpo", seed=1) as run:
        run.log_items(_items(seed=1, shift=1))
        with pytest.raises(ValueError, match="this run is env=twx"):
            run.log_items(_items().assign(env="alfworld"))
        with pytest.raises(ValueError, match="'success' must be binary"):
            run.log_items(_items().assign(success=2))
    frame = export_items("main", uri)
    assert list(frame.columns[:7]) == ["env", "method", "seed", "item_id", "category",
                                       "success", "score"]  # fmt: skip
    assert {"run_id", "study", "backbone", "reduction"} <= set(frame.columns)
    assert len(frame) == 4 * 8 and frame["run_id"].nunique() == 4
    assert frame["item_id"].iloc[0] == "000"

    for out in (tmp_path / "items.csv", tmp_path / "items.parquet"):
        res = runner.invoke(
            app, ["ledger", "export", "--study", "main", "--out", str(out), "--tracking-uri", uri]
        )
        assert res.exit_code == 0, res.output
        assert "wrote 32 items from 4 runs" in res.output
        back = read_results(out)
        assert len(back) == 32 and back["item_id"].iloc[0] == "000"
        assert sorted(set(back["method"])) == ["factor", "grpo"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".items")]  # no temp left
    res = runner.invoke(
        app,
        ["stats", "bootstrap", "-i", str(tmp_path / "items.csv"), "-e", "twx", "-m", "factor",
         "-b", "grpo", "-r", "200", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.output)["per_seed"]) == {"0", "1"}

    with _start(uri, seed=1) as run:  # a rerun of factor seed 1
        run.log_items(_items(seed=1, shift=2))
    with pytest.raises(LedgerError, match="2 finished runs share env=twx, method=factor, seed=1"):
        export_items("main", uri)
    latest = export_items("main", uri, keep_latest=True)
    assert run.run_id in set(latest["run_id"]) and len(latest) == 32


# ----------------------------------------------------------------------------- CLI


def test_cli_report(uri: str, clock: list[float]) -> None:
    ids = _populate(uri, clock)
    res = runner.invoke(app, ["ledger", "report", "--tracking-uri", uri])
    assert res.exit_code == 0, res.output
    assert "Compute by study and method" in res.output and "wo-tac" in res.output
    assert ids["failed"] in res.output and "CUDA out of memory" in res.output
    assert "INFO" not in res.output
    res = runner.invoke(app, ["ledger", "report", "-s", "main", "--tracking-uri", uri, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [r["method"] for r in data["summary"]] == ["factor", "grpo"]
    assert {r["status"] for r in data["unfinished_runs"]} == {"FAILED", "KILLED", "RUNNING"}


def test_cli_errors(uri: str, tmp_path: Path, clock: list[float]) -> None:
    def err(*args: str) -> str:
        res = runner.invoke(app, ["ledger", *args])
        assert res.exit_code == 1, res.output
        line = res.output.strip()
        assert line.startswith("error:") and "Traceback" not in line, line
        return line

    assert "no ledger at" in err("report", "--tracking-uri", f"sqlite:///{tmp_path}/none.db")
    assert "not supported" in err("report", "--tracking-uri", "file:///tmp/mlruns")
    assert "cannot reach" in err("report", "--tracking-uri", "http://127.0.0.1:9")
    with _start(uri) as _run:  # a run without items
        pass
    assert "unknown study 'x'" in err("report", "--study", "x", "--tracking-uri", uri)
    out = tmp_path / "e.csv"
    assert "nothing to export" in err("export", "-s", "main", "-o", str(out), "--tracking-uri", uri)
    assert not out.exists()
    assert "unsupported file type" in err(
        "export", "-s", "main", "-o", str(tmp_path / "e.xlsx"), "--tracking-uri", uri
    )
    empty = runner.invoke(app, ["ledger", "report", "--tracking-uri", uri, "-s", "main"])
    assert empty.exit_code == 0


def test_environment_variable_selects_the_store(
    uri: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with start_run({"a": 1}, study="env", method="m", env="e", seed=0, backbone="b") as run:
        assert run.tracking_uri == uri
    res = runner.invoke(app, ["ledger", "report", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["summary"][0]["study"] == "env"
    assert not (work / "mlruns").exists() and not (work / "ledger").exists()


def test_export_keeps_training_and_evaluation_runs_apart(uri: str) -> None:
    """An eval of a training run repeats its (env, method, seed): exported apart, never mixed."""
    with _start(uri) as train:
        train.log_items(_items())
    for split in ("eval", "train"):
        tags = {"eval.split": split, "eval.run_id": train.run_id}
        with _start(uri, kind="eval", tags=tags) as evaluation:
            evaluation.log_items(_items(shift=1))
    assert list(runs_table("main", uri)["kind"]) == ["train", "eval", "eval"]
    trained = export_items("main", uri)
    assert set(trained["run_id"]) == {train.run_id} and "split" not in trained.columns
    evals = export_items("main", uri, kind="eval")
    assert len(evals) == 2 * 8 and sorted(set(evals["split"])) == ["eval", "train"]
    assert set(evals["evaluated_run"]) == {train.run_id}
    with pytest.raises(LedgerError, match="unknown run kind 'sft'"):
        export_items("main", uri, kind="sft")


# ----------------------------------------------------------------------------- versions


def test_runs_record_versions_and_reports_name_what_differs(
    uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from factor_cli.ledger import provenance as prov

    with _start(uri) as run:
        first = run.run_id
    tags = MlflowClient(uri).get_run(first).data.tags
    for name in (*prov.VERSIONED, "python", "platform", "java"):
        assert tags[f"version.{name}"], name
    assert tags["version.python"] == sys.version.split()[0]
    res = runner.invoke(app, ["ledger", "report", "--tracking-uri", uri])
    assert res.exit_code == 0 and "differ in" not in res.output
    real = prov.versions()
    monkeypatch.setattr(prov, "versions", lambda: {**real, "version.textworld-express": "9.9"})
    with _start(uri, seed=1):
        pass
    res = runner.invoke(app, ["ledger", "report", "--tracking-uri", uri, "--json"])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output[res.output.index("{") :])
    (line,) = payload["version_differences"]
    assert (
        "differ in textworld-express: 1.1.0, 9.9" in line or "differ in textworld-express" in line
    )


def test_stats_warns_when_the_exported_runs_differ_in_a_version(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``factor stats`` finds the runs of an exported items file (its run_id column) in the
    ledger and names the package whose version differs between them."""
    from factor_cli.ledger import provenance as prov

    out = tmp_path / "items.csv"
    args = ["stats", "bootstrap", "-i", str(out), "-e", "twx", "-m", "factor", "-b", "grpo",
            "-r", "50"]  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for method, shift in (("factor", 0), ("grpo", 1)):
        with _start(uri, method=method) as run:
            run.log_items(_items(shift=shift))
    export_items("main", uri).to_csv(out, index=False)
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "differ in" not in res.output, res.output
    real = prov.versions()
    monkeypatch.setattr(prov, "versions", lambda: {**real, "version.transformers": "0.0.1"})
    for method, shift in (("factor", 0), ("grpo", 1)):
        with _start(uri, method=method, seed=1) as run:
            run.log_items(_items(seed=1, shift=shift))
    export_items("main", uri).to_csv(out, index=False)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert f"the runs of {out} differ in transformers: 0.0.1, " in " ".join(res.output.split())


def test_version_conflicts_ignores_runs_without_the_tags() -> None:
    from factor_cli.ledger.provenance import version_conflicts

    got = version_conflicts(
        [{"version.torch": "2.13.0", "version.python": "3.11"}, {"version.torch": "2.12.0"}, {}]
    )
    assert got == {"torch": ["2.12.0", "2.13.0"]}
