"""``sft.teacher_examples``: each gold step is also shown in the hindsight teacher's format, and
those prompts are the very prompts the teacher scores in training (rendered by the same code,
encoded and truncated by the same backend)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from factor_cli.envs import availability, make_env
from factor_cli.train.config import load_config

twx_missing = availability("twx")
pytestmark = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")


def _cfg(model: Path, tmp: Path, teacher: bool) -> object:
    return load_config("smoke", [
        f"model.path={model}", "model.init_tiny=null", "sft.games=3", "env.max_turns=12",
        f"sft.teacher_examples={str(teacher).lower()}", f"output_dir={tmp / 'runs'}",
    ])  # fmt: skip


def test_teacher_examples_are_the_prompts_the_teacher_scores(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from factor_cli.diagnostics.feedback_probe import replay_trajectories
    from factor_cli.policy.model import load_policy
    from factor_cli.rollout.teacher import teacher_prompt_texts
    from factor_cli.train.data import instances
    from factor_cli.train.generation import make_backend
    from factor_cli.train.prompts import prompt_format
    from factor_cli.train.sft import gold_examples

    cfg = _cfg(tiny_model_dir, tmp_path, teacher=True)
    policy = load_policy(str(tiny_model_dir), "float32", "cpu")
    fmt = prompt_format(cfg)
    examples = gold_examples(cfg, policy.tokenizer, fmt)
    plain = gold_examples(_cfg(tiny_model_dir, tmp_path, teacher=False), policy.tokenizer, fmt)
    assert examples[0::2] == plain  # the student's examples are unchanged, in order
    # The same draw of games as gold_examples, replayed through the rollout runner.
    rng = random.Random(cfg.seed)
    pool = instances(cfg, "train")
    chosen = [rng.choice(pool).instance_id for _ in range(cfg.sft.games)]
    with make_env("twx", **cfg.env.options) as env:
        plays = [(i, 0, env.gold_actions(i)) for i in chosen]
    backend = make_backend(cfg.rollout, policy)
    try:
        episodes = replay_trajectories(cfg, backend, plays)
        assert all(ep is not None for ep in episodes)
        teacher = [ids for ids, _ in backend.encode(teacher_prompt_texts(fmt, policy.tokenizer,
                                                                         episodes))]  # fmt: skip
    finally:
        backend.close()
    student = [tn.prompt_ids for ep in episodes for tn in ep.turns]
    replies = [tn.reply_ids for ep in episodes for tn in ep.turns]
    assert len(examples) == 2 * len(student) > 0
    assert [p for p, _ in examples[1::2]] == teacher
    assert [p for p, _ in examples[0::2]] == student
    assert [r for _, r in examples[1::2]] == replies


def test_the_option_changes_the_warm_start_folder_only_when_set(tmp_path: Path) -> None:
    from factor_cli.train.sft import sft_output_dir

    base = sft_output_dir(load_config("smoke", []))
    assert sft_output_dir(load_config("smoke", ["sft.teacher_examples=false"])) == base
    assert sft_output_dir(load_config("smoke", ["sft.teacher_examples=true"])) != base


def test_hindsight_walks_are_teacher_examples_of_admissible_random_plays(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from factor_cli.diagnostics.feedback_probe import replay_trajectories
    from factor_cli.policy.model import load_policy
    from factor_cli.rollout.teacher import teacher_prompt_texts
    from factor_cli.train.generation import make_backend
    from factor_cli.train.prompts import prompt_format
    from factor_cli.train.sft import hindsight_examples, random_walks

    cfg = load_config("smoke", [f"model.path={tiny_model_dir}", "model.init_tiny=null",
                                "sft.hindsight_walks=3", "env.max_turns=5"])  # fmt: skip
    policy = load_policy(str(tiny_model_dir), "float32", "cpu")
    fmt = prompt_format(cfg)
    examples = hindsight_examples(cfg, policy.tokenizer, fmt)
    assert examples == hindsight_examples(cfg, policy.tokenizer, fmt)  # seeded
    with make_env("twx", **cfg.env.options) as env:
        walks = random_walks(cfg, env)
    assert len(walks) == 3 and all(0 < len(a) <= 5 for _, a in walks)
    assert len({tuple(a) for _, a in walks}) > 1  # random, not one fixed plan
    backend = make_backend(cfg.rollout, policy)
    try:  # the walks replay (every action admissible) and the teacher renders the same prompts
        episodes = replay_trajectories(cfg, backend, [(i, 0, a) for i, a in walks])
        assert all(ep is not None for ep in episodes)
        texts = teacher_prompt_texts(fmt, policy.tokenizer, episodes)
        assert [p for p, _ in examples] == [ids for ids, _ in backend.encode(texts)]
    finally:
        backend.close()
    assert [r for _, r in examples] == [tn.reply_ids for ep in episodes for tn in ep.turns]
