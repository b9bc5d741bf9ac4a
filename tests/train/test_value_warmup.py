"""The value warm-up (``value.warmup_rollouts``): targets of the starting policy fit the head
before any policy update; the target head starts as the fitted online head; the policy does not
move; methods without a value head skip it; a run logs it at step 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_train import needs_twx, tiny_overrides

from factor_cli.train.config import ConfigError, load_config

pytestmark = needs_twx
PLAYABLE = [
    "env.options.params.coin=numLocations=3,numDistractorItems=0,includeDoors=0",
    "rollout.valid_action_decoding=true",
    "rollout.groups=2",
    "rollout.k=2",
]


def _trainer(tiny_model_dir: Path, tmp: Path, method: str, *extra: str):
    from factor_cli.train.trainer import Trainer

    warm = ["value.warmup_rollouts=2", "value.warmup_epochs=3"]
    cfg = load_config("smoke", [*tiny_overrides(tiny_model_dir, tmp, method, 1), *PLAYABLE,
                                *warm, *extra])  # fmt: skip
    return Trainer(cfg, str(tiny_model_dir))


def test_warmup_fits_the_head_and_leaves_the_policy(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, "factor")
    try:
        before = [p.detach().clone() for p in trainer.policy.model.parameters()]
        target0 = [p.detach().clone() for p in trainer.heads.target.parameters()]
        got = trainer.value_warmup()
        assert got["value_warmup_targets"] == len(trainer.buffer) > 0
        assert trainer.buffer.steps == [0] and got["time_value_warmup"] > 0
        online, target = trainer.heads.online.state_dict(), trainer.heads.target.state_dict()
        assert all(torch.equal(online[k], target[k]) for k in online)
        assert any(not torch.equal(a, b) for a, b in
                   zip(target0, trainer.heads.target.parameters()))  # fmt: skip
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.model.parameters()))
        assert trainer.step == 0
        trainer.train_step()  # the first step adds its own targets beside the warm-up's
        assert trainer.buffer.steps == [0, 1]
    finally:
        trainer.close()


def test_methods_without_a_value_head_skip_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, "grpo")
    try:
        assert trainer.value_warmup() == {} and len(trainer.buffer) == 0
    finally:
        trainer.close()


def test_a_run_logs_the_warmup_at_step_zero(tiny_model_dir: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from factor_cli.train.run import train

    cfg = load_config("smoke", [*tiny_overrides(tiny_model_dir, tmp_path, "factor", 1),
                                *PLAYABLE, "value.warmup_rollouts=1"])  # fmt: skip
    lines: list[str] = []
    summary = train(cfg, lambda *a: None, lines.append)
    history = MlflowClient(cfg.tracking_uri).get_metric_history(summary.run_id,
                                                                "value_warmup_targets")  # fmt: skip
    assert [m.step for m in history] == [0] and history[0].value > 0
    assert any(line.startswith("value warm-up:") for line in lines)


def test_a_negative_warmup_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"value\.warmup_rollouts"):
        load_config("smoke", ["value.warmup_rollouts=-1"])


def test_a_ridge_head_warms_up_trains_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """value.head=ridge: the warm-up solves it, a step refits it, a checkpoint restores it."""
    from factor_cli.train.trainer import Trainer

    trainer = _trainer(tiny_model_dir, tmp_path, "factor", "value.head=ridge")
    try:
        assert trainer.value_warmup()["value_warmup_targets"] > 0
        assert float(trainer.heads.target.weight.abs().sum()) > 0
        result = trainer.train_step()
        assert "value_mse" in result.metrics
        saved = trainer.save(tmp_path / "run", "r")
        state = {k: v.clone() for k, v in trainer.heads.state_dict()["target"].items()}
    finally:
        trainer.close()
    again = Trainer(trainer.cfg, str(tiny_model_dir))
    try:
        again.load(saved)
        assert all(torch.equal(v, again.heads.target.state_dict()[k]) for k, v in state.items())
    finally:
        again.close()
