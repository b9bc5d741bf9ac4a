"""Training end to end on the CPU: every method for two steps, the ledger record, resume after
SIGKILL, data-parallel equality, and configuration errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from factor_cli.credit import METHODS
from factor_cli.envs import availability
from factor_cli.train.config import ConfigError, load_config

twx_missing = availability("twx")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
ROOT = Path(__file__).resolve().parents[2]


def tiny_overrides(model: Path, tmp: Path, method: str = "factor", steps: int = 2) -> list[str]:
    return [
        f"method={method}",
        f"steps={steps}",
        f"model.path={model}",
        "model.init_tiny=null",
        "rollout.groups=1",
        "rollout.k=2",
        "rollout.max_new_tokens=8",
        "env.max_turns=3",
        "continuations.horizon=2",
        "continuations.per_checkpoint=1",
        "sft.enabled=false",
        "eval.max_items=2",
        f"output_dir={tmp / 'runs'}",
        f"tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
        "credit.warmup_steps=1",
        # Free decoding, the paper's path (smoke constrains; tests/train/test_constrained_update.py
        # trains under constraint).
        "rollout.valid_action_decoding=false",
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.k=1", "field rollout.k: Input should be greater than or equal to 2"),
        ("method=factr", "field method: unknown method 'factr'"),
        ("credit.tau=0", "credit.tau = 0.0 is invalid"),
        ("bogus.key=1", "field bogus: Extra inputs are not permitted"),
        ("engine.zero_stage=7", "field engine.zero_stage"),
        ("rollout", "expected KEY=VALUE"),
    ],
)
def test_bad_config_is_one_line_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config("smoke", [override])
    assert "\n" not in str(err.value)


def test_presets_and_overrides() -> None:
    paper = load_config("paper")
    assert (paper.rollout.groups * paper.rollout.k, paper.optim.lr, paper.steps) == (128, 5e-7, 150)
    assert (paper.continuations.budget, paper.continuations.per_checkpoint) == (2, 4)
    assert load_config("paper", ["method=serl-extended"]).total_steps == 188
    assert load_config("smoke", ["rollout.temperature=0.4"]).rollout.temperature == 0.4
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config("nope")


@pytest.fixture(scope="module")
def trained_env(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("train")


@needs_twx
@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_every_method_trains_two_steps(
    method: str, tiny_model_dir: Path, trained_env: Path
) -> None:
    """Each method's step does what its METHODS entry says: the SERL KL term is logged
    non-zero iff the method has one, the value head trains iff the method uses it, and
    continuations are played iff the method's budget includes them, and a critic (PPO) is
    built and trained iff the method has one."""
    from factor_cli.train.trainer import Trainer

    spec = METHODS.get(method)
    cfg = load_config("smoke", tiny_overrides(tiny_model_dir, trained_env, method))
    trainer = Trainer(cfg)
    try:
        for k in (1, 2):
            m = trainer.train_step().metrics
            assert trainer.step == k
            for key in ("loss", "loss_action", "grad_norm", "return_mean"):
                assert key in m and m[key] == m[key] and abs(m[key]) < 1e6, (key, m)
            assert (m["kl"] != 0.0) == spec.kl, (m["kl"], m["kl_coef"])
            assert (m["kl_coef"] > 0.0) == spec.kl
            assert ("value_mse" in m) == spec.uses_value_head, m
            assert ("critic_loss" in m) == spec.critic == (trainer.critic is not None), m
            assert (m["continuation_interactions"] > 0) == spec.continuations, m
            # The rollout filled the hf prefix cache; the update made it stale, so it is gone.
            assert trainer.backend.prefix_reuse and len(trainer.backend.prefix_cache) == 0
    finally:
        trainer.close()


@needs_twx
def test_overlapped_continuations_change_no_step(
    tiny_model_dir: Path, trained_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``continuations.overlap`` on and off: the same episodes, value targets, losses and
    metrics (only the phase times differ). With overlap the continuations phase plays
    nothing: the rollout already played them."""
    from factor_cli.train import trainer as trainer_module
    from factor_cli.train.trainer import Trainer

    played_after_rollout: list[bool] = []
    run_continuations = trainer_module.run_continuations

    def counted(*args: object, **kwargs: object) -> object:
        played_after_rollout.append(True)
        return run_continuations(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "run_continuations", counted)
    base = tiny_overrides(tiny_model_dir, trained_env, "factor", steps=1)
    base += ["rollout.groups=2", "continuations.per_checkpoint=2", "env.max_turns=4"]
    steps, calls = {}, {}
    for overlap in (True, False):
        trainer = Trainer(load_config("smoke", [*base, f"continuations.overlap={overlap}"]))
        try:
            steps[overlap] = trainer.train_step()
        finally:
            trainer.close()
        calls[overlap] = len(played_after_rollout)
        played_after_rollout.clear()
    on, off = steps[True], steps[False]
    assert calls == {True: 0, False: 1}
    untimed = [k for k in off.metrics if not k.startswith("time_")]
    assert {k: on.metrics[k] for k in untimed} == pytest.approx(
        {k: off.metrics[k] for k in untimed}, rel=1e-5, abs=1e-6
    )
    assert off.metrics["continuation_interactions"] > 0
    assert [e.actions for e in on.record.roots] == [e.actions for e in off.record.roots]


