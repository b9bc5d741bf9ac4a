"""`factor_cli.stats.report`: each command's computation on hand-computable results, no CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from toy_results import ITEMS, SUCCESS

from factor_cli.stats import AGGREGATES, probability_of_improvement, validate_results
from factor_cli.stats.report import (
    AggregateRequest,
    BootstrapRequest,
    ItemTestsRequest,
    ProfileRequest,
    ablation_deltas,
    aggregate_report,
    bootstrap_report,
    item_tests_report,
    jsonable,
    load_metrics,
    load_results,
    profile_report,
)

# A's (seeds x envs) score matrix: rows seed 1, 2; columns alf, ws.
A_SCORES = np.array([[0.50, 1.0], [0.75, 0.5]])
B_SCORES = np.array([[0.50, 0.0], [0.50, 0.5]])


def raw_results() -> pd.DataFrame:
    rows = [
        (env, method, seed, item, cat, s, 100.0 * s)
        for (method, seed), succ in SUCCESS.items()
        for (env, item, cat), s in zip(ITEMS, succ, strict=True)
    ]
    cols = ["env", "method", "seed", "item_id", "category", "success", "score"]
    return pd.DataFrame(rows, columns=cols)


@pytest.fixture
def results() -> pd.DataFrame:
    return validate_results(raw_results())


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_report_per_seed_values_and_json(results: pd.DataFrame) -> None:
    report = bootstrap_report(results, BootstrapRequest("alf", "A", "B", replicates=200, seed=3))
    # alf: seed 1 0.50 - 0.50 = 0; seed 2 0.75 - 0.50 = +25 pp
    assert report.per_seed_pp == {"1": 0.0, "2": 25.0}
    assert report.warnings == ()
    got = report.as_json()
    assert got["point"] == pytest.approx(12.5)
    assert (got["replicates"], got["rng_seed"], got["confidence"]) == (200, 3, 0.95)
    assert got["ci_low"] <= got["point"] <= got["ci_high"]
    assert list(got) == [
        "env",
        "method",
        "baseline",
        "point",
        "ci_low",
        "ci_high",
        "p_positive",
        "replicates",
        "per_seed",
        "confidence",
        "rng_seed",
    ]


def test_single_seed_bootstrap_warns_that_the_ci_ignores_seed_variance(
    results: pd.DataFrame,
) -> None:
    one = results.loc[results["seed"] == 2]
    report = bootstrap_report(one, BootstrapRequest("ws", "A", "B", replicates=50))
    (warning,) = report.warnings
    assert "only one training seed (2) of 'A' and 'B' on 'ws'" in warning
    assert "the 95% CI resamples items only and ignores seed-to-seed variance" in warning
    assert "\n" not in warning


# ----------------------------------------------------------------------------- item tests


def test_item_tests_report_counts_and_categories(results: pd.DataFrame) -> None:
    report = item_tests_report(results, ItemTestsRequest("alf", "A", "B", seed=1))
    # seed 1 on alf: A wins i1 and i2 (category x), loses i3 (category y)
    assert (report.tests.wins, report.tests.losses, report.tests.n_items) == (2, 1, 3)
    got = report.as_json()
    assert got["categories"] == [
        {"category": "x", "n": 2, "wins": 2, "losses": 0, "weight": 0.25},
        {"category": "y", "n": 1, "wins": 0, "losses": 1, "weight": 0.5},
    ]
    # macro difference T = 0.25 * (2 - 0) + 0.5 * (0 - 1) = 0; McNemar (|2 - 1| - 1)^2 / 3 = 0
    assert got["stratified_macro_diff"] == pytest.approx(0.0)
    assert got["mcnemar_chi2"] == pytest.approx(0.0)
    assert (got["wilcoxon_on"], got["seed"]) == ("score", 1)
    with pytest.raises(ValueError, match="wilcoxon_on 'rank' is not one of score, success"):
        item_tests_report(results, ItemTestsRequest("alf", "A", "B", 1, "rank"))


# ----------------------------------------------------------------------------- aggregates

# Hand values on A_SCORES (0.50, 1.0, 0.75, 0.5; sorted 0.5 0.5 0.75 1.0), in percent.
A_AGGREGATES = {
    "iqm": 62.5,  # K = 4, g = 1: mean(0.5, 0.75)
    "mean": 68.75,
    "median": 62.5,
    "optimality_gap": 31.25,  # (0.5 + 0 + 0.25 + 0.5) / 4
}


@pytest.mark.parametrize("name", AGGREGATES.names())
def test_aggregate_report_computes_every_aggregate(results: pd.DataFrame, name: str) -> None:
    report = aggregate_report(results, AggregateRequest(replicates=50))
    assert report.aggregates == tuple(AGGREGATES.names())
    est = report.methods["A"].percent[name]
    assert est.point == pytest.approx(A_AGGREGATES[name])
    assert est.point == pytest.approx(100 * AGGREGATES.get(name)(A_SCORES))
    assert est.low <= est.point + 1e-9 and est.point <= est.high + 1e-9


def test_aggregate_report_improvement_and_json(results: pd.DataFrame) -> None:
    request = AggregateRequest(methods=["A"], baseline="B", replicates=50, seed=1)
    report = aggregate_report(results, request)
    assert report.tasks == ("alf", "ws")
    assert list(report.methods) == ["A"]  # the baseline is not shown unless asked for
    # P(A > B): alf (0.5 + 0.5 + 1 + 1)/4 = 0.75, ws (1 + 1 + 1 + 0.5)/4 = 0.875 -> 0.8125
    assert report.methods["A"].improvement.point == pytest.approx(0.8125)
    assert probability_of_improvement(A_SCORES, B_SCORES) == pytest.approx(0.8125)
    got = json.loads(json.dumps(jsonable(report.as_json())))
    assert list(got["methods"]["A"]) == ["runs", *AGGREGATES.names(), "probability_of_improvement"]
    assert (got["task_kind"], got["baseline"], got["rng_seed"]) == ("env", "B", 1)
    both = aggregate_report(results, AggregateRequest(baseline="B", replicates=20))
    assert both.methods["B"].improvement is None


def test_aggregate_report_by_category_and_seeded(results: pd.DataFrame) -> None:
    request = AggregateRequest(tasks="category", replicates=100, seed=7)
    report = aggregate_report(results, request)
    assert report.tasks == ("alf/x", "alf/y", "ws/all")
    again = aggregate_report(results, request)
    assert again.methods["B"].percent["iqm"] == report.methods["B"].percent["iqm"]
    with pytest.raises(ValueError, match="unknown task kind 'item'; valid: env, category"):
        aggregate_report(results, AggregateRequest(tasks="item"))


# ----------------------------------------------------------------------------- profiles


def test_profile_report_hand_values(results: pd.DataFrame) -> None:
    report = profile_report(results, ProfileRequest(tasks="env", replicates=30, thresholds=5))
    np.testing.assert_allclose(report.taus, [0.0, 0.25, 0.5, 0.75, 1.0])
    # A's scores 0.5, 1.0, 0.75, 0.5: the fraction strictly above each tau
    np.testing.assert_allclose(report.profiles["A"].point, [1.0, 1.0, 0.5, 0.25, 0.0])
    assert report.profiles["B"].low.shape == (5,)


# ----------------------------------------------------------------------------- loading


def test_load_results_filters_and_names_a_missing_study_column(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    raw_results().to_csv(path, index=False)
    assert set(load_results(path, ["seed=2"])["seed"]) == {2}
    with pytest.raises(ValueError) as err:
        load_results(path, run_keys=("budget",), example=lambda column: "2x4")
    assert str(err.value) == (
        "this table needs the study column 'budget' (e.g. 2x4); add it, or pass "
        "--group-column NAME if yours is called differently"
    )
    with pytest.raises(ValueError, match=r"study column 'tier' \(e.g. one value per run\)"):
        load_results(path, run_keys=("tier",))


def test_load_metrics_filters(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    rows = [("A", 1, 0, 0.1, "alf"), ("B", 1, 0, 0.2, "alf"), ("A", 1, 0, 0.3, "ws")]
    pd.DataFrame(rows, columns=["method", "seed", "step", "reward", "env"]).to_csv(path)
    got = load_metrics(path, "reward", env="alf", methods=["A"])
    assert got["reward"].tolist() == [0.1]
    with pytest.raises(ValueError, match="env 'sci' not found; present: alf, ws"):
        load_metrics(path, "reward", env="sci")
    pd.DataFrame(rows, columns=["method", "seed", "step", "reward", "x"]).to_csv(path)
    with pytest.raises(ValueError, match="--env needs an env column"):
        load_metrics(path, "reward", env="alf")


def test_ablation_deltas_need_another_method(results: pd.DataFrame) -> None:
    deltas = ablation_deltas(results, "B")
    assert deltas["delta"].tolist() == pytest.approx([12.5, 50.0])  # A - B on alf, ws
    with pytest.raises(ValueError, match="no method other than 'B' to compare"):
        ablation_deltas(results, "B", methods=["B"])


def test_jsonable() -> None:
    got = jsonable({"a": np.float64("nan"), "b": (np.int64(2), np.inf), "c": np.array([1.5])})
    assert got == {"a": None, "b": [2, None], "c": [1.5]}


# ----------------------------------------------------------------------------- layering


def test_stats_imports_no_other_factor_cli_module() -> None:
    """stats/ (report and plots too) stands alone: only factor_cli.registry from outside."""
    code = (
        "import json, sys, factor_cli.stats, factor_cli.stats.report, factor_cli.stats.plots\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('factor_cli'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    outside = [m for m in loaded if not m.startswith("factor_cli.stats")]
    assert outside == ["factor_cli", "factor_cli.registry"]
