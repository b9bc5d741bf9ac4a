"""PPO's critic on the training side: its value convention, that it learns, its DeepSpeed
engine (built from ``engine.*`` with ``critic.*``; its step equals plain clipped Adam at ZeRO 0
and 3), its checkpoint state, where it comes from (a copy of the policy or
``model.critic_path``), and bad paths as one-line configuration errors."""

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
    from factor_cli.train.critic import build_critic, reply_values

    critic = build_critic(
        _cfg(tiny_model_dir, tmp_path, tiny_model_dir if from_path else None), policy
    )
    torch.nn.init.normal_(critic.head.weight, std=0.5)  # the zero head would read 0 everywhere
    prompts, replies = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    got = reply_values(critic, prompts, replies, pad_id=0)
    for p, r, v in zip(prompts, replies, got):
        for j in range(len(r)):
            prefix = torch.tensor([p + r[:j]])
            with torch.no_grad():
                h = critic.backbone(input_ids=prefix).last_hidden_state[0, -1]
                want = critic.head(h).squeeze(-1).float()
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
    """The critic's engine lowers the value loss, and its checkpoint folder (``critic``)
    restores the weights into a fresh engine."""
    from factor_cli.train.critic import CriticEngine, build_critic

    cfg = _cfg(tiny_model_dir, tmp_path)
    critic = CriticEngine(build_critic(cfg, policy), cfg)
    prompts, replies = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    target = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    index = torch.tensor([0, 0, 1, 1, 1])
    losses = []
    for _ in range(10):
        v = torch.cat(critic.train_values(prompts, replies, 0))
        loss = value_loss(v, v.detach(), target, index, "action-mean", clip=float("inf"))
        critic.backward(loss, boundary=True)
        assert critic.step() > 0
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    critic.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "critic").is_dir()
    other = CriticEngine(build_critic(cfg, policy), cfg)
    other.load(tmp_path / "ckpt")
    torch.testing.assert_close(
        torch.cat(other.values(prompts, replies, 0)), torch.cat(critic.values(prompts, replies, 0))
    )


def test_critic_engine_takes_the_engine_settings(policy, tiny_model_dir, tmp_path) -> None:
    """The critic's engine is built like the policy's from ``engine.*``: ZeRO-3 partitions its
    parameters (each rank holds an empty placeholder until gathered), bf16 applies; its
    optimizer runs at ``critic.lr`` with clip ``critic.grad_clip``, not ``optim.*``."""
    from factor_cli.train.critic import CriticEngine, build_critic

    cfg = load_config(
        "smoke",
        [
            *[f"model.path={tiny_model_dir}", "model.init_tiny=null", "method=ppo"],
            *["engine.zero_stage=3", "engine.precision=bf16", "optim.lr=1e-2"],
            *["optim.grad_clip=5.0", "critic.lr=3e-4", "critic.grad_clip=0.5"],
        ],
    )
    model = build_critic(cfg, policy)
    shapes = [p.shape for p in model.parameters()]
    critic = CriticEngine(model, cfg)
    assert all(p.numel() == 0 for p in critic.module.parameters())  # partitioned
    assert {p.dtype for p in critic.module.parameters()} == {torch.bfloat16}
    with critic.full_parameters() as module:
        assert [p.shape for p in module.parameters()] == shapes
    assert critic.engine.gradient_clipping() == 0.5
    assert {g["lr"] for g in critic.optimizer.param_groups} == {3e-4}
    (v,) = critic.train_values([[5, 6, 7]], [[8, 9]], 0)
    assert v.dtype == torch.float32  # values leave the head as float32 whatever the precision
    critic.backward(((v - 1.0) ** 2).mean(), boundary=True)
    assert critic.step() > 0


def _weights(engine) -> torch.Tensor:
    """The engine's whole parameters, flattened (gathered under ZeRO-3)."""
    with engine.full_parameters() as module:
        return torch.cat([p.detach().flatten().clone() for p in module.parameters()])


def _ppo_update_run(tiny: Path, micro: int) -> tuple[list[float], torch.Tensor, torch.Tensor]:
    """Three PPO phases on a synthetic batch with the critic: (losses, policy w, critic w)."""
    from synthetic_ppo import ppo_inputs

    from factor_cli.policy.model import load_policy
    from factor_cli.train.critic import CriticEngine
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
    model, rb, credit = ppo_inputs(cfg, policy)
    engine = Engine(policy.model, cfg)
    critic = CriticEngine(model, cfg)
    losses = []
    for i in range(3):
        gen = torch.Generator().manual_seed(i)
        stats = ppo_update(engine, rb, credit, cfg, 0, None, gen, critic)
        losses += [stats.loss, stats.critic_loss]
    return losses, _weights(engine), _weights(critic)


