"""The PPO update: the loss that trains is ``credit.objective``; the mini-batch order has a
random stream of its own (the same for every method); the step's statistics add up."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from oracles import random_batch
from synthetic import synthetic_batch

from factor_cli.credit import (
    METHODS,
    ActionTokens,
    DistillTokens,
    NonActionTokens,
    PackedBatch,
    assign_credit,
    objective,
)
from factor_cli.rollout.packing import RolloutBatch
from factor_cli.train.config import load_config
from factor_cli.train.streams import STREAMS, stream_generator, stream_seed
from factor_cli.train.update import UpdateStats


def _whole_batch_objective(model: torch.nn.Module, rb: RolloutBatch, credit, cfg, teacher):
    """credit.objective over the whole packed batch, from one forward of every reply."""
    from factor_cli.policy.generation import score_replies

    temp = cfg.rollout.temperature
    with torch.no_grad():
        sc = score_replies(model, rb.prompts, rb.replies, temp, 0, return_logits=True)
        tsc = score_replies(model, teacher, rb.replies, temp, 0, return_logits=True)
    masks = [torch.tensor(m) for m in rb.action_masks]
    logp = torch.cat([lp[m] for lp, m in zip(sc.logprobs, masks)])
    b = rb.batch
    return objective(
        ActionTokens(logp, b.logp_old.to(logp), credit.coef.to(logp), b.action_index),
        credit.reduction,
        cfg.optim.clip_eps,
        NonActionTokens(
            torch.cat([lp[~m] for lp, m in zip(sc.logprobs, masks)]),
            rb.na_logp_old.to(logp),
            rb.na_traj_index,
            credit.a_seq.to(logp),
        ),
        DistillTokens(
            torch.cat([z[m] for z, m in zip(tsc.logits, masks)]),
            torch.cat([z[m] for z, m in zip(sc.logits, masks)]),
        ),
        credit.kl_coef,
    )


@pytest.mark.parametrize("reduction", ["action-mean", "token-mean"])
def test_trainer_loss_is_credit_objective(tiny_model_dir: Path, reduction: str) -> None:
    """ppo_update's loss, split into micro-batches of 3 actions, is credit.objective on the
    same packed batch, term by term (policy, non-action branch, SERL KL)."""
    from factor_cli.policy.model import load_policy
    from factor_cli.train.engine import Engine
    from factor_cli.train.update import ppo_update

    cfg = load_config("smoke", ["optim.micro_batch_actions=3", "optim.minibatches=1"])
    policy = load_policy(str(tiny_model_dir))
    rb = synthetic_batch(policy.model)
    # Raw outcomes: A^seq = G does not sum to zero over the batch as leave-one-out's does, so
    # no term vanishes by symmetry at this first, uniformly off-policy step.
    rb = dataclasses.replace(rb, batch=dataclasses.replace(rb.batch, convention="raw"))
    credit = assign_credit(rb.batch, "serl-uniform", 20, reduction=reduction)
    assert credit.kl_coef > 0 and credit.reduction == reduction
    teacher = [[*p, 7, 8, 9] for p in rb.prompts]  # the context with Phi_t
    want = _whole_batch_objective(policy.model, rb, credit, cfg, teacher)
    engine = Engine(policy.model, cfg)
    got = ppo_update(engine, rb, credit, cfg, 0, teacher, torch.Generator().manual_seed(0))
    assert float(want.non_action) != 0.0 and float(want.kl) > 0.0
    for stat, term in (
        ("loss", "total"),
        ("action_loss", "action"),
        ("non_action_loss", "non_action"),
        ("kl", "kl"),
    ):
        # abs: the KL (~6e-4) is a sum of O(1) terms that cancel, so float rounding of the
        # logits (the update's shared-prefix forward vs this padded one) shows at ~1e-7.
        want_t = float(getattr(want, term))
        assert getattr(got, stat) == pytest.approx(want_t, rel=1e-5, abs=1e-6), stat


@pytest.mark.parametrize("minibatches", [1, 2])
def test_the_teacher_scorer_serves_only_the_rollout_weights(
    tiny_model_dir: Path, minibatches: int
) -> None:
    """The KL teacher's logits come from the backend's scorer (the rollout's weights) for the
    first mini-batch only: after an optimiser step they would be stale. A scorer frozen at the
    rollout's weights gives the update the losses of scoring the live module."""
    import copy

    from factor_cli.policy.generation.scoring import model_scorer
    from factor_cli.policy.model import load_policy
    from factor_cli.train.engine import Engine
    from factor_cli.train.update import ppo_update

    overrides = ["optim.micro_batch_actions=3", f"optim.minibatches={minibatches}"]
    cfg = load_config("smoke", overrides)
    policy = load_policy(str(tiny_model_dir))
    rb = synthetic_batch(policy.model)
    credit = assign_credit(rb.batch, "serl-uniform", 20)
    teacher = [[*p, 7, 8, 9] for p in rb.prompts]
    frozen = model_scorer(copy.deepcopy(policy.model).eval(), 0, share_prefixes=True)
    calls: list[int] = []

    def scorer(prompts, *args, **kwargs):
        calls.append(len(prompts))
        return frozen(prompts, *args, **kwargs)

    runs = []
    for given_scorer in (None, scorer):
        engine = Engine(copy.deepcopy(policy.model), cfg)
        gen = torch.Generator().manual_seed(0)
        runs.append(ppo_update(engine, rb, credit, cfg, 0, teacher, gen, None, given_scorer))
    n_act = rb.batch.num_actions
    assert sum(calls) == -(-n_act // minibatches)  # the first mini-batch's actions
    off, on = runs
    for stat in ("loss", "action_loss", "non_action_loss", "kl"):
        assert getattr(on, stat) == pytest.approx(getattr(off, stat), rel=1e-5, abs=1e-6), stat


def _rollout_batch(seed: int) -> RolloutBatch:
    """A random packed batch (teacher, values, states: every method runs) as a RolloutBatch
    whose replies are all action tokens."""
    b = random_batch(seed)
    batch = PackedBatch(
        action_index=b.action_index,
        logp_old=b.logp_old,
        traj_index=b.traj_index,
        group_index=b.group_index,
        outcome=b.outcome,
        logp_teacher=b.logp_old + b.gap,
        values=b.values,
        state_key=b.state_key,
    ).validate()
    n_act = batch.num_actions
    return RolloutBatch(
        batch,
        [[1]] * n_act,
        [[2] * length for length in b.lengths_L],
        [[True] * length for length in b.lengths_L],
        torch.zeros(0),
        torch.zeros(0, dtype=torch.long),
        [""] * n_act,
        [(int(t), 0) for t in b.traj_index],
    )


def test_minibatch_order_is_the_same_for_every_method(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's credit phase (shuffled ablations draw there) and update phase use separate
    streams: the mini-batches of step k hold the same actions in the same order whatever the
    method, so ablations differ only by their credit."""
    from factor_cli.train import update
    from factor_cli.train.trainer import Trainer

    fed: list[list[int]] = []

    def record(ctx: update.UpdateContext, actions: list[int]) -> UpdateStats:
        fed.append(list(actions))
        return UpdateStats()

    monkeypatch.setattr(update, "minibatch_step", record)
    rb = _rollout_batch(3)
    # PPO's critic values, which the trainer's critic phase would add.
    rb.batch = dataclasses.replace(rb.batch, token_values=torch.zeros(rb.batch.num_tokens))
    base = load_config("smoke", ["optim.minibatches=3", "optim.ppo_epochs=2", "seed=7"])
    orders = {}
    for method in METHODS.names():
        trainer = SimpleNamespace(
            cfg=base.model_copy(update={"method": method}),
            engine=SimpleNamespace(step=lambda: 0.0),
            pad_id=0,
            policy=SimpleNamespace(model=torch.nn.Linear(1, 1)),
            critic=None,  # the update's order must not depend on whether a critic trains
            _rollout_scorer=lambda: None,
        )
        credit = Trainer.phase_credit(trainer, 20, rb)  # type: ignore[arg-type]
        fed.clear()
        Trainer.phase_update(trainer, 20, rb, credit, None)  # type: ignore[arg-type]
        orders[method] = [list(mb) for mb in fed]
    first = orders["factor"]
    epoch = [a for mb in first[:3] for a in mb]
    assert len(first) == 6 and sorted(epoch) == list(range(rb.batch.num_actions))
    assert first != [sorted(mb) for mb in first]  # a real permutation, not the identity
    for method, order in orders.items():
        assert order == first, method


def test_streams_are_seeded_separate_and_step_dependent() -> None:
    draws = {s: stream_generator(7, 3, s).initial_seed() for s in STREAMS}
    assert len(set(draws.values())) == len(draws)  # one seed per stream
    assert stream_seed(7, 3, "minibatch") != stream_seed(7, 4, "minibatch")
    assert stream_seed(7, 3, "minibatch") != stream_seed(8, 3, "minibatch")
    a = torch.randperm(50, generator=stream_generator(7, 3, "minibatch"))
    b = torch.randperm(50, generator=stream_generator(7, 3, "minibatch"))
    assert torch.equal(a, b)
    # The seeds the trainer always used for its older streams are kept (resumable runs agree).
    assert stream_seed(42, 5, "credit") == 42 * 40_009 + 5
    assert stream_seed(42, 5, "rollout") == 42 * 10_007 + 5
    with pytest.raises(ValueError, match="unknown random stream 'minibatches'; valid: rollout"):
        stream_seed(1, 1, "minibatches")


def test_update_stats_add_and_mean() -> None:
    a = UpdateStats(loss=1.0, kl=0.5, grad_norm=2.0, clip_fraction=0.25)
    total = UpdateStats().add(a).add(UpdateStats(loss=3.0, approx_kl=0.1))
    assert total == UpdateStats(loss=4.0, kl=0.5, grad_norm=2.0, clip_fraction=0.25, approx_kl=0.1)
    assert total.mean(2) == UpdateStats(
        loss=2.0, kl=0.25, grad_norm=1.0, clip_fraction=0.125, approx_kl=0.05
    )
    assert UpdateStats(loss=1.0).mean(0) == UpdateStats(loss=1.0)  # no update: unchanged


def test_shared_prefix_forwards_are_off_under_zero3_across_ranks() -> None:
    """ZeRO-3 makes every forward a collective all ranks join; ranks holding different actions
    would build radix trees of different sizes (a hang), so the padded forward is used."""
    from factor_cli.train.update import UpdateContext

    def shares(stage: int, world: int, on: bool = True) -> bool:
        cfg = load_config("smoke", [f"optim.share_prefixes={str(on).lower()}"])
        engine = SimpleNamespace(zero_stage=stage, world_size=world)
        return UpdateContext(engine, None, None, cfg, 0, None, None).share_prefixes  # type: ignore[arg-type]

    assert shares(3, 1) and shares(1, 2) and shares(2, 4)
    assert not shares(3, 2) and not shares(1, 1, on=False)
