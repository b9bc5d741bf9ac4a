"""Every registered method end to end through assign_credit; registries; schedules; batch checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from oracles import as_packed, random_batch

from factor_cli.credit import (
    ESTIMATORS,
    METHODS,
    CreditConfig,
    PackedBatch,
    Registry,
    alpha_schedule,
    assign_credit,
    coefficient_deviation,
    conservation_drift,
    eta_schedule,
    length_bias_table,
    policy_loss,
    sign_agreement,
)

PAPER_METHODS = [
    "factor",
    "grpo",
    "serl-repro",
    "serl-uniform",
    "serl-extended",
    "serl-actionnorm",
    "wo-tac",
    "wo-hta",
    "batch-global-norm",
    "token-shuffled",
    "credit-shuffled",
    "tac-serl-psi",
    "gigpo",
    "hgpo",
    "ppo",
    "td-3",
    "td-5",
    "gae-0.9",
    "gae-0.95",
    "mc",
    "vineppo",
    "factor-mc",
]


def packed(seed: int = 0, convention: str = "leave-one-out") -> PackedBatch:
    b = random_batch(seed)
    # token_values: the PPO critic's V before each token.
    return dataclasses.replace(as_packed(b, convention), token_values=b.gap / 3)


def test_registry_holds_exactly_the_paper_methods() -> None:
    assert sorted(METHODS.names()) == sorted(PAPER_METHODS)


@pytest.mark.parametrize("method", PAPER_METHODS)
@pytest.mark.parametrize("step", [1, 11, 30, 60])
def test_every_method_gives_finite_coefficients_and_loss(method: str, step: int) -> None:
    batch = packed(step)
    out = assign_credit(batch, method, step, generator=torch.Generator().manual_seed(step))
    assert out.coef.shape == batch.logp_old.shape
    assert torch.isfinite(out.coef).all() and torch.isfinite(out.credit).all()
    loss = policy_loss(batch.logp_old, batch.logp_old, out.coef, batch.action_index, out.reduction)
    assert torch.isfinite(loss)


CONSERVING = [
    "factor",
    "wo-tac",
    "wo-hta",
    "batch-global-norm",
    "token-shuffled",
    "credit-shuffled",
    "tac-serl-psi",
    "vineppo",
    "factor-mc",
]


@pytest.mark.parametrize("method", CONSERVING)
@pytest.mark.parametrize("convention", ["leave-one-out", "group-standardize", "raw"])
def test_property_conservation_per_method(method: str, convention: str) -> None:
    """Property 1 for TAC (on the value head's or Monte-Carlo values), uniform credit and
    CreditShuffled, after warm-up and during it."""
    batch = packed(3, convention)
    for step in (5, 20):
        out = assign_credit(batch, method, step, generator=torch.Generator().manual_seed(0))
        drift = conservation_drift(out.credit, batch.traj_index, out.a_seq)
        assert float(drift.abs().max()) < 1e-9


def test_apm_methods_preserve_action_mean_and_serl_does_not() -> None:
    batch = packed(4)
    factor = assign_credit(batch, "factor", 20)
    serl = assign_credit(batch, "serl-repro", 20)
    n = batch.num_actions
    assert float(coefficient_deviation(factor.weight, batch.action_index, n).max()) < 1e-9
    assert float(coefficient_deviation(serl.weight, batch.action_index, n).max()) > 1e-3


def test_grpo_broadcasts_a_seq() -> None:
    batch = packed(2)
    out = assign_credit(batch, "grpo", 20)
    torch.testing.assert_close(out.coef, out.a_seq[batch.traj_index][batch.action_index])
    assert out.kl_coef == 0.0


def test_warmup_uses_uniform_credit_and_no_teacher() -> None:
    cfg = CreditConfig()
    batch = packed(5)
    warm = assign_credit(batch, "factor", cfg.warmup_steps, cfg)
    assert warm.warmup and warm.strength == 0.0
    t = batch.num_actions_per_traj.double()
    torch.testing.assert_close(warm.credit, (warm.a_seq / t)[batch.traj_index])
    torch.testing.assert_close(warm.weight, torch.ones_like(warm.weight))
    # The first post-warm-up step uses TD credit and eta_{W+1} > 0.
    after = assign_credit(batch, "factor", cfg.warmup_steps + 1, cfg)
    assert not after.warmup and after.strength == pytest.approx(0.7 * (1 - 11 / 50))


def test_value_methods_need_values_after_warmup() -> None:
    batch = dataclasses.replace(packed(0), values=None)
    assign_credit(batch, "factor", 3)  # warm-up: no value head needed
    assign_credit(batch, "grpo", 30)
    with pytest.raises(ValueError, match="values is missing: method 'factor'"):
        assign_credit(batch, "factor", 30)


def test_reduction_forced_or_from_protocol() -> None:
    batch = packed(1)
    assert assign_credit(batch, "factor", 20, reduction="token-mean").reduction == "token-mean"
    assert (
        assign_credit(batch, "tac-serl-psi", 20, reduction="action-mean").reduction == "token-mean"
    )
    assert (
        assign_credit(batch, "serl-actionnorm", 20, reduction="token-mean").reduction
        == "action-mean"
    )
    assert METHODS.get("serl-extended").steps_scale == 1.25


def test_serl_extended_trains_the_compute_matched_steps_of_any_base() -> None:
    """188 steps of the paper's 150 (Table 4), and the same 1.25x of a smaller base."""
    from factor_cli.train.config import load_config

    assert load_config("paper", ["method=serl-extended"]).total_steps == 188
    assert load_config("paper", ["method=serl-repro"]).total_steps == 150
    assert load_config("smoke", ["method=serl-extended", "steps=4"]).total_steps == 5
    assert load_config("smoke", ["method=serl-extended", "steps=8"]).total_steps == 10


def test_serl_uniform_keeps_kl_without_modulation() -> None:
    out = assign_credit(packed(1), "serl-uniform", 20)
    assert out.kl_coef == pytest.approx(0.5 * (1 - 20 / 50))
    torch.testing.assert_close(out.weight, torch.ones_like(out.weight))


def test_shuffled_methods_are_seeded() -> None:
    batch = packed(6)
    for method in ("credit-shuffled", "token-shuffled"):
        a = assign_credit(batch, method, 20, generator=torch.Generator().manual_seed(1))
        b = assign_credit(batch, method, 20, generator=torch.Generator().manual_seed(1))
        c = assign_credit(batch, method, 20, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(a.coef, b.coef)
        assert not torch.allclose(a.coef, c.coef)


def test_schedules() -> None:
    cfg = CreditConfig()
    assert [eta_schedule(k, cfg) for k in (1, 10)] == [0.0, 0.0]
    assert eta_schedule(11, cfg) == pytest.approx(0.7 * 39 / 50)
    assert (
        eta_schedule(49, cfg) > 0 and eta_schedule(50, cfg) == 0.0 and eta_schedule(150, cfg) == 0.0
    )
    assert alpha_schedule(1, cfg) == pytest.approx(0.5 * 49 / 50)
    assert alpha_schedule(50, cfg) == 0.0
    with pytest.raises(ValueError, match="1-based"):
        eta_schedule(0, cfg)


def test_serl_kl_weight_is_alpha_k_unless_kl_0_reproduces_the_authors_code() -> None:
    """lambda_k = alpha_k = 0.5 max(1 - k/50, 0) by default (the paper's text); credit.kl_0 = 1
    gives the authors' public code's max(1 - k/50, 0) without touching the mixing alpha_k."""
    from factor_cli.credit.schedules import kl_schedule

    ours, theirs = CreditConfig(), CreditConfig(kl_0=1.0)
    for k in (1, 10, 25, 49, 50, 150):
        assert kl_schedule(k, ours) == alpha_schedule(k, ours) == 0.5 * max(1 - k / 50, 0)
        assert kl_schedule(k, theirs) == pytest.approx(max(1 - k / 50, 0))
        assert alpha_schedule(k, theirs) == alpha_schedule(k, ours)
    batch = packed(seed=3)
    for spec_name in ("serl-repro", "factor"):
        a = assign_credit(batch, spec_name, 20, cfg=theirs)
        assert a.kl_coef == pytest.approx(1 - 20 / 50)
        assert assign_credit(batch, spec_name, 20).kl_coef == pytest.approx(0.5 * (1 - 20 / 50))
    assert assign_credit(batch, "grpo", 20, cfg=theirs).kl_coef == 0.0  # no KL term
    with pytest.raises(ValueError, match=r"credit\.kl_0 = -1\.0 is invalid"):
        CreditConfig(kl_0=-1.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tau", 0.0),
        ("eta_0", 1.5),
        ("d", -1.0),
        ("warmup_steps", -1),
        ("psi_clip", 1.0),
        ("gigpo_norm", "x"),
    ],
)
def test_config_validation_names_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"credit.{field} = "):
        CreditConfig(**{field: value})


