"""docs/RESULTS.md is what ``experiments/mini_results.py render`` makes of the committed files
under docs/results/: a fresh clone regenerates every table from them, and the page in the
repository is never stale (issue 29)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module():
    path = REPO / "experiments" / "mini_results.py"
    spec = importlib.util.spec_from_file_location("mini_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mini_results"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_committed_results_render_to(tmp_path: Path) -> None:
    mr = _module()
    results = tmp_path / "results"  # render writes its pictures beside the data: work on a copy
    import shutil

    shutil.copytree(REPO / "docs" / "results", results)
    text = mr.render(results, REPO / "experiments" / "RESULTS.md.in")
    assert text == (REPO / "docs" / "RESULTS.md").read_text(), (
        "docs/RESULTS.md is stale: run .venv/bin/python experiments/mini_results.py render"
    )
    for study in (p for p in results.iterdir() if (p / "items.csv").exists()):
        assert (study / "curves.png").stat().st_size > 1000


def test_setting_labels() -> None:
    assert _module().setting_of(3, 6) == "coin3 T6"


def test_position_table_drops_broadcast_credit_and_keeps_the_first_turns_and_the_last() -> None:
    import pandas as pd

    rows = []
    for method, share in (("grpo", lambda t: 1.0), ("factor", lambda t: 0.1 * t - 0.2)):
        for result in ("failure", "success"):
            for position in [*map(str, range(8)), ">=10", "last"]:
                t = 9 if position in (">=10", "last") else int(position)
                rows.append({"setting": "coin6 T12", "method": method, "result": result,
                             "position": position, "share": share(t)})  # fmt: skip
    table = _module().position_table(pd.DataFrame(rows), turns=3)
    assert table["method"].unique().tolist() == ["factor"]
    assert list(table.columns) == ["setting", "method", "result", "0", "1", "2", "last"]
    assert table["0"].tolist() == [-0.2, -0.2] and table["last"].round(6).tolist() == [0.7, 0.7]


def test_value_mc_table_orders_phases_and_sets_each_ceiling_beside_its_metric() -> None:
    import pandas as pd

    rows = [
        {"setting": "coin6 T12", "method": "factor", "phase": phase, "metric": metric,
         "states": 40, "value": v, "ci_low": v - 0.1, "ci_high": v + 0.1,
         "ceiling": {"pearson": 0.9, "sign_accuracy": 0.8}.get(metric), "reliability": 0.7}
        for phase, v in (("all", 0.5), ("late", 0.4), ("early", 0.3))
        for metric in ("mse", "pearson", "sign_accuracy")
    ]  # fmt: skip
    table = _module().value_mc_table(pd.DataFrame(rows))
    assert table["phase"].tolist() == ["early", "late", "all"]
    assert table.loc[0, "pearson"] == "0.3 [0.2, 0.4]"
    assert table["pearson ceiling"].tolist() == [0.9] * 3
    assert "mse ceiling" not in table.columns


def test_a_partial_export_replaces_its_own_cells_and_keeps_the_others(tmp_path: Path) -> None:
    import pandas as pd

    mr = _module()
    path = tmp_path / "runs.csv"
    first = pd.DataFrame({"setting": ["coin6 T12"] * 2, "method": ["grpo", "factor"],
                          "seed": [1, 1], "run_id": ["a", "b"]})  # fmt: skip
    mr._merge(path, first, ["setting", "method", "seed"])
    later = pd.DataFrame({"setting": ["coin6 T12"] * 2, "method": ["factor", "grpo"],
                          "seed": [1, 2], "run_id": ["c", "d"]})  # fmt: skip
    merged = mr._merge(path, later, ["setting", "method", "seed"])
    assert merged.equals(pd.read_csv(path))
    assert merged[["method", "seed", "run_id"]].values.tolist() == [
        ["factor", 1, "c"], ["grpo", 1, "a"], ["grpo", 2, "d"]
    ]  # fmt: skip


def test_replay_estimates_keep_exported_runs_and_drop_the_rest(tmp_path: Path) -> None:
    import pandas as pd

    mr = _module()
    for kind in ("feedback", "token-perturb"):
        pd.DataFrame({"run_id": ["kept", "gone", "again"], "x": [1, 2, 3]}).to_csv(
            tmp_path / f"{kind}-estimates.csv", index=False
        )
    runs = pd.DataFrame({"run_id": ["kept", "again"], "setting": "s", "method": "factor"})
    new = runs[runs["run_id"] == "again"]
    # Without a replay cache nothing is replayed: the re-exported run's old rows go too.
    got = mr._replay_estimates(runs, new, tmp_path, None)
    for kind, frame in got.items():
        assert frame["run_id"].tolist() == ["kept"]
        assert pd.read_csv(tmp_path / f"{kind}-estimates.csv")["run_id"].tolist() == ["kept"]


def test_stored_records_read_back_as_written(tmp_path: Path) -> None:
    import pandas as pd

    mr = _module()
    acts = pd.DataFrame({"run_id": ["r"] * 2, "instance": ["007", "8"], "action": ["None", "go"],
                         "value": [0.5, None]})  # fmt: skip
    conts = pd.DataFrame({"run_id": ["r"], "ret": [1.0]})
    acts.to_csv(tmp_path / "r-actions.csv.gz", index=False, compression="gzip")
    conts.to_csv(tmp_path / "r-continuations.csv.gz", index=False, compression="gzip")
    got, got_conts = mr.stored_records(tmp_path, ["r"])
    assert got["instance"].tolist() == ["007", "8"] and got["action"].tolist() == ["None", "go"]
    assert got["value"].isna().tolist() == [False, True] and got_conts.equals(conts)


def test_runs_of_a_study_not_exported_is_a_one_line_error() -> None:
    import pytest

    mr = _module()
    with pytest.raises(SystemExit) as exit_info:
        mr.main(["runs", "no-such-study"])
    message = str(exit_info.value)
    assert "\n" not in message
    assert message.endswith("not found; export the study first "
                            "(mini_results.py export no-such-study --partial)")  # fmt: skip
    assert "no-such-study/runs.csv" in message


def test_settings_sort_by_rooms_and_turns_as_numbers() -> None:
    mr = _module()
    labels = ["coin6 T12", "cooking1 T12", "coin11 T24", "coin3 T6"]
    assert mr.sorted_settings(labels) == ["coin3 T6", "coin6 T12", "coin11 T24", "cooking1 T12"]


def test_td_sign_replays_the_rows_whose_credit_reads_values() -> None:
    mr = _module()
    read = {m for m in ("grpo", "serl-repro", "factor", "wo-tac", "wo-hta", "factor-mc",
                        "vineppo") if mr.reads_values(m)}  # fmt: skip
    assert read == {"factor", "wo-hta", "factor-mc", "vineppo"}


def _items(deltas: dict[tuple[str, str], float]):
    """Item-level final successes: per (setting, method) 3 seeds x 40 items at rate 0.5 + d."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for (setting, method), d in deltas.items():
        for seed in (1, 2, 3):
            for item in range(40):
                ok = float(rng.random() < 0.5 + d)
                rows.append({"setting": setting, "method": method, "seed": seed,
                             "item_id": str(item), "category": "coin", "success": ok,
                             "score": ok, "run_id": f"{setting}-{method}-{seed}"})  # fmt: skip
    return pd.DataFrame(rows)


