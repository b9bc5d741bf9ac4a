"""The diagnose tables on hand-computable record frames (exact numbers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from factor_cli.stats import diagnose as d
from factor_cli.stats.diagnose_plots import position_plot


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"run_id": "r1", "method": "m", "env": "twx", "seed": "1", "step": 1, "group": 0,
            "turn": 0, "turns": 1, "length": 4, "success": 0, "a_seq": 0.0, "credit": 0.0,
            "value": float("nan"), "wbar": 1.0, "strength": 0.5}  # fmt: skip
    return pd.DataFrame([{**base, **r} for r in rows])


def test_coef_deviation_counts_credited_actions_of_active_steps() -> None:
    acts = frame(
        [
            # step 1: allocation active (one w-bar != 1); three credited actions, one not
            {"traj": 0, "wbar": 1.05, "credit": 0.5},
            {"traj": 0, "wbar": 1.20, "credit": -0.5},
            {"traj": 1, "wbar": 0.70, "credit": 0.1},
            {"traj": 1, "wbar": 1.50, "credit": 0.0},
            # step 2: the teacher is off (strength 0) -> left out
            {"traj": 0, "step": 2, "wbar": 1.3, "credit": 0.3, "strength": 0.0},
        ]
    )
    row = d.coef_deviation(acts).iloc[0]
    assert row["actions"] == 3
    assert row["median"] == pytest.approx(0.20)
    assert row["mean"] == pytest.approx((0.05 + 0.20 + 0.30) / 3)
    assert row["share_over_10pct"] == pytest.approx(2 / 3)


def test_coef_deviation_of_a_mean_preserving_method_is_zero() -> None:
    acts = frame([{"traj": t, "credit": 0.1 * (t + 1), "wbar": 1.0} for t in range(4)])
    row = d.coef_deviation(acts).iloc[0]
    assert (row["actions"], row["median"], row["share_over_10pct"]) == (4, 0.0, 0.0)


def test_coef_deviation_per_env_and_per_seed() -> None:
    """Runs of one method on two environments are never pooled; per_seed splits by seed."""
    acts = frame(
        [
            {"traj": 0, "wbar": 1.2, "credit": 0.5},
            {"traj": 0, "wbar": 1.0, "credit": 0.5, "run_id": "r2", "seed": "2"},
            {"traj": 0, "wbar": 0.6, "credit": 0.5, "run_id": "r3", "env": "sciworld"},
        ]
    )
    pooled = d.coef_deviation(acts).set_index("env")
    assert list(pooled.index) == ["sciworld", "twx"]
    assert pooled.loc["twx", "actions"] == 2 and pooled.loc["twx", "median"] == pytest.approx(0.1)
    assert pooled.loc["sciworld", "median"] == pytest.approx(0.4)
    seeds = d.coef_deviation(acts, per_seed=True).set_index(["env", "seed"])["median"]
    assert seeds.to_dict() == pytest.approx(
        {("sciworld", "1"): 0.4, ("twx", "1"): 0.2, ("twx", "2"): 0.0}
    )


def test_group_signal_per_step() -> None:
    acts = frame(
        [
            {"traj": 0, "group": 0, "a_seq": 0.5, "credit": 0.5},
            {"traj": 1, "group": 0, "a_seq": -0.5, "credit": 0.0},
            {"traj": 2, "group": 1, "a_seq": 0.0, "credit": 0.0},
            {"traj": 2, "group": 1, "turn": 1, "a_seq": 0.0, "credit": 0.2},
        ]
    )
    row = d.group_signal(acts).iloc[0]
    assert (row["groups"], row["group_signal"], row["zero_credit"]) == (2, 0.5, 0.5)


def test_value_calibration_exact() -> None:
    acts = frame(
        [
            {"traj": 0, "turn": 0, "value": 0.0},
            {"traj": 0, "turn": 1, "value": 1.0},
            {"traj": 1, "turn": 0, "value": 0.5},  # no continuation from here: left out
        ]
    )
    conts = pd.DataFrame(
        {
            "run_id": "r1",
            "step": 1,
            "traj": [0, 0, 0, 0],
            "turn": [0, 0, 1, 1],
            "target": [0.0, 1.0, 1.0, 1.0],
        }
    )
    summary, curve = d.value_calibration(acts, conts, bins=2)
    row = summary.iloc[0]
    assert row["states"] == 2
    assert row["mse"] == pytest.approx(((0.0 - 0.5) ** 2 + 0.0) / 2)
    assert row["pearson"] == pytest.approx(1.0)
    assert curve[["prediction", "target", "states"]].values.tolist() == [
        [0.0, 0.5, 1],
        [1.0, 1.0, 1],
    ]
    with pytest.raises(ValueError, match="no state has both"):
        d.value_calibration(acts.assign(value=float("nan")), conts)


def test_length_bias_token_mean_grows_action_mean_does_not() -> None:
    acts = frame([{"traj": 0, "turn": t, "length": n} for t, n in enumerate((2, 6, 12, 20))])
    table = d.length_bias(acts).set_index("bucket")
    mean_len = (2 + 6 + 12 + 20) / 4
    assert list(table.index) == ["1-6", "11-16", ">=17"]
    assert table.loc["1-6", "token_mean"] == pytest.approx((2 + 6) / 2 / mean_len)
    assert table.loc[">=17", "token_mean"] == pytest.approx(20 / mean_len)
    assert (table["action_mean"] == 1.0).all()


def test_horizon_buckets_trajectories_once() -> None:
    acts = frame(
        [
            {"traj": 0, "turns": 2, "turn": 0, "success": 1},
            {"traj": 0, "turns": 2, "turn": 1, "success": 1},
            {"traj": 1, "turns": 3, "success": 0},
            {"traj": 2, "turns": 12, "success": 0},
        ]
    )
    table = d.horizon(acts).set_index("bucket")
    assert table.loc["1-3", "trajectories"] == 2
    assert table.loc["1-3", "success"] == 0.5
    assert table.loc[">=10", "success"] == 0.0
    other = acts.assign(method="a", run_id="r2", success=1)
    diff = d.horizon_differences(d.horizon(pd.concat([acts, other])))
    assert diff.set_index("bucket")["difference"].to_dict() == {"1-3": -0.5, ">=10": -1.0}
    assert set(diff["pair"]) == {"m - a"}


def test_td_sign_agreement_exact() -> None:
    """Five credited actions (one of them a tie, left out) and one zero-credit action (left out):
    early 1 of 2 agree, late 2 of 2; every action its own trajectory, so with all of them
    agreeing the interval is the point."""
    est = pd.DataFrame(
        {
            "method": ["factor"] * 6,
            "run_id": ["r"] * 6,
            "step": [2, 2, 2, 9, 9, 9],
            "traj": [0, 1, 2, 0, 1, 2],
            "phase": ["early"] * 3 + ["late"] * 3,
            "credit": [0.5, -0.2, 0.3, -0.4, 0.1, 0.0],
            "mc": [0.25, 0.5, 0.0, -0.125, 0.75, 0.5],
        }
    )
    table = d.td_sign(est).set_index("phase")
    assert table.loc["early", ["actions", "ties"]].tolist() == [2, 1]
    assert table.loc["early", "agreement"] == 0.5
    assert table.loc["late", ["actions", "ties", "agreement"]].tolist() == [2, 0, 1.0]
    assert table.loc["late", ["ci_low", "ci_high"]].tolist() == [1.0, 1.0]
    assert table.loc["all", ["actions", "ties", "agreement"]].tolist() == [4, 1, 0.75]
    low, high = table.loc["all", ["ci_low", "ci_high"]]
    assert 0.0 <= low < 0.75 < high <= 1.0


def test_td_sign_resamples_trajectories_whole() -> None:
    """Two trajectories of 3 actions: one all agreeing, one all not. Resampling actions would
    give intermediate means; resampling trajectories gives only 0, 0.5 and 1."""
    est = pd.DataFrame(
        {
            "method": ["m"] * 6, "run_id": ["r"] * 6, "step": [1] * 6,
            "traj": [0, 0, 0, 1, 1, 1], "phase": ["early"] * 6,
            "credit": [1.0] * 6, "mc": [1.0, 1.0, 1.0, -1.0, -1.0, -1.0],
        }
    )  # fmt: skip
    row = d.td_sign(est).set_index("phase").loc["all"]
    assert row["agreement"] == 0.5
    assert {row["ci_low"], row["ci_high"]} <= {0.0, 0.5, 1.0}


def _replayed(n_traj: int = 12, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """td-sign replay rows with values and 8 continuation returns each, and their records."""
    rng = np.random.default_rng(seed)
    rows, acts = [], []
    for traj in range(n_traj):
        group, outcome = traj // 4, int(traj % 2)
        for turn in range(3):
            p = rng.random()
            ret = (rng.random(8) < p).astype(int)
            rows.append({"method": "factor", "env": "twx", "run_id": "r", "step": 2,
                         "traj": traj, "turn": turn, "group": group,
                         "phase": "early" if traj < 6 else "late",
                         "value": p + rng.normal(0, 0.1), "v": ret.mean(), "samples": 8,
                         "v_returns": ";".join(map(str, ret))})  # fmt: skip
            acts.append({"run_id": "r", "step": 2, "traj": traj, "group": group,
                         "outcome": outcome})  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(acts)


def test_value_against_mc_is_table_17_with_the_ceiling() -> None:
    from factor_cli.stats.calibration import value_metrics

    est, acts = _replayed()
    table = d.value_against_mc(est, acts)
    assert set(table["phase"]) == {"early", "late", "all"}
    assert set(table["metric"]) == set(d.VALUE_METRICS)
    every = table[table["phase"] == "all"].set_index("metric")
    assert (every["states"] == 36).all()
    base = est["group"].map(acts.groupby("group")["outcome"].mean()).to_numpy()
    want = value_metrics(est["value"].to_numpy(), est["v"].to_numpy(), base,
                         est["traj"].to_numpy(), np.random.default_rng(0), 50)  # fmt: skip
    for name, iv in want.items():
        assert every.loc[name, "value"] == pytest.approx(iv.point)
        assert every.loc[name, "ci_low"] <= iv.point <= every.loc[name, "ci_high"]
    assert 0 < every.loc["pearson", "ceiling"] <= 1 and every.loc["sign_accuracy", "ceiling"] > 0.5
    assert np.isnan(every.loc["mse", "ceiling"])
    assert 0 < every.loc["spread", "ceiling"] <= 1


def test_value_against_mc_refuses_caches_without_returns() -> None:
    est, acts = _replayed()
    with pytest.raises(ValueError, match="predate per-continuation returns"):
        d.value_against_mc(est.drop(columns="v_returns"), acts)


def trajectory(i: int, success: int, a_seq: float, credits: list[float], **extra) -> list[dict]:
    """The action rows of trajectory ``i``: credit A*_t = credits[t], T_i = len(credits)."""
    return [
        {"traj": i, "turn": t, "turns": len(credits), "success": success, "a_seq": a_seq,
         "credit": c, **extra}
        for t, c in enumerate(credits)
    ]  # fmt: skip


def test_credit_by_position_exact() -> None:
    """Shares s_t = A*_t / A^seq: win 0 (-0.5, 0.5, 1), loss 1 (0.8, 0.2), win 2 (0.2, 0.8);
    win 3 has A^seq = 0, so only its credit counts; step 2's teacher is off (left out)."""
    acts = frame(
        trajectory(0, 1, 0.5, [-0.25, 0.25, 0.5])
        + trajectory(1, 0, -0.5, [-0.4, -0.1])
        + trajectory(2, 1, 0.5, [0.1, 0.4])
        + trajectory(3, 1, 0.0, [0.3, -0.3])
        + trajectory(0, 1, 0.5, [9.0], step=2, strength=0.0)
    )
    table = d.credit_by_position(acts).set_index(["result", "position"])
    assert list(table.index) == [
        ("failure", "0"), ("failure", "1"), ("failure", "last"),
        ("success", "0"), ("success", "1"), ("success", "2"), ("success", "last"),
    ]  # fmt: skip
    cols = ["actions", "trajectories", "share_actions", "share", "uniform_share", "credit"]
    expected = {
        ("failure", "0"): [1, 1, 1, 0.8, 1 / 2, -0.4],
        ("failure", "1"): [1, 1, 1, 0.2, 1 / 2, -0.1],
        ("failure", "last"): [1, 1, 1, 0.2, 1 / 2, -0.1],
        ("success", "0"): [3, 3, 2, (-0.5 + 0.2) / 2, (1 / 3 + 1 / 2) / 2, (-0.25 + 0.1 + 0.3) / 3],
        ("success", "1"): [3, 3, 2, (0.5 + 0.8) / 2, (1 / 3 + 1 / 2) / 2, (0.25 + 0.4 - 0.3) / 3],
        ("success", "2"): [1, 1, 1, 1.0, 1 / 3, 0.5],
        ("success", "last"): [3, 3, 2, (1.0 + 0.8) / 2, (1 / 3 + 1 / 2) / 2, (0.5 + 0.4 - 0.3) / 3],
    }
    for key, values in expected.items():
        assert table.loc[key, cols].tolist() == pytest.approx(values), key
    # One trajectory in a cell: every resample is that trajectory, the interval is the point.
    for key in [("success", "2"), ("failure", "0")]:
        row = table.loc[key]
        assert [row["share_low"], row["share_high"]] == pytest.approx([row["share"]] * 2)
        assert [row["credit_low"], row["credit_high"]] == pytest.approx([row["credit"]] * 2)
    win = table.loc[("success", "0")]
    assert win["share_low"] == pytest.approx(-0.5) and win["share_high"] == pytest.approx(0.2)