def test_config_fields_are_documented() -> None:
    docs = CreditConfig.field_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(CreditConfig)}
    assert all(docs.values())


def test_registry_refuses_duplicates_and_lists_names() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.add("a", 2)
    with pytest.raises(ValueError, match="unknown thing 'b'; valid: a"):
        reg.get("b")
    with pytest.raises(ValueError, match="unknown method 'factr'; valid: grpo, serl-repro"):
        METHODS.get("factr")


def test_estimator_flags() -> None:
    assert ESTIMATORS.get("td").conserves and ESTIMATORS.get("td").uses_values
    assert not ESTIMATORS.get("gae-0.9").conserves
    assert not ESTIMATORS.get("mc").uses_values


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"traj_index": torch.tensor([0, 1, 0])}, "traj_index is not contiguous"),
        ({"action_index": torch.tensor([0, 1, 0, 2])}, "action_index is not contiguous"),
        ({"action_index": torch.tensor([1, 1, 0, 2])}, "action_index must be non-decreasing"),
        ({"logp_old": torch.zeros(3)}, "logp_old has length 3"),
        ({"outcome": torch.tensor([1.0, float("nan")])}, "outcome contains NaN"),
        ({"convention": "webshop"}, "unknown outcome convention 'webshop'"),
        ({"values": torch.zeros(2)}, "values has length 2"),
    ],
)
def test_packed_batch_validation(change: dict, message: str) -> None:
    base = {
        "action_index": torch.tensor([0, 0, 1, 2]),
        "logp_old": torch.zeros(4),
        "traj_index": torch.tensor([0, 0, 1]),
        "group_index": torch.tensor([0, 0]),
        "outcome": torch.tensor([1.0, 0.0]),
        "values": torch.zeros(3),
    }
    base.update(change)
    with pytest.raises(ValueError, match=message):
        PackedBatch(**base).validate()


def test_length_bias_table_and_sign_agreement() -> None:
    weight = torch.tensor([1.0, 1.0, 2.0, 3.0])
    lengths = torch.tensor([3, 6, 7, 20])
    rows = length_bias_table(weight, lengths)
    assert [r[1] for r in rows] == [2, 1, 0, 1]
    assert rows[0][2] == 1.0 and rows[1][2] == 2.0 and rows[3][2] == 3.0
    assert rows[2][2] != rows[2][2]  # NaN for the empty bin
    assert sign_agreement(
        torch.tensor([1.0, -1.0, 0.0, 2.0]), torch.tensor([1.0, 1.0, 1.0, 3.0])
    ) == pytest.approx(2 / 3)