def test_comparisons_skip_a_row_left_out_at_a_setting_and_the_gain_table_orders_horizons() -> None:
    mr = _module()
    items = _items({("coin3 T6", "grpo"): 0.0, ("coin3 T6", "factor-mc"): 0.3,
                    ("coin11 T24", "grpo"): 0.0})  # fmt: skip
    comp = mr.comparisons(items, mr.cell_table(items), (("factor-mc", "grpo"),))
    assert comp["setting"].tolist() == ["coin3 T6"]  # not at eleven rooms: no row, no error
    assert comp["delta"].iloc[0] > 0.15 and comp["wins"].iloc[0] == 3
    items = _items({(s, m): d for s in ("coin11 T24", "coin3 T6", "coin6 T12")
                    for m, d in (("grpo", 0.0), ("factor", 0.2))})  # fmt: skip
    comp = mr.comparisons(items, mr.cell_table(items), (("factor", "grpo"),))
    table = mr.gain_table(comp)
    assert list(table.columns) == ["comparison", "coin3 T6", "coin6 T12", "coin11 T24"]
    cell = table.loc[0, "coin6 T12"]
    row = comp[comp["setting"] == "coin6 T12"].iloc[0]
    pp = [f"{100 * row[k]:+.1f}" for k in ("delta", "ci_low", "ci_high")]
    assert cell == f"{pp[0]} [{pp[1]}, {pp[2]}]"


