"""Valid-action decoding through training: rollouts constrained to the admissible actions on
TWX coin, the update re-scoring them under the same allowed sets (ratio exactly 1 at the
behaviour weights), the hindsight teacher renormalised alike, and one training step.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from factor_cli.credit import assign_credit
from factor_cli.credit.serl import action_kl
from factor_cli.envs import availability
from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.generation.scoring import model_scorer
from factor_cli.policy.prompting import PromptFormat
from factor_cli.rollout.packing import pack_episodes
from factor_cli.rollout.runner import Episode, RolloutRunner, Start
from factor_cli.rollout.teacher import teacher_logprobs, teacher_prompt_texts
from factor_cli.train.config import load_config
from factor_cli.train.update import Layout, UpdateContext, gather

twx_missing = availability("twx")
pytestmark = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
FMT = PromptFormat(admissible=True)
TOL = 1e-5
TEMPERATURE = 0.8  # not 1, so a wrong temperature in the re-score would show


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    from factor_cli.policy.model import load_policy

    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="module")
def episodes(policy) -> list[Episode]:
    gen = HFGenerator(policy, max_new_tokens=24, max_context=1024)
    starts = [Start(f"coin/{i}", group=i // 2) for i in (7, 7, 8, 8)]
    with EnvPool("twx", 4) as pool:
        runner = RolloutRunner(pool, gen, FMT, max_turns=3, constrain=True)
        return runner.run(starts, temperature=TEMPERATURE, seed=0)


def test_constrained_rollouts_play_only_admissible_actions(episodes: list[Episode]) -> None:
    turns = [t for ep in episodes for t in ep.turns]
    assert len(turns) >= 4
    for t in turns:
        assert t.valid and t.tagged and t.action in t.admissible
        assert t.allowed_ids is not None and len(t.allowed_ids) == len(t.reply_ids)
        assert all(y in s for y, s in zip(t.reply_ids, t.allowed_ids))


def _context(policy, episodes: list[Episode], kl: bool, constrained: bool = True):
    rb = pack_episodes(episodes, "leave-one-out")
    assert rb.allowed_ids is not None and all(a is not None for a in rb.allowed_ids)
    if not constrained:
        rb.allowed_ids = None
    cfg = load_config("smoke", [f"rollout.temperature={TEMPERATURE}"])
    credit = assign_credit(rb.batch, "grpo", 1)
    teacher = None
    if kl:
        credit = SimpleNamespace(coef=credit.coef, a_seq=credit.a_seq, kl_coef=0.5)
        texts = teacher_prompt_texts(FMT, policy.tokenizer, episodes)
        teacher = [policy.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    engine = SimpleNamespace(
        wrapped_module=policy.model, module=policy.model, zero_stage=1, world_size=1
    )
    pad = policy.tokenizer.pad_token_id
    return rb, UpdateContext(engine, rb, credit, cfg, pad, teacher, Layout.of(rb))  # type: ignore[arg-type]


def test_update_ratio_is_one_at_the_behaviour_weights(policy, episodes: list[Episode]) -> None:
    """q = pi_theta / pi_old = 1 on every reply token (action and non-action) when the update
    re-scores under the rollout's allowed sets; free re-scoring (the old update) is not."""
    rb, ctx = _context(policy, episodes, kl=False)
    inputs = gather(ctx, range(rb.batch.num_actions))
    assert (inputs.action.logp - inputs.action.logp_old).abs().max() < TOL
    assert inputs.non_action is not None  # the tags: forced, log-prob 0 on both sides
    assert (inputs.non_action.logp - inputs.non_action.logp_old).abs().max() < TOL
    assert inputs.non_action.logp_old.abs().max() == 0.0
    rb_free, ctx_free = _context(policy, episodes, kl=False, constrained=False)
    free = gather(ctx_free, range(rb_free.batch.num_actions))
    assert (free.action.logp - free.action.logp_old).abs().max() > 1e-2


def test_the_kl_compares_the_constrained_distributions(policy, episodes: list[Episode]) -> None:
    """With the SERL KL, teacher and student logits are masked to the same sets: finite, and
    each token's distribution puts no mass outside its allowed set."""
    rb, ctx = _context(policy, episodes, kl=True)
    inputs = gather(ctx, range(rb.batch.num_actions))
    assert inputs.distill is not None
    kl = action_kl(inputs.distill.teacher_logits, inputs.distill.student_logits)
    assert torch.isfinite(kl) and kl >= 0
    sets = [
        s
        for a in range(rb.batch.num_actions)
        for s, m in zip(rb.allowed_ids[a], rb.action_masks[a])
        if m
    ]
    for z in (inputs.distill.teacher_logits, inputs.distill.student_logits):
        p = torch.softmax(z.detach(), -1)
        inside = torch.stack([p[j, s].sum() for j, s in enumerate(sets)])
        assert (inside - 1).abs().max() < 1e-6


def test_teacher_is_renormalised_over_the_same_sets(policy, episodes: list[Episode]) -> None:
    """The hindsight teacher scores the realised tokens under the constraint: an oracle forward
    of each teacher prompt alone, renormalised over Turn.allowed_ids by an explicit logsumexp;
    forced tokens have log pi_T = log pi_old = 0, so Delta = 0 there."""

    def encode(texts):
        return [(policy.tokenizer.encode(t, add_special_tokens=False), False) for t in texts]

    score = model_scorer(policy.model, int(policy.tokenizer.pad_token_id or 0))
    got = teacher_logprobs(score, policy.tokenizer, FMT, episodes, encode, TEMPERATURE)
    texts = teacher_prompt_texts(FMT, policy.tokenizer, episodes)
    turns = [t for ep in episodes for t in ep.turns]
    for lp, text, turn in zip(got, texts, turns):
        prompt = policy.tokenizer.encode(text, add_special_tokens=False)
        with torch.no_grad():
            z = policy.model(input_ids=torch.tensor([prompt + turn.reply_ids])).logits[0].float()
        z = z[len(prompt) - 1 : len(prompt) - 1 + len(turn.reply_ids)] / TEMPERATURE
        want = [
            float(z[j, y] - torch.logsumexp(z[j, s], 0))
            for j, (y, s) in enumerate(zip(turn.reply_ids, turn.allowed_ids))
        ]
        assert max(abs(a - b) for a, b in zip(lp, want)) < TOL
        for a, s, old in zip(lp, turn.allowed_ids, turn.logprobs):
            if len(s) == 1:
                assert a == 0.0 and old == 0.0


def test_one_training_step_with_valid_action_decoding(tiny_model_dir: Path, tmp_path: Path) -> None:
    """rollout.valid_action_decoding=true: every action of the step is valid."""
    from test_train import tiny_overrides

    from factor_cli.train.trainer import Trainer

    overrides = tiny_overrides(tiny_model_dir, tmp_path, "serl-repro", steps=1)
    cfg = load_config(
        "smoke", [*overrides, "rollout.valid_action_decoding=true", "rollout.max_new_tokens=24"]
    )
    trainer = Trainer(cfg)
    try:
        m = trainer.train_step().metrics
    finally:
        trainer.close()
    assert m["invalid_rate"] == 0.0
    assert m["kl"] == m["kl"] and abs(m["loss"]) < 1e6
