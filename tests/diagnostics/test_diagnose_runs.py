"""`factor diagnose` on real tiny runs: FACTOR and SERL-Repro train 2 steps each with the teacher
active, write their per-action records, and every built diagnostic reads them back from the
ledger (one run, and the study), prints a table and writes its CSV and PNG; bad input is one
line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_train import needs_twx, tiny_overrides
from typer.testing import CliRunner

from factor_cli.cli.main import app
from factor_cli.train.config import load_config

pytestmark = needs_twx
runner = CliRunner()
KINDS = ("coef-deviation", "groups", "length-bias", "horizon", "position", "compare")


@pytest.fixture(scope="module")
def study(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from factor_cli.train.run import train

    tmp = tmp_path_factory.mktemp("diagnose")
    ids = {}
    for method in ("factor", "serl-repro", "grpo"):
        overrides = [
            *tiny_overrides(tiny_model_dir, tmp, method, steps=2),
            "study=diag",
            "credit.warmup_steps=0",
            # Three rooms, constrained replies, 8 episodes a step: the untrained model wins some
            # and loses some, so groups carry signal and SERL's multiplier moves.
            "env.options.params.coin=numLocations=3,numDistractorItems=0,includeDoors=0",
            "rollout.valid_action_decoding=true",
            "rollout.groups=2",
            "rollout.k=4",
            "eval.start=false",
            *(["transcripts.records=false"] if method == "grpo" else []),
            *(["checkpoint_keep_every=1"] if method == "factor" else []),
        ]
        ids[method] = train(load_config("smoke", overrides), lambda *a: None, print).run_id
    return {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "out": str(tmp / "out"), **ids}


def diagnose(study: dict[str, str], *args: str):
    return runner.invoke(
        app, ["diagnose", *args, "--tracking-uri", study["uri"], "--out", study["out"]],
        env={"COLUMNS": "200"},
    )  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_on_one_run_and_on_two(study: dict[str, str], kind: str) -> None:
    for targets in ([study["factor"][:10]], [study["factor"], study["serl-repro"]]):
        res = diagnose(study, kind, *targets)
        assert res.exit_code == 0, res.output
        assert kind in res.output and f"{len(targets)} run(s)" in res.output
        table = pd.read_csv(Path(study["out"]) / f"{kind}.csv")
        assert not table.empty
        assert (Path(study["out"]) / f"{kind}.png").stat().st_size > 1000
        assert set(table["method"]) <= (
            {"factor"} if len(targets) == 1 else {"factor", "serl-repro"}
        )


def test_factor_conserves_the_mean_multiplier_serl_does_not(study: dict[str, str]) -> None:
    res = diagnose(study, "coef-deviation", study["factor"], study["serl-repro"], "--json")
    assert res.exit_code == 0, res.output
    table = pd.read_csv(Path(study["out"]) / "coef-deviation.csv").set_index("method")
    assert table.loc["factor", "median"] < 1e-6
    assert table.loc["serl-repro", "mean"] > 1e-6


def test_position_broadcast_shares_are_one(study: dict[str, str]) -> None:
    """SERL-Repro's credit is A^seq on every action: share 1 at every position of its wins
    and losses; FACTOR's TD credit is not a broadcast."""
    res = diagnose(study, "position", study["factor"], study["serl-repro"], "--mc-seed", "1")
    assert res.exit_code == 0, res.output
    table = pd.read_csv(Path(study["out"]) / "position.csv", dtype={"position": str})
    assert set(table["result"]) <= {"success", "failure"}
    assert {"0", "last"} <= set(table["position"])
    serl = table[(table["method"] == "serl-repro") & (table["share_actions"] > 0)]
    shares = serl[["share", "share_low", "share_high"]].to_numpy()
    assert len(serl) > 0 and np.abs(shares - 1.0).max() < 1e-6
    factor = table[table["method"] == "factor"]
    assert (factor["share_actions"] > 0).any() and (factor["share"] - 1.0).abs().max() > 1e-3


