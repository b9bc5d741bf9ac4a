"""The hf prefix-cache contract of the training step (``train.step.ScoringSession``): the
teacher and value features score through the rollout's session, which continuations played
after the rollout and the refresh close; scoring after that fails instead of silently
recomputing every prompt."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train import needs_twx, tiny_overrides

from factor_cli.train.config import load_config
from factor_cli.train.step import ScoringSession


def test_a_closed_session_refuses_to_score_and_says_why() -> None:
    def scorer(*a: object, **k: object) -> None:
        return None

    cached = ScoringSession(scorer, cached=True)
    assert cached.scorer is scorer
    cached.close("the refresh after the update")
    with pytest.raises(RuntimeError, match="closed by the refresh after the update"):
        _ = cached.scorer
    plain = ScoringSession(scorer, cached=False)  # the model's own forward: nothing to lose
    plain.close("the refresh after the update")
    assert plain.scorer is scorer


@needs_twx
def test_scoring_after_late_continuations_fails(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Without overlap the continuations play after the rollout and evict its prompts: the
    teacher must run first, and running it after them raises."""
    from factor_cli.train.trainer import Trainer

    overrides = [*tiny_overrides(tiny_model_dir, tmp_path), "continuations.overlap=false",
                 "rollout.prefix_reuse=true", "rollout.backend=hf"]  # fmt: skip
    trainer = Trainer(load_config("smoke", overrides), str(tiny_model_dir))
    try:
        rollout = trainer.phase_rollout(1)
        assert rollout.session.cached
        trainer.phase_continuations(rollout)
        with pytest.raises(RuntimeError, match="closed by the continuations"):
            trainer.phase_teacher(rollout)
    finally:
        trainer.close()