def test_micro_batching_never_changes_the_ppo_update(tiny_model_dir: Path) -> None:
    """The critic loss is normalised by the mini-batch's global count and the advantages are
    whitened over the whole mini-batch, so any micro-batch split gives the same update."""
    l3, w3, c3 = _ppo_update_run(tiny_model_dir, 3)
    l100, w100, c100 = _ppo_update_run(tiny_model_dir, 100)
    assert l3 == pytest.approx(l100, rel=1e-5, abs=1e-6)  # float32 sums in another order
    assert all(x > 0 for x in l3[1::2])  # the critic loss is there
    assert float((w3 - w100).abs().max()) < 1e-4
    assert float((c3 - c100).abs().max()) < 1e-4


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_critic_engine_step_equals_plain_adam(tiny_model_dir: Path, zero_stage: int) -> None:
    """Under the critic's DeepSpeed engine (ZeRO 0 and 3, three micro-batches per step), the
    PPO phase's critic update is the plain one: the whole mini-batch's value loss in one
    forward, its gradient clipped to ``critic.grad_clip`` (binding here), one torch Adam
    step at ``critic.lr``, three times. The policy's own lr and clip are set far off, so an
    engine built with them would not match."""
    import copy

    from synthetic_ppo import ppo_inputs

    from factor_cli.policy.model import load_policy
    from factor_cli.train.critic import CriticEngine, reply_values
    from factor_cli.train.engine import Engine
    from factor_cli.train.update import ppo_update

    cfg = load_config(
        "smoke",
        [
            "method=ppo",
            f"engine.zero_stage={zero_stage}",
            "optim.micro_batch_actions=3",
            "optim.minibatches=1",
            "optim.lr=1e-2",
            "optim.grad_clip=1e6",
            "critic.lr=1e-3",
            "critic.grad_clip=0.05",
        ],
    )
    policy = load_policy(str(tiny_model_dir))
    model, rb, credit = ppo_inputs(cfg, policy)
    plain = copy.deepcopy(model)
    opt = torch.optim.Adam(plain.parameters(), lr=cfg.critic.lr)
    engine = Engine(policy.model, cfg)
    critic = CriticEngine(model, cfg)
    unit = rb.batch.num_actions if cfg.reduction == "action-mean" else rb.batch.num_tokens
    for i in range(3):
        stats = ppo_update(
            engine, rb, credit, cfg, 0, None, torch.Generator().manual_seed(i), critic
        )
        values = reply_values(plain, rb.prompts, rb.replies, 0, with_grad=True)
        v = torch.cat([x[torch.tensor(m)] for x, m in zip(values, rb.action_masks)])
        loss = value_loss(
            v,
            credit.token_values,
            credit.returns,
            rb.batch.action_index,
            cfg.reduction,
            cfg.credit.ppo_value_clip,
            normalizer=unit,
        )
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.critic.grad_clip))
        opt.step()
        opt.zero_grad()
        assert norm > cfg.critic.grad_clip  # the clip binds
        assert stats.critic_loss == pytest.approx(float(loss), rel=1e-5)
    want = torch.cat([p.detach().flatten() for p in plain.parameters()])
    # Measured: the engine's weights within 1.2e-6 of the plain ones (float sums in another
    # order, through Adam); the critic built with clip 1.0 instead of 0.05 lands 1.5e-3 away.
    assert float((_weights(critic) - want).abs().max()) < 1e-5


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
            trainer.critic.module.head.weight, generator=torch.Generator().manual_seed(0)
        )
        saved = trainer.save(tmp_path / "run", None)
        want = {k: v.clone() for k, v in trainer.critic.module.state_dict().items()}
        moments = _adam_moments(trainer.critic)
    finally:
        trainer.close()
    fresh = Trainer(cfg)
    try:
        assert not torch.equal(fresh.critic.module.head.weight, want["head.weight"])
        assert _adam_moments(fresh.critic) == []
        fresh.load(saved)
        for k, v in fresh.critic.module.state_dict().items():
            torch.testing.assert_close(v, want[k])
        got = _adam_moments(fresh.critic)  # Adam's moments came back too
        assert len(got) == len(moments) > 0
        for a, b in zip(got, moments):
            torch.testing.assert_close(a, b)
    finally:
        fresh.close()


def _adam_moments(critic) -> list[torch.Tensor]:
    """The first moments of the critic engine's Adam (the smoke preset's ZeRO-1 wraps torch's
    Adam as ``optimizer.optimizer``, over flat fp32 partitions)."""
    state = critic.optimizer.optimizer.state
    return [s["exp_avg"].clone() for s in state.values()]