def test_bad_input_is_one_line(study: dict[str, str]) -> None:
    cases = {
        ("value", "ffffffffff"): "no run id starts with it",
        ("value", "no-such-study"): "no run id or study of that name",
        ("value", study["grpo"]): "no diagnostic records",
        ("value", study["factor"], "--steps", "7:9"): "no recorded step in 7:9",
        ("value", study["factor"], "--steps", "3:1"): "expected A:B",
        ("nonsense", study["factor"]): "unknown diagnostic 'nonsense'",
        ("td-sign", study["factor"], "--steps", "1:1"): "no recorded step's policy was kept",
        ("token-perturb", study["factor"], "--steps", "1:1"): "no recorded step's policy was kept",
        ("feedback", study["grpo"]): "no diagnostic records",
        ("feedback", study["factor"], "--steps", "1:1"): "no recorded step's policy was kept",
        ("compare", study["grpo"]): "no diagnostic records",
    }
    for args, message in cases.items():
        res = diagnose(study, *args)
        assert res.exit_code == 1, (args, res.output)
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_td_sign_replays_a_kept_step_and_resumes_from_its_cache(study: dict[str, str]) -> None:
    """Step 2 replays checkpoint 1: 3 actions, 2 continuations from x_t and x_{t+1} each; a
    second call reads the cached estimates (same table, no new play)."""
    args = ("td-sign", study["factor"], "--samples", "2", "--actions", "3", "--mc-seed", "5")
    res = diagnose(study, *args)
    assert res.exit_code == 0, res.output
    cache = sorted((Path(study["out"]) / "td-sign-estimates").glob("*.csv"))
    assert [p.name.split("-", 1)[1] for p in cache] == ["step000002-n2-a3-s5-rows.csv"]
    est = pd.read_csv(cache[0])
    assert len(est) == 3 and set(est["samples"]) == {2} and (est["failed"] == 0).all()
    assert ((est["q"] >= 0) & (est["q"] <= 1) & (est["v"] >= 0) & (est["v"] <= 1)).all()
    assert (est["mc"] == est["q"] - est["v"]).all()
    table = pd.read_csv(Path(study["out"]) / "td-sign.csv")
    assert set(table["method"]) == {"factor"} and set(table["phase"]) == {"late", "all"}
    assert table.set_index("phase").loc["all", ["actions", "ties"]].sum() == 3
    assert (Path(study["out"]) / "td-sign.png").stat().st_size > 1000
    stamp = cache[0].stat().st_mtime_ns
    again = diagnose(study, *args)
    assert again.exit_code == 0 and cache[0].stat().st_mtime_ns == stamp
    assert pd.read_csv(Path(study["out"]) / "td-sign.csv").equals(table)


def test_value_is_table_17_against_an_independent_reference(study: dict[str, str]) -> None:
    """The value kind replays the td-sign draws (and shares their cache): Table 17's metrics
    with intervals and the reference's ceiling; a run without a value head is left out."""
    args = ("value", study["factor"], study["serl-repro"], "--samples", "2", "--actions", "4")
    res = diagnose(study, *args)
    assert res.exit_code == 0, res.output
    table = pd.read_csv(Path(study["out"]) / "value.csv")
    assert set(table["method"]) == {"factor"}
    metrics = {"mse", "mae", "bias", "pearson", "sign_accuracy", "spread"}
    assert set(table["metric"]) == metrics
    assert (table["states"] > 0).all() and "ceiling" in table.columns
    spread = table[table["metric"] == "spread"]
    assert (spread["value"].dropna() >= 0).all() and (spread["ceiling"].dropna() <= 1).all()
    assert "reliability" in res.output and "against its training targets" in res.output
    assert (Path(study["out"]) / "value.png").stat().st_size > 1000
    cache = list((Path(study["out"]) / "td-sign-estimates").glob("*-n2-a4-s0-rows.csv"))
    assert len(cache) == 1 and "v_returns" in pd.read_csv(cache[0]).columns
    res = diagnose(study, "value", study["serl-repro"])
    assert res.exit_code == 1 and "no run has a value head" in res.output


def test_compare_replays_each_run_to_its_own_credit(study: dict[str, str]) -> None:
    """Replayed through its own estimator, a run's recorded actions get the credit the run
    trained on: FACTOR's TD residuals, SERL-Repro's broadcast A^seq."""
    from factor_cli.ledger.records import load_records
    from factor_cli.rollout.credit_replay import replay_credit

    records = load_records([study["factor"], study["serl-repro"]], None, study["uri"])
    replayed = replay_credit(records.actions).set_index("method")
    for method, own in (("factor", "td"), ("serl-repro", "broadcast")):
        part = replayed.loc[method]
        # Training computed the credit in float32, the replay in float64.
        assert len(part) > 4 and (part[own] - part["credit"]).abs().max() < 1e-6, method
    assert replayed.loc["serl-repro", "td"].isna().all()  # no value head: no TD credit
    res = diagnose(study, "compare", study["factor"])
    table = pd.read_csv(Path(study["out"]) / "compare.csv")
    assert res.exit_code == 0 and len(table) == 10  # 5 estimators: 10 pairs
    assert table["sign_agree"].between(0, 1).all()


