"""PPO's critic on the training side: its value convention, that it learns, its checkpoint
state, where it comes from (a copy of the policy or ``model.critic_path``), and bad paths as
one-line configuration errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from factor_cli.credit import value_loss
from factor_cli.envs import availability
from factor_cli.train.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/no/such/critic", "field model.critic_path: /no/such/critic: no such model directory"),
        ("README.md", "field model.critic_path: README.md is not a model directory"),
    ],
)
def test_bad_critic_path_is_one_line_error(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config("smoke", ["method=ppo", f"model.critic_path={path}"])
    assert "\n" not in str(err.value)
    assert "--set model.critic_path" in str(err.value)


def _cfg(tiny: Path, tmp: Path, critic_path: Path | None = None):
    overrides = [f"model.path={tiny}", "model.init_tiny=null", "method=ppo"]
    overrides += [f"output_dir={tmp}", "critic.lr=1e-3"]
    if critic_path is not None:
        overrides.append(f"model.critic_path={critic_path}")
    return load_config("smoke", overrides)


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    from factor_cli.policy.model import load_policy

    return load_policy(str(tiny_model_dir))


@pytest.mark.parametrize("from_path", [False, True])
def test_values_are_read_before_each_reply_token(
    from_path: bool, policy, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """V before reply token j = the head at the last position of prompt + reply[:j]: the first
    reply token's value sits on the last prompt token (the action's boundary x_t)."""
    from factor_cli.train.critic import build_critic

    critic = build_critic(
        _cfg(tiny_model_dir, tmp_path, tiny_model_dir if from_path else None), policy
    )
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # the zero head would read 0 everywhere
    prompts, replies = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    got = critic.reply_values(prompts, replies, pad_id=0)
    for p, r, v in zip(prompts, replies, got):
        for j in range(len(r)):
            prefix = torch.tensor([p + r[:j]])
            with torch.no_grad():
                h = critic.backbone(input_ids=prefix).last_hidden_state[0, -1]
                want = critic.head(h.float()).squeeze(-1)
            torch.testing.assert_close(v[j], want, atol=1e-5, rtol=1e-5)


def test_default_critic_copies_the_policy_backbone(policy, tiny_model_dir, tmp_path) -> None:
    from factor_cli.train.critic import build_critic

    critic = build_critic(_cfg(tiny_model_dir, tmp_path), policy)
    assert float(critic.head.weight.detach().abs().sum()) == 0.0  # V = 0 at the start
    base = dict(policy.model.base_model.named_parameters())
    for name, p in critic.backbone.named_parameters():
        torch.testing.assert_close(p, base[name])
        assert p.data_ptr() != base[name].data_ptr()  # a copy: training it leaves the policy


def test_critic_learns_and_round_trips_its_state(policy, tiny_model_dir, tmp_path) -> None:
    from factor_cli.train.critic import build_critic

    cfg = _cfg(tiny_model_dir, tmp_path)
    critic = build_critic(cfg, policy)
    prompts, replies = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    target = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    index = torch.tensor([0, 0, 1, 1, 1])
    losses = []
    for _ in range(10):
        v = torch.cat(critic.reply_values(prompts, replies, 0, with_grad=True))
        loss = value_loss(v, v.detach(), target, index, "action-mean", clip=float("inf"))
        loss.backward()
        assert critic.step() > 0
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    other = build_critic(cfg, policy)
    other.load_full_state(critic.full_state())
    torch.testing.assert_close(
        torch.cat(other.reply_values(prompts, replies, 0)),
        torch.cat(critic.reply_values(prompts, replies, 0)),
    )


def _ppo_update_run(tiny: Path, micro: int) -> tuple[list[float], torch.Tensor, torch.Tensor]:
    """Three PPO phases on a synthetic batch with the critic: (losses, policy w, critic w)."""
    import dataclasses

    from synthetic import synthetic_batch

    from factor_cli.credit import assign_credit
    from factor_cli.policy.model import load_policy
    from factor_cli.train.critic import build_critic
    from factor_cli.train.engine import Engine
    from factor_cli.train.update import ppo_update

    cfg = load_config(
        "smoke",
        [
            "method=ppo",
            "engine.zero_stage=0",
            f"optim.micro_batch_actions={micro}",
            "optim.lr=1e-3",
            "optim.minibatches=2",  # whitening per mini-batch, two critic steps per phase
            "critic.lr=1e-3",
        ],
    )
    policy = load_policy(str(tiny))
    critic = build_critic(cfg, policy)
    torch.nn.init.normal_(critic.head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
    rb = synthetic_batch(policy.model)
    values = [
        v[torch.tensor(m)]
        for v, m in zip(critic.reply_values(rb.prompts, rb.replies, 0), rb.action_masks)
    ]
    rb.batch = dataclasses.replace(rb.batch, token_values=torch.cat(values).detach())
    credit = assign_credit(rb.batch, "ppo", 1, cfg.credit, cfg.reduction)
    engine = Engine(policy.model, cfg)
    losses = []
    for i in range(3):
        gen = torch.Generator().manual_seed(i)
        stats = ppo_update(engine, rb, credit, cfg, 0, None, gen, critic)
        losses += [stats.loss, stats.critic_loss]
    weights = torch.cat([p.detach().flatten().clone() for p in engine.module.parameters()])
    cw = torch.cat([p.detach().flatten().clone() for p in critic.parameters()])
    return losses, weights, cw


def test_micro_batching_never_changes_the_ppo_update(tiny_model_dir: Path) -> None:
    """The critic loss is normalised by the mini-batch's global count and the advantages are
    whitened over the whole mini-batch, so any micro-batch split gives the same update."""
    l3, w3, c3 = _ppo_update_run(tiny_model_dir, 3)
    l100, w100, c100 = _ppo_update_run(tiny_model_dir, 100)
    assert l3 == pytest.approx(l100, rel=1e-5, abs=1e-6)  # float32 sums in another order
    assert all(x > 0 for x in l3[1::2])  # the critic loss is there
    assert float((w3 - w100).abs().max()) < 1e-4
    assert float((c3 - c100).abs().max()) < 1e-4


@pytest.mark.skipif(availability("twx") is not None, reason=f"twx: {availability('twx')}")
def test_trainer_checkpoints_the_critic(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A resumed PPO run continues from the saved critic (weights and Adam state), not from a
    fresh copy of the policy."""
    from test_train import tiny_overrides  # tests/train is on the path (no __init__.py)

    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", tiny_overrides(tiny_model_dir, tmp_path, "ppo", steps=1))
    trainer = Trainer(cfg)
    try:
        assert "critic_loss" in trainer.train_step().metrics
        # Tiny runs often score 0 (zero returns, zero critic gradient): mark the head instead.
        torch.nn.init.normal_(
            trainer.critic.head.weight, generator=torch.Generator().manual_seed(0)
        )
        saved = trainer.save(tmp_path / "run", None)
        want = {k: v.clone() for k, v in trainer.critic.state_dict().items()}
    finally:
        trainer.close()
    fresh = Trainer(cfg)
    try:
        assert not torch.equal(fresh.critic.head.weight, want["head.weight"])
        fresh.load(saved)
        for k, v in fresh.critic.state_dict().items():
            torch.testing.assert_close(v, want[k])
        assert fresh.critic.optimizer.state_dict()["state"]  # Adam's moments came back too
    finally:
        fresh.close()