def test_credit_by_position_without_any_share() -> None:
    """A cell whose trajectories all have A^seq = 0 has credit but no share."""
    row = d.credit_by_position(frame(trajectory(0, 1, 0.0, [0.2]))).iloc[0]
    assert (row["actions"], row["share_actions"], row["credit"]) == (1, 0, 0.2)
    assert pd.isna(row[["share", "share_low", "share_high", "uniform_share"]]).all()


def test_credit_by_position_pools_late_turns_and_resamples_trajectories_whole() -> None:
    """With turns=1, turns 1-3 of two wins pool into '>=1': one with shares all +1, one all
    -1. Resampling actions would give means such as 1/3; resampling trajectories gives only
    -1, 0 and 1."""
    acts = frame(
        trajectory(0, 1, 1.0, [0.0, 1.0, 1.0, 1.0]) + trajectory(1, 1, 1.0, [4.0, -1.0, -1, -1])
    )
    table = d.credit_by_position(acts, turns=1).set_index("position")
    assert list(table.index) == ["0", ">=1", "last"]
    late = table.loc[">=1"]
    assert (late["actions"], late["trajectories"], late["share"]) == (6, 2, 0.0)
    assert {late["share_low"], late["share_high"]} <= {-1.0, 0.0, 1.0}
    assert late["share_low"] < 0.0 < late["share_high"]
    assert d.credit_by_position(acts, turns=1).equals(d.credit_by_position(acts, turns=1))