def test_feedback_replays_a_kept_step_under_three_feedbacks(study: dict[str, str]) -> None:
    """Step 2's drawn trajectories replay under checkpoint 1: the true-feedback allocation is
    the one training recorded, FACTOR's mean weight stays 1 under every feedback, and a rerun
    reads the cache."""
    res = diagnose(study, "feedback", study["factor"], "--actions", "3", "--mc-seed", "2")
    assert res.exit_code == 0, res.output
    (cache,) = sorted((Path(study["out"]) / "feedback").glob("*-rows.csv"))
    (gap,) = sorted((Path(study["out"]) / "feedback").glob("*-teacher-gap-*.csv"))
    assert set(pd.read_csv(gap)["source"]) == {"gold", "sampled"}  # the start model's gap
    rows = pd.read_csv(cache)
    assert set(rows["condition"]) == {"true", "shuffled", "none"} and set(rows["step"]) == {2}
    assert (rows["wbar"] - 1.0).abs().max() < 1e-9  # mean-preserving whatever the feedback
    from factor_cli.ledger.records import load_records

    rec = load_records([study["factor"]], (2, 2), study["uri"]).actions
    true = rows[rows["condition"] == "true"].merge(rec, on=["step", "traj", "turn"])
    assert len(true) == len(rows) // 3 > 0
    assert (true["top_mass_x"] - true["top_mass_y"]).abs().max() < 1e-3  # replay = record
    table = pd.read_csv(Path(study["out"]) / "feedback.csv")
    assert list(table["condition"]) == ["true", "shuffled", "none"]
    stamp = cache.stat().st_mtime_ns
    again = diagnose(study, "feedback", study["factor"], "--actions", "3", "--mc-seed", "2",
                     "--json")  # fmt: skip
    assert again.exit_code == 0 and cache.stat().st_mtime_ns == stamp
    tables = json.loads(again.output)  # names and columns, whatever the terminal's width
    paired = tables["true against the others (paired, top-quartile mass)"]
    assert {r["condition"] for r in paired} == {"shuffled", "none"} and "drop_share" in paired[0]
    gap_table = tables["teacher gap of the start model (before RL)"]
    assert {r["source"] for r in gap_table} == {"gold", "sampled"}


def test_token_perturb_plays_out_both_quartiles_of_drawn_actions(study: dict[str, str]) -> None:
    args = ("token-perturb", study["factor"], "--samples", "2", "--actions", "4", "--mc-seed", "3")
    res = diagnose(study, *args)
    assert res.exit_code == 0, res.output
    (cache,) = sorted((Path(study["out"]) / "token-perturb").glob("*.csv"))
    rows = pd.read_csv(cache, keep_default_na=False, na_values=[""])
    assert len(rows) > 0 and len(rows) % 2 == 0 and (rows["length"] >= 2).all()
    pairs = rows.groupby(["traj", "turn"])["quartile"].apply(sorted)
    assert all(q == ["bottom", "top"] for q in pairs)
    assert ((rows["delta"] - (rows["g_perturbed"] - rows["g_base"])).abs() < 1e-12).all()
    assert (rows["perturbed"] != rows["action"]).any()  # the perturbation changes actions
    table = pd.read_csv(Path(study["out"]) / "token-perturb.csv")
    assert table["auc"].between(0, 1).all() and table["actions"].sum() == len(pairs)
    stamp = cache.stat().st_mtime_ns
    assert diagnose(study, *args).exit_code == 0 and cache.stat().st_mtime_ns == stamp


def test_to_end_plays_the_reference_to_the_episode_end_under_its_own_cache(
    study: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--to-end: the independent continuations run for the env's turn limit (3 in the tiny
    runs), not the run's continuations.horizon (2), and are cached apart from the run-horizon
    estimates."""
    import factor_cli.diagnostics.td_sign as td

    horizons: list[int] = []
    real = td.mc_advantages

    def spy(*args: Any, **kwargs: Any) -> Any:
        horizons.append(args[4].horizon)  # (cfg, policy, step actions, chosen, plan)
        return real(*args, **kwargs)

    monkeypatch.setattr(td, "mc_advantages", spy)
    base = ("value", study["factor"], "--samples", "2", "--actions", "2", "--mc-seed", "9")
    assert diagnose(study, *base).exit_code == 0
    res = diagnose(study, *base, "--to-end")
    assert res.exit_code == 0, res.output
    assert horizons == [2, 3]
    cache = sorted(p.name for p in (Path(study["out"]) / "td-sign-estimates").glob("*-s9*"))
    assert [n.split("-", 1)[1] for n in cache] == [
        "step000002-n2-a2-s9-end-rows.csv", "step000002-n2-a2-s9-rows.csv"
    ]  # fmt: skip
