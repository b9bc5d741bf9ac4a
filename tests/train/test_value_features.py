"""``value.features``: what the value head reads of x_t. The paper's boundary state is the
default; ``prompt_mean`` (every layer averaged over the prompt) widens the head's input to
(L + 1) x H, and a step fits and reads the head on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_train import needs_twx, tiny_overrides

from factor_cli.train.config import ConfigError, load_config

PLAYABLE = [
    "env.options.params.coin=numLocations=3,numDistractorItems=0,includeDoors=0",
    "rollout.valid_action_decoding=true",
    "rollout.groups=2",
    "rollout.k=2",
]


def test_the_default_is_the_papers_boundary_state() -> None:
    assert load_config("smoke", []).value.features == "boundary"
    assert load_config("paper", []).value.features == "boundary"


def test_an_unknown_feature_kind_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"value\.features"):
        load_config("smoke", ["value.features=pooled"])


@needs_twx
@pytest.mark.parametrize("head", ["mlp", "ridge"])
def test_a_step_on_prompt_mean_features(tiny_model_dir: Path, tmp_path: Path, head: str) -> None:
    from factor_cli.rollout.values import prompt_mean_features
    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", [*tiny_overrides(tiny_model_dir, tmp_path, "factor", 1),
                                *PLAYABLE, "value.features=prompt_mean",
                                f"value.head={head}"])  # fmt: skip
    trainer = Trainer(cfg, str(tiny_model_dir))
    try:
        mc = trainer.policy.model.config
        width = (mc.num_hidden_layers + 1) * mc.hidden_size
        rollout = trainer.phase_rollout(1)
        feats = trainer.phase_features(rollout)
        prompts = [t.prompt_ids for e in rollout.roots for t in e.turns]
        assert feats is not None and feats.shape == (len(prompts), width)
        torch.testing.assert_close(
            feats, prompt_mean_features(trainer.policy.model, prompts, trainer.pad_id)
        )
        trainer.phase_refresh(rollout)
        result = trainer.train_step()
        assert trainer.buffer.feature_size == width and len(trainer.buffer) > 0
        assert result.metrics["value_mse"] >= 0
    finally:
        trainer.close()


def test_a_ridge_head_too_wide_for_the_model_is_refused_before_the_ledger(tmp_path: Path) -> None:
    """A ridge solve holds an H x H matrix: prompt_mean on a 7B-wide config is refused with a
    one-line error naming the fields, before any ledger run opens (nothing under tracking)."""
    from transformers import LlamaConfig

    from factor_cli.train.trainer import check_value_head, value_feature_width

    wide = tmp_path / "wide"
    LlamaConfig(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28).save_pretrained(
        wide
    )
    cfg = load_config("smoke", ["value.features=prompt_mean", "value.head=ridge"])
    assert value_feature_width(cfg, LlamaConfig.from_pretrained(wide)) == 29 * 3584
    with pytest.raises(ConfigError, match=r"value\.head=ridge: .* set value\.head=mlp") as info:
        check_value_head(cfg, str(wide))
    assert "\n" not in str(info.value)
    check_value_head(load_config("smoke", ["value.head=ridge"]), str(wide))  # boundary: 3,584
    check_value_head(load_config("smoke", ["value.features=prompt_mean"]), str(wide))  # mlp
    grpo = load_config("smoke", ["method=grpo", "value.features=prompt_mean", "value.head=ridge"])
    check_value_head(grpo, str(wide))  # no value head to build


def test_the_config_offers_exactly_the_registered_feature_kinds() -> None:
    import typing

    from factor_cli.rollout.values import VALUE_FEATURES
    from factor_cli.train.config import ValueConfig

    allowed = typing.get_args(ValueConfig.model_fields["features"].annotation)
    assert sorted(allowed) == sorted(VALUE_FEATURES.names())
