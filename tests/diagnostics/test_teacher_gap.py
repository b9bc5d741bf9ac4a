"""The teacher-student gap (``factor model teacher-gap``): each action's gain against a slow
oracle that renders and scores one prompt at a time, the table's contrasts against loops, and
the command on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from factor_cli.envs import availability
from factor_cli.stats.diagnose import feedback_contrasts, teacher_gap
from factor_cli.train.config import load_config

twx_missing = availability("twx")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")


def _overrides(model: Path, constrained: bool) -> list[str]:
    return [f"model.path={model}", "model.init_tiny=null", "env.max_turns=4",
            "rollout.max_new_tokens=8",
            f"rollout.valid_action_decoding={str(constrained).lower()}"]  # fmt: skip


@needs_twx
@pytest.mark.parametrize("constrained", [True, False])
def test_each_gain_is_the_teacher_minus_the_student_scored_alone(
    tiny_model_dir: Path, constrained: bool
) -> None:
    from factor_cli.diagnostics.teacher_gap import GapPlan, teacher_gap_rows
    from factor_cli.policy.generation import score_replies, truncate_middle
    from factor_cli.policy.model import load_policy
    from factor_cli.policy.prompting import render
    from factor_cli.rollout.teacher import turn_views as views
    from factor_cli.train.prompts import prompt_format

    cfg = load_config("smoke", _overrides(tiny_model_dir, constrained))
    policy = load_policy(str(tiny_model_dir), "float32", "cpu")
    captured: list = []
    import factor_cli.diagnostics.teacher_gap as tg

    real = tg.gains
    tg.gains = lambda c, b, t, eps, s: (captured.append(eps), real(c, b, t, eps, s))[1]
    try:
        rows = teacher_gap_rows(cfg, policy, GapPlan(plays=2, seed=3))
    finally:
        tg.gains = real
    assert set(rows["source"]) == {"gold", "sampled"}
    fmt, tok = prompt_format(cfg), policy.tokenizer
    budget = cfg.rollout.max_context - cfg.rollout.max_new_tokens

    def alone(text: str, turn) -> float:  # one prompt, one reply, no batching, no cache
        ids, _ = truncate_middle(tok.encode(text, add_special_tokens=False), budget)
        allowed = [turn.allowed_ids] if turn.allowed_ids is not None else None
        sc = score_replies(policy.model, [ids], [turn.reply_ids], cfg.rollout.temperature,
                           tok.pad_token_id or 0, allowed=allowed)  # fmt: skip
        return float(sc.logprobs[0].sum())

    for source, episodes in zip(("gold", "sampled"), captured):
        mine = rows[rows["source"] == source].reset_index(drop=True)
        expect = []
        for ep in episodes:
            for view, turn in zip(views(ep), ep.turns):
                student = alone(render(fmt, view, tok), turn)
                true = alone(render(fmt, view, tok, feedback=turn.feedback), turn)
                empty = alone(render(fmt, view, tok, feedback=""), turn)
                expect.append((true - student, empty - student))
        assert len(mine) == len(expect) > 0
        np.testing.assert_allclose(mine[["true", "none"]].to_numpy(), np.array(expect), atol=2e-4)


def _rows(rng: np.random.Generator, plays: int = 12) -> pd.DataFrame:
    out = []
    for p in range(plays):
        for t in range(int(rng.integers(1, 5))):
            out.append({"source": "gold", "play": p, "turn": t, "tokens": 3,
                        "true": rng.normal(0.5, 1), "shuffled": rng.normal(0, 1),
                        "none": rng.normal(0.2, 1)})  # fmt: skip
    return pd.DataFrame(out)


def test_the_gap_table_is_the_mean_of_each_contrast_with_an_interval_over_plays() -> None:
    rows = _rows(np.random.default_rng(0))
    (r,) = teacher_gap(rows, seed=1).itertuples(index=False)
    assert r.actions == len(rows) and r.plays == 12
    assert r.gain_true == pytest.approx(sum(rows["true"]) / len(rows))
    assert r.true_minus_shuffled == pytest.approx(np.mean(rows["true"] - rows["shuffled"]))
    assert r.true_minus_none == pytest.approx(np.mean(rows["true"] - rows["none"]))
    assert r.ci_low < r.true_minus_shuffled < r.ci_high
    assert r.share_true_above == pytest.approx(np.mean(rows["true"] > rows["shuffled"]))
    constant = rows.assign(shuffled=rows["true"] - 0.25)
    (c,) = teacher_gap(constant).itertuples(index=False)
    assert c.ci_low == pytest.approx(0.25) and c.ci_high == pytest.approx(0.25)


def test_the_interval_resamples_whole_plays() -> None:
    # One play carries all the contrast: resampling plays must reach 0; resampling actions of
    # a 40-action play alone would not.
    rows = pd.DataFrame({"source": "gold", "play": [0] * 40 + list(range(1, 11)),
                         "turn": 0, "tokens": 2, "true": [1.0] * 40 + [0.0] * 10,
                         "shuffled": 0.0, "none": 0.0})  # fmt: skip
    (r,) = teacher_gap(rows, seed=0).itertuples(index=False)
    assert r.ci_low == 0.0


def test_feedback_contrasts_pair_each_action_with_itself() -> None:
    rng = np.random.default_rng(2)
    frames = []
    for cond, shift in (("true", 0.2), ("shuffled", 0.05), ("none", 0.0)):
        mass = 0.25 + shift + rng.normal(0, 0.01, 30)
        frames.append(pd.DataFrame({"method": "factor", "traj": np.repeat(np.arange(10), 3),
                                    "turn": np.tile(np.arange(3), 10), "length": 8,
                                    "condition": cond, "top_mass": mass}))  # fmt: skip
    rows = pd.concat(frames, ignore_index=True)
    table = feedback_contrasts(rows, seed=0).set_index("condition")
    wide = rows.pivot_table(index=["traj", "turn"], columns="condition", values="top_mass")
    drop = (wide["true"] - wide["shuffled"]).mean()
    assert table.loc["shuffled", "drop"] == pytest.approx(drop)
    above = (wide["true"] - 0.25).mean()  # uniform top mass of 8 tokens: 2 / 8
    assert table.loc["shuffled", "true_above_uniform"] == pytest.approx(above)
    assert table.loc["shuffled", "drop_share"] == pytest.approx(drop / above)
    assert table.loc["shuffled", "ci_low"] < drop < table.loc["shuffled", "ci_high"]


@needs_twx
def test_the_command_prints_the_gap_of_a_model_and_refuses_a_missing_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from factor_cli.cli.main import app

    sets = [a for o in _overrides(tiny_model_dir, True) for a in ("--set", o)]
    out = tmp_path / "rows.csv"
    res = CliRunner().invoke(app, ["model", "teacher-gap", "--checkpoint", str(tiny_model_dir),
                                   "--plays", "2", "--out", str(out), "--json", *sets])  # fmt: skip
    assert res.exit_code == 0, res.output
    table = json.loads(res.stdout.strip().splitlines()[-1])["table"]
    assert {r["source"] for r in table} == {"gold", "sampled"}
    assert len(pd.read_csv(out)) == sum(r["actions"] for r in table)
    res = CliRunner().invoke(app, ["model", "teacher-gap", "--checkpoint", str(tmp_path / "no")])
    assert res.exit_code == 1 and "no model there" in res.output
