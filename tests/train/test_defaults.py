"""Each default has one home: the implementing module's constant (or CreditConfig's field),
which the training config and the functions' keyword defaults both reference."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from factor_cli.credit import CreditConfig, allocation, gigpo_advantage, serl_weights
from factor_cli.credit.losses import (
    PPO_CLIP_EPS,
    clipped_surrogate,
    non_action_loss,
    objective,
    policy_loss,
)
from factor_cli.policy import value_defaults as vd
from factor_cli.policy import value_head
from factor_cli.rollout import continuations
from factor_cli.train import config


def default(fn, name: str):
    return inspect.signature(fn).parameters[name].default


@pytest.mark.parametrize("section", [config.ValueConfig, config.ContinuationConfig])
def test_config_sections_write_no_default_of_their_own(section: type) -> None:
    """Every field's default in the config's source is a reference to the module constant,
    never a literal (a literal is a second home that can drift)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(section)))
    fields = [n for n in tree.body[0].body if isinstance(n, ast.AnnAssign)]  # type: ignore[attr-defined]
    assert fields
    for node in fields:
        call = node.value
        assert isinstance(call, ast.Call) and isinstance(call.args[0], ast.Attribute), ast.unparse(
            node
        )


def test_value_head_defaults_have_one_home() -> None:
    cfg = config.ValueConfig()
    pairs = [
        (cfg.hidden, vd.VALUE_HIDDEN, default(value_head.ValueHead, "hidden_size")),
        (cfg.lr, vd.VALUE_LR, default(value_head.make_value_optimizer, "lr")),
        (cfg.tau, vd.VALUE_TAU, default(value_head.TargetValueHead, "tau")),
        (cfg.tau, vd.VALUE_TAU, default(value_head.polyak_update, "tau")),
        (
            cfg.replay_steps,
            vd.VALUE_REPLAY_STEPS,
            default(value_head.ValueReplayBuffer, "max_steps"),
        ),
        (cfg.epochs, vd.VALUE_EPOCHS, default(value_head.fit_value_head, "epochs")),
        (cfg.batch_size, vd.VALUE_BATCH_SIZE, default(value_head.fit_value_head, "batch_size")),
    ]
    for got_cfg, home, got_fn in pairs:
        assert got_cfg == home == got_fn
    # The paper's values (docs/design.md section 5.1).
    assert (vd.VALUE_HIDDEN, vd.VALUE_LR, vd.VALUE_TAU, vd.VALUE_REPLAY_STEPS) == (
        1024,
        1e-4,
        0.995,
        10,
    )


def test_continuation_defaults_have_one_home() -> None:
    cfg = config.ContinuationConfig()
    run = continuations.run_continuations
    assert cfg.budget == continuations.BUDGET == default(run, "budget") == 2
    assert cfg.per_checkpoint == continuations.PER_CHECKPOINT == default(run, "per_checkpoint") == 4
    assert cfg.horizon == continuations.HORIZON == default(run, "horizon") == 15
    assert cfg.temperature == continuations.TEMPERATURE == default(run, "temperature") == 1.0


def test_credit_function_defaults_are_credit_config() -> None:
    cfg = CreditConfig()
    assert (default(allocation, "tau"), default(allocation, "d")) == (cfg.tau, cfg.d)
    assert default(serl_weights, "clip") == cfg.psi_clip
    assert (
        default(gigpo_advantage, "gamma"),
        default(gigpo_advantage, "omega"),
        default(gigpo_advantage, "norm"),
    ) == (cfg.gigpo_gamma, cfg.gigpo_omega, cfg.gigpo_norm)
    for fn in (clipped_surrogate, policy_loss, non_action_loss, objective):
        assert default(fn, "clip_eps") == PPO_CLIP_EPS
    # optim.clip_eps is still written in the training config; it must agree with the credit core.
    assert config.OptimConfig().clip_eps == PPO_CLIP_EPS


def test_the_homes_import_without_torch() -> None:
    """The defaults' homes are torch-free, so the training config can read them and still
    load (and report config errors) without importing torch."""
    import subprocess
    import sys

    code = (
        "import sys, factor_cli.policy.value_defaults, factor_cli.rollout.continuations; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