def test_bucket_gain_is_the_subjects_success_minus_the_baselines_per_length_bucket() -> None:
    import pandas as pd

    mr = _module()
    horizon = pd.DataFrame([
        {"setting": "coin6 T12", "method": "grpo", "bucket": "1-3", "success": 0.9},
        {"setting": "coin6 T12", "method": "grpo", "bucket": "10-12", "success": 0.1},
        {"setting": "coin6 T12", "method": "factor", "bucket": "1-3", "success": 0.8},
        {"setting": "coin6 T12", "method": "factor", "bucket": "10-12", "success": 0.3},
        {"setting": "coin6 T12", "method": "factor", "bucket": "4-6", "success": 0.5},
    ])  # fmt: skip
    table = mr.bucket_gain_table(horizon, (("factor", "grpo"), ("vineppo", "grpo")))
    assert list(table.columns) == ["setting", "comparison", "1-3", "4-6", "10-12"]
    assert table.to_dict("records") == [{"setting": "coin6 T12", "comparison": "factor - grpo",
                                         "1-3": "-10.0", "4-6": "-", "10-12": "+20.0"}]  # fmt: skip


def _diagnostics(folder: Path, tables: dict[str, list[dict]]) -> None:
    import pandas as pd

    (folder / "diagnostics").mkdir(parents=True)
    for name, rows in tables.items():
        pd.DataFrame(rows).to_csv(folder / "diagnostics" / f"{name}.csv", index=False)


def test_beside_paper_sets_each_study_beside_the_papers_figure(tmp_path: Path) -> None:
    """Each paper figure gets the first replication's and this study's value per setting; the
    first replication's value is against training targets (it has no independent reference)
    and says so; what a study did not measure says "not measured"."""
    mr = _module()

    def est(setting: str, late_agree: int) -> list[dict]:  # 4 late actions, late_agree agree
        return [{"method": "factor", "setting": setting, "run_id": "r", "step": 9, "traj": t,
                 "phase": "late", "credit": 1.0, "mc": 1.0 if t < late_agree else -1.0}
                for t in range(4)]  # fmt: skip

    coef = [{"method": "factor", "setting": "coin3 T6", "median": 3e-8},
            {"method": "serl-repro", "setting": "coin3 T6", "median": 0.05}]  # fmt: skip
    first, second = tmp_path / "mini", tmp_path / "mini2"
    _diagnostics(first, {"td-sign-estimates": est("coin3 T6", 2),
                         "value": [{"method": "factor", "setting": "coin3 T6", "mse": 0.2,
                                    "pearson": 0.26}], "coef-deviation": coef})  # fmt: skip
    value_mc = [{"method": "factor", "setting": s, "phase": ph, "metric": m, "value": v}
                for s in ("coin3 T6", "coin11 T24") for ph, v in (("early", 0.1), ("late", 0.5))
                for m in ("pearson", "sign_accuracy", "mse", "spread", "bias")]  # fmt: skip
    feedback = [{"method": "factor", "setting": "coin3 T6", "condition": c, "top_mass": m,
                 "uniform_top_mass": 0.3} for c, m in (("true", 0.4), ("shuffled", 0.35),
                                                       ("none", 0.3))]  # fmt: skip
    _diagnostics(second, {
        "td-sign-estimates": est("coin11 T24", 3) + est("coin3 T6", 4), "value-mc": value_mc,
        "coef-deviation": coef, "feedback": feedback,
    })  # fmt: skip
    table = mr.beside_paper(second, first).set_index(["diagnostic", "method"])
    late = table.loc[("TD credit's sign agreement, late", "factor")]
    assert late["paper"] == "0.892 (Fig. 5B)"
    assert late["first replication"] == "0.50 (coin3 T6)"
    assert late["this one"] == "1.00 (coin3 T6); 0.75 (coin11 T24)"  # horizon order
    early = table.loc[("TD credit's sign agreement, early", "factor")]
    assert early["this one"] == "not measured"  # no early actions
    r = table.loc[("value: Pearson r, late", "factor")]
    assert r["first replication"] == "0.26 vs targets (coin3 T6)"
    assert r["this one"] == "0.50 (coin3 T6); 0.50 (coin11 T24)"
    serl = table.loc[("coefficient deviation, median", "serl-repro")]
    assert serl["first replication"] == serl["this one"] == "0.05 (coin3 T6)"
    shuffled = table.loc[("shuffled feedback: concentration true / shuffled / none", "factor")]
    assert shuffled["this one"] == "0.400 / 0.350 / 0.300 (uniform 0.300) (coin3 T6)"
    assert shuffled["first replication"] == "not measured"
    assert len(table) == len(mr.PAPER)