@needs_twx
@pytest.mark.parametrize("method", ["factor", "vineppo"])
def test_continuations_in_training_end_where_the_episode_would(
    tiny_model_dir: Path, trained_env: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """The trainer's environments carry the episode's turn limit (env.max_turns), so a value
    target or Monte-Carlo value from x_t is a return within the limit - t turns the episode has
    left, however long continuations.horizon is (here 10 > 4)."""
    from factor_cli.train import trainer as trainer_module
    from factor_cli.train.trainer import Trainer

    results = []
    run_continuations = trainer_module.run_continuations

    def kept(*args: object, **kwargs: object) -> object:
        results.append(run_continuations(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(trainer_module, "run_continuations", kept)
    base = tiny_overrides(tiny_model_dir, trained_env, method, steps=1)
    base += ["rollout.groups=2", "continuations.per_checkpoint=2", "continuations.per_state=2",
             "env.max_turns=4", "continuations.horizon=10",
             "continuations.overlap=false"]  # fmt: skip
    trainer = Trainer(load_config("smoke", base))
    try:
        trainer.train_step()
    finally:
        trainer.close()
    (res,) = results
    ends = [res.checkpoints[c].turn + len(e.turns) for c, e in zip(res.checkpoint_of, res.episodes)]
    assert ends and max(ends) <= 4


@needs_twx
def test_train_run_records_everything_in_the_ledger(tiny_model_dir: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from factor_cli.train.run import train

    cfg = load_config("smoke", tiny_overrides(tiny_model_dir, tmp_path, "factor", steps=2))
    summary = train(cfg, lambda *a: None, lambda s: None)
    client = MlflowClient(cfg.tracking_uri)
    run = client.get_run(summary.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["method"] == "factor" and run.data.params["rollout.k"] == "2"
    assert {"study", "method", "env", "seed", "backbone", "config_hash"} <= set(run.data.tags)
    assert "node_hours" in run.data.metrics and "cpu_core_hours" in run.data.metrics
    assert len(client.get_metric_history(summary.run_id, "loss")) == 2
    assert summary.items_path is not None and summary.items_path.exists()
    assert (summary.run_dir / "model" / "config.json").exists()
    lines = (summary.run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]


def _train_cmd(
    model: Path, tmp: Path, extra: list[str], method: str = "factor", steps: int = 2
) -> list[str]:
    args = [sys.executable, "-m", "factor_cli", "train", "--config", "smoke"]
    for o in tiny_overrides(model, tmp, method, steps=steps):
        args += ["--set", o]
    return args + extra


@needs_twx
def test_vineppo_trains_from_the_command_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`factor train --set method=vineppo`, one step: the recorded values are the mean
    continuation targets of each interior state (the state before's where none ran), the
    credit telescopes to A^seq per trajectory, and no value head is fitted."""
    import pandas as pd

    extra = ["--set", "continuations.per_state=2", "--set", "eval.start=false"]
    proc = subprocess.run(
        _train_cmd(tiny_model_dir, tmp_path, extra, "vineppo", steps=1),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "runs").glob("*/metrics.jsonl")]
    (m,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "value_mse" not in m and m["continuation_interactions"] > 0
    assert m["mc_states"] > m["mc_states_unestimated"] >= 0
    acts = pd.read_csv(run_dir / "records" / "actions-000001.csv")
    conts = pd.read_csv(run_dir / "records" / "continuations-000001.csv")
    interior = acts[acts.turn > 0]
    assert set(zip(conts.traj, conts.turn)) <= set(zip(interior.traj, interior.turn))
    means = conts.groupby(["traj", "turn"]).target.mean()
    assert len(conts) == 2 * len(means)
    for traj, rows in acts.groupby("traj"):
        value = rows.v0.iloc[0]
        for turn, recorded in zip(rows.turn, rows.value):
            value = means.get((traj, turn), value) if turn > 0 else value
            assert recorded == pytest.approx(value, abs=1e-6)
        assert rows.credit.sum() == pytest.approx(rows.a_seq.iloc[0], abs=1e-5)


@pytest.mark.slow
@needs_twx
def test_sigkill_then_resume_matches_uninterrupted(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full = subprocess.run(
        _train_cmd(tiny_model_dir, full_dir, []),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert full.returncode == 0, full.stdout[-1500:] + full.stderr[-3000:]
    proc = subprocess.Popen(
        _train_cmd(tiny_model_dir, cut_dir, []),
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 900
    pointer = None
    while time.time() < deadline and proc.poll() is None:
        found = list((cut_dir / "runs").glob("*/checkpoints/latest"))
        if found and json.loads(found[0].read_text())["step"] == 1:
            pointer = found[0]
            break
        time.sleep(0.05)
    assert pointer is not None, "the run never wrote its step-1 checkpoint"
    os.kill(proc.pid, signal.SIGKILL)  # mid-step 2 (or just before it)
    proc.wait()
    run_id = pointer.parents[1].name
    resumed = subprocess.run(
        _train_cmd(tiny_model_dir, cut_dir, ["--resume", run_id]),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stdout[-1500:] + resumed.stderr[-3000:]

    def step2(d: Path) -> dict:
        (metrics,) = list((d / "runs").glob("*/metrics.jsonl"))
        rows = [json.loads(x) for x in metrics.read_text().splitlines()]
        return next(r for r in reversed(rows) if r["step"] == 2)

    a, b = step2(full_dir), step2(cut_dir)
    # Both runs are on this machine with its kernels: equal to float precision. (Pinned numbers
    # from another machine are compared within float32 tolerances: tests/pins.py.)
    for key in ("loss", "loss_action", "return_mean", "grad_norm", "value_mse", "actions"):
        assert a[key] == pytest.approx(b[key], abs=1e-6), key


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_micro_batching_never_changes_the_update(tiny_model_dir: Path, zero_stage: int) -> None:
    """Any split of a mini-batch into micro-batches gives the one-micro-batch update, at every
    ZeRO stage, and the shared-prefix forward (``optim.share_prefixes``, several forwards per
    micro-batch) gives the padded forward's. (ZeRO-3 once kept only the last micro-batch's
    gradient: forward passes that bypass DeepSpeed's forward never told it that a new
    micro-batch began.)"""
    import torch
    from synthetic import synthetic_batch

    from factor_cli.credit import assign_credit
    from factor_cli.policy.model import load_policy
    from factor_cli.train.engine import Engine
    from factor_cli.train.update import ppo_update

    runs = {}
    for micro, share in ((3, True), (100, True), (100, False)):
        cfg = load_config(
            "smoke",
            [
                f"engine.zero_stage={zero_stage}",
                f"optim.micro_batch_actions={micro}",
                f"optim.share_prefixes={str(share).lower()}",
                "optim.lr=1e-3",
                "optim.minibatches=1",
            ],
        )
        policy = load_policy(str(tiny_model_dir))
        rb = synthetic_batch(policy.model)
        credit = assign_credit(rb.batch, "grpo", 20)
        engine = Engine(policy.model, cfg)
        losses = [
            ppo_update(engine, rb, credit, cfg, 0, None, torch.Generator().manual_seed(i)).loss
            for i in range(3)
        ]
        with engine.full_parameters() as module:
            weights = torch.cat([p.detach().flatten().clone() for p in module.parameters()])
        runs[micro, share] = (losses, weights)
    l100, w100 = runs[100, True]
    for other in ((3, True), (100, False)):
        lo, wo = runs[other]
        assert lo == pytest.approx(l100, abs=1e-6), other
        # Adam divides by sqrt(v): float noise on near-zero gradients moves a weight by ~1e-6
        # of the ~3e-3 each step moves it; a lost micro-batch changes the losses themselves.
        assert float((wo - w100).abs().max()) < 1e-4, other


def _dp_results(model: Path, tmp: Path, flags: list[str]) -> dict[int, dict[str, float]]:
    """Rank 0's results of ``tests/dp_worker.py`` under torchrun with 2 processes, and the same
    update in this process (the one-process reference: a launch would only add its start-up)."""
    from dp_worker import update_results  # tests/ is on sys.path, as for synthetic

    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp / "dp2.json"
    # --standalone: the rendezvous binds port 0 itself (a port picked here could be taken
    # by another test's process before torchrun binds it).
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "dp_worker.py"), str(model), str(out), *flags]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    one, rank = update_results(str(model), flags)
    assert rank == 0 and one["world"] == 1
    results = {1: one, 2: json.loads(out.read_text())}
    assert results[2]["world"] == 2
    return results


@pytest.mark.slow
def test_two_processes_equal_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Data-parallel DeepSpeed (2 CPU processes, gloo) gives the single-process update. Uneven
    shares of a mini-batch and ZeRO-3 (whose forwards are collectives: every rank must run as
    many) are covered by the PPO test below, whose policy takes the same update path beside
    its critic."""
    results = _dp_results(tiny_model_dir, tmp_path, [])
    assert results[2]["delta"] > 0
    for key in ("loss", "delta", "first"):
        assert results[1][key] == pytest.approx(results[2][key], rel=1e-5, abs=1e-6), key


@pytest.mark.slow
@pytest.mark.parametrize("zero3", [False, True], ids=["zero1", "zero3"])
def test_two_processes_equal_one_with_the_critic(
    tiny_model_dir: Path, tmp_path: Path, zero3: bool
) -> None:
    """PPO over 2 CPU ranks: the policy's and the critic's losses and updated weights equal
    the single process's. The critic's engine reduces its gradients over ranks as the
    policy's does; with uneven shares the smaller one pads the critic's forward too (under
    ZeRO-3 a missing one would hang the other rank's gather). The pre-clip gradient norms
    match too: Adam after a binding clip is blind to a constant gradient scale, the norm is
    not (ranks averaging instead of summing their shares would halve it)."""
    flags = ["--ppo", "--uneven", *(["--zero3"] if zero3 else [])]
    results = _dp_results(tiny_model_dir, tmp_path, flags)
    assert results[2]["delta"] > 0 and results[2]["critic_delta"] > 0
    assert results[2]["critic_loss"] > 0 and results[2]["critic_grad_norm"] > 0
    keys = ("loss", "delta", "first", "grad_norm")
    for key in (*keys, "critic_loss", "critic_delta", "critic_first", "critic_grad_norm"):
        assert results[1][key] == pytest.approx(results[2][key], rel=1e-5, abs=1e-6), key


@pytest.mark.slow
@needs_twx
def test_torchrun_job_equals_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`torchrun --nproc_per_node 2 -m factor_cli train`: rollouts, continuations and eval
    sharded over 2 CPU ranks give the single-process run's metrics and results, also across a
    two-rank resume; one ledger run. (PPO's critic over ranks: its update's numerics are
    test_two_processes_equal_one_with_the_critic's, its engine's place in a checkpoint
    test_trainer_checkpoints_the_critic's; its save and load are the policy engine's, which
    this job resumes on two ranks.)"""
    method, own_metrics = "factor", ("value_mse",)
    from mlflow.tracking import MlflowClient

    overrides = [*tiny_overrides(tiny_model_dir, tmp_path, method), "rollout.groups=2"]
    torchrun = Path(sys.executable).with_name("torchrun")
    launch = {
        1: [sys.executable, "-m", "factor_cli"],
        2: [
            str(torchrun),
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "factor_cli",
        ],
    }

    def job(n: int, out: Path, extra: list[str]) -> None:
        args = [*launch[n], "train", *extra]
        for o in overrides:
            args += ["--set", o.replace(str(tmp_path), str(out))]
        res = subprocess.run(
            args,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-3000:]

    def ledger(out: Path):
        client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
        exps = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(exps)
        assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # one run per job
        return runs[0]

    rows, items = {}, {}
    # Two ranks stop after step 1; `--resume` on two ranks loads every rank's engine shard and
    # continues the same ledger run through step 2.
    job(1, tmp_path / "n1", [])
    job(2, tmp_path / "n2", ["--set", "steps=1"])
    job(2, tmp_path / "n2", ["--set", "steps=2", "--resume", ledger(tmp_path / "n2").info.run_id])
    for n in (1, 2):
        run = ledger(tmp_path / f"n{n}")
        assert run.data.tags["world_size"] == str(n)
        run_dir = tmp_path / f"n{n}" / "runs" / run.info.run_id
        rows[n] = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        items[n] = (run_dir / "eval_items.csv").read_text()
    assert [r["step"] for r in rows[2]] == [1, 2]
    for a, b in zip(rows[1], rows[2]):
        for key in ("actions", "action_tokens", "root_interactions", "continuation_interactions"):
            assert a[key] == b[key], key  # the same episodes, played on two ranks
        for key in ("return_mean", "success_rate", "loss", "loss_action", "kl", *own_metrics):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
    assert items[1] == items[2]


@needs_twx
def test_engine_crash_mid_rollout_is_survived(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An engine dying mid-episode is restarted; the episode counts as lost; training goes on."""
    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", [*tiny_overrides(tiny_model_dir, tmp_path, "grpo"), "rollout.k=3"])
    trainer = Trainer(cfg)
    try:
        victim = trainer.pool[0]
        real_step = victim._step
        calls = {"n": 0}

        def flaky(action: str):
            calls["n"] += 1
            if calls["n"] == 2:
                raise ConnectionResetError("simulated engine death")
            return real_step(action)

        victim._step = flaky  # type: ignore[method-assign]
        m = trainer.train_step().metrics
        assert len(trainer.pool.crashes) == 1 and m["episodes_lost"] == 1.0
        assert trainer.pool[0] is not victim  # replaced by a fresh environment
        assert trainer.train_step().metrics["episodes_lost"] == 0.0
    finally:
        trainer.close()


@pytest.mark.slow
@needs_twx
def test_ctrl_c_names_the_run_and_its_resume_command(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Ctrl-C mid-run: exit 130, the ledger run closed KILLED, and stderr prints the exact
    command that continues it (the run's id, the same --set items), which then finishes it."""
    import shlex

    import mlflow

    proc = subprocess.Popen(
        _train_cmd(tiny_model_dir, tmp_path, []),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if list((tmp_path / "runs").glob("*/checkpoints/latest")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if (p / "checkpoints").is_dir()]
    # Whatever a library prints at shutdown may follow it, so the line is looked for, not
    # assumed last.
    said = [ln for ln in err.splitlines() if ln.startswith("interrupted: ")]
    assert said, err[-3000:]
    line = said[-1]
    assert line.startswith("interrupted: resume with `factor train --resume "), line
    command = line.split("`")[1]
    assert "RUN_ID" not in line and run_dir.name in command
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(run_dir.name).info.status == "KILLED"
    argv = shlex.split(command)
    resumed = subprocess.run(
        [sys.executable, "-m", "factor_cli", *argv[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stdout[-1500:] + resumed.stderr[-3000:]
    assert client.get_run(run_dir.name).info.status == "FINISHED"