def test_broadcast_credit_has_share_one_at_every_position() -> None:
    """GRPO's credit is A^seq on every action: s_t = 1 everywhere, with a point interval."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(12):
        a_seq = float(rng.choice([-1, 1]) * rng.uniform(0.1, 1.0))
        rows += trajectory(i, int(a_seq > 0), a_seq, [a_seq] * int(rng.integers(1, 14)))
    table = d.credit_by_position(frame(rows).assign(method="grpo", strength=0.0))
    assert set(table["result"]) == {"success", "failure"} and ">=10" in set(table["position"])
    assert (table[["share", "share_low", "share_high"]] == 1.0).all(axis=None)


def test_credit_by_position_matches_a_loop_oracle() -> None:
    """Random records of two methods on two envs over two runs: counts and means by loops."""
    rng = np.random.default_rng(7)
    rows = []
    for run, (method, env) in enumerate([("a", "x"), ("a", "y"), ("b", "x"), ("a", "x")]):
        for step in (1, 2):
            for i in range(8):
                t_i = int(rng.integers(1, 6))
                a_seq = float(rng.choice([0.0, -0.5, 0.5, 1.0]))
                credits = rng.normal(size=t_i).round(3).tolist()
                rows += trajectory(i, int(rng.random() < 0.5), a_seq, credits, run_id=f"r{run}",
                                   method=method, env=env, step=step)  # fmt: skip
    table = d.credit_by_position(frame(rows), turns=3, seed=1)
    expected: dict[tuple, dict[str, list]] = {}
    for r in rows:
        result = "success" if r["success"] else "failure"
        positions = [str(r["turn"]) if r["turn"] < 3 else ">=3"]
        for position in positions + (["last"] if r["turn"] == r["turns"] - 1 else []):
            cell = expected.setdefault((r["method"], r["env"], result, position),
                                       {"credit": [], "share": [], "traj": []})  # fmt: skip
            cell["credit"].append(r["credit"])
            cell["traj"].append((r["run_id"], r["step"], r["traj"]))
            if abs(r["a_seq"]) >= 1e-6:
                cell["share"].append(r["credit"] / r["a_seq"])
    got = table.set_index(["method", "env", "result", "position"])
    assert sorted(got.index) == sorted(expected)
    for key, cell in expected.items():
        row = got.loc[key]
        assert row["actions"] == len(cell["credit"])
        assert row["trajectories"] == len(set(cell["traj"]))
        assert row["share_actions"] == len(cell["share"])
        assert row["credit"] == pytest.approx(np.mean(cell["credit"]))
        assert row["credit_low"] - 1e-12 <= row["credit"] <= row["credit_high"] + 1e-12
        if cell["share"]:
            assert row["share"] == pytest.approx(np.mean(cell["share"]))
            assert row["share_low"] - 1e-12 <= row["share"] <= row["share_high"] + 1e-12


def test_position_plot_writes_a_png(tmp_path: Path) -> None:
    acts = frame(trajectory(0, 1, 0.5, [-0.25, 0.25, 0.5]) + trajectory(1, 0, -0.5, [-0.4, -0.1]))
    out = position_plot(d.credit_by_position(acts), tmp_path / "position.png")
    assert out.stat().st_size > 1000
