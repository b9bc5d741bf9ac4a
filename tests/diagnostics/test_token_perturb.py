"""token-perturb's pieces on hand-made inputs: which tokens a quartile names, the perturbation,
and the table's AUC (exact numbers)."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch

from factor_cli.diagnostics.replay import McPlan
from factor_cli.diagnostics.td_sign import cache_name
from factor_cli.diagnostics.token_perturb import admissible_tokens, perturb, quartile_positions
from factor_cli.stats.diagnose import token_perturb


def test_quartiles_take_ceil_quarter_highest_and_lowest() -> None:
    rho = torch.tensor([0.1, 0.4, 0.2, 0.3, 0.0])  # L = 5: ceil(5/4) = 2 tokens
    assert quartile_positions(rho, "top") == [1, 3]
    assert quartile_positions(rho, "bottom") == [0, 4]
    assert quartile_positions(torch.tensor([0.5, 0.5]), "top") == [0]  # ties: by position


def test_perturb_replaces_only_the_named_positions_never_with_a_stop_or_itself() -> None:
    rng = random.Random(0)
    for _ in range(200):
        out = perturb([5, 6, 7, 8], [1, 3], 10, {0, 1}, rng)
        assert out[0] == 5 and out[2] == 7
        assert out[1] not in (6, 0, 1) and out[3] not in (8, 0, 1)


def test_admissible_replacements_come_from_the_admissible_actions_tokens() -> None:
    """--replace admissible: every replacement is a token of some admissible action (never a
    stop token nor the token it replaces); with one candidate left, that one; with none, the
    token stays."""
    rng = random.Random(0)
    pool = [3, 4, 9]
    seen = set()
    for _ in range(200):
        out = perturb([3, 6, 7], [0, 2], pool, {9}, rng)
        assert out[1] == 6 and out[0] == 4 and out[2] in (3, 4)
        seen.add(out[2])
    assert seen == {3, 4}  # uniform over the candidates: both drawn
    assert perturb([4], [0], [4, 9], {9}, rng) == [4]


class _Chars:
    """A character-level tokenizer: id = code point."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_admissible_tokens_are_the_actions_tokens_alone_and_after_a_space() -> None:
    ids = admissible_tokens(_Chars(), ["go n", "go s"])
    assert ids == sorted({ord(c) for c in "go ns"})


def test_the_replacement_mode_names_its_cache_and_vocab_keeps_the_old_name() -> None:
    assert cache_name("r", 5, McPlan(4, 16, 0)) == "r-step000005-n4-a16-s0-rows.csv"
    assert cache_name("r", 5, McPlan(4, 16, 0, replace="admissible")).endswith(
        "-s0-radmissible-rows.csv"
    )


def test_table_auc_and_means_by_hand() -> None:
    def row(traj: int, credit: float, quartile: str, delta: float, valid: bool = False) -> dict:
        return {"run_id": "r", "method": "factor", "env": "twx", "step": 5, "traj": traj,
                "turn": 0, "credit": credit, "quartile": quartile, "delta": delta,
                "valid": valid}  # fmt: skip

    rows = pd.DataFrame([
        row(0, 0.5, "top", -0.5), row(0, 0.5, "bottom", 0.0),   # top hurts more: 1
        row(1, 0.5, "top", 0.0), row(1, 0.5, "bottom", 0.0),    # tie: 1/2
        row(2, 0.5, "top", 0.2), row(2, 0.5, "bottom", -0.2, True),  # bottom hurts more: 0
        row(3, -0.5, "top", 0.1), row(3, -0.5, "bottom", 0.3),  # negative credit: 1
    ])  # fmt: skip
    table = token_perturb(rows).set_index("sign")
    pos = table.loc["positive"]
    assert pos["actions"] == 3 and pos["auc"] == pytest.approx(0.5)
    assert pos["delta_top"] == pytest.approx(-0.1) and pos["delta_bottom"] == pytest.approx(
        -0.2 / 3
    )
    assert pos["invalid"] == pytest.approx(5 / 6)
    assert table.loc["negative", "auc"] == 1.0
    # effect = mean(bottom - top) = (0.5 + 0 - 0.4) / 3; intervals from resampled trajectories
    assert pos["effect"] == pytest.approx(0.1 / 3)
    assert pos["effect_ci_low"] >= -0.4 - 1e-12 and pos["effect_ci_high"] <= 0.5 + 1e-12
    assert pos["auc_ci_low"] <= 0.5 <= pos["auc_ci_high"]
    assert table.loc["negative", "auc_ci_low"] == table.loc["negative", "auc_ci_high"] == 1.0


def test_an_unknown_replacement_mode_is_a_one_line_error_before_any_work(tmp_path) -> None:
    from typer.testing import CliRunner

    from factor_cli.cli.main import app

    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["diagnose", "token-perturb", "no-such-run", "--replace", "words", "--out", str(out)]
    )
    assert res.exit_code != 0 and "--replace 'words': expected vocab or admissible" in res.output
    assert not out.exists()
