"""``factor study report`` on a real ledger: tables, Δ / DiD, bootstrap, wins, missing, costs.

One SQLite ledger (tmp) holds the runs of five small studies of the smoke base on twx, written
through the ledger API as ``factor train`` writes them (tags cell_key, reduction, temperature,
budget; metrics root_interactions / continuation_interactions; items/eval_items.csv), then the
compute tags are set to round numbers. No training. Every item file has two categories a, b of
two items each, so a run's macro metric M = (rate_a + rate_b) / 2 is chosen by hand: the
expected table cells, deltas, DiD and win counts below are computed by hand from those choices.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

from factor_cli.cli.study_report import render
from factor_cli.ledger import start_run
from factor_cli.ledger.store import open_client
from factor_cli.stats.tables import Table, cell_text
from factor_cli.studies.matrix import Cell, Matrix, Options, expand
from factor_cli.studies.report import MARKER, ReportError, StudyReport, build_report, write_report
from factor_cli.studies.results import StudyResults, gather
from factor_cli.studies.spec import load_spec
from factor_cli.studies.state import T_CELL, matrix_states

# M of a run -> (successes of category a, of category b); four items, macro = mean of the rates.
M = {
    0.25: ([1, 0], [0, 0]),
    0.5: ([1, 1], [0, 0]),
    0.75: ([1, 1], [1, 0]),
    1.0: ([1, 1], [1, 1]),
}
COMMIT_A, COMMIT_B, COMMIT_C = "a" * 40, "b" * 40, "c" * 40
HALF_HOUR = 1800.0

SPECS = {
    "rmain": """\
        name: rmain
        base: smoke
        envs: [twx]
        seeds: [42, 43, 1337]
        rows: [{name: grpo}, {name: serl-repro}, {name: factor}]
        summary: {table: main, reference: serl-repro, subject: factor}
    """,
    "rproto": """\
        name: rproto
        base: smoke
        envs: [twx]
        seeds: [42, 43]
        rows: [{name: serl-repro}, {name: factor}]
        axes: {reduction: [token-mean, action-mean], rollout.temperature: [0.5, 1.0]}
        summary: {table: protocol, reference: serl-repro, subject: factor, group_column: reduction}
    """,
    "rbudget": """\
        name: rbudget
        base: smoke
        envs: [twx]
        seeds: [42]
        rows: [{name: factor}, {name: serl-repro, crossed: false}]
        axes: {continuations.budget: [1, 2], continuations.per_checkpoint: [1, 2]}
        axes_mode: zip
        summary: {table: budget, reference: serl-repro, subject: factor, group_column: budget}
    """,
    "rsens": """\
        name: rsens
        base: smoke
        envs: [twx]
        seeds: [42]
        rows: [{name: factor}]
        axes: {credit.eta_0: [0.3, 0.7], credit.tau: [0.5, 1.0]}
        axes_mode: each
        summary: {table: ablation, reference: factor, subject: factor, by: row}
    """,
    "rempty": """\
        name: rempty
        base: smoke
        envs: [twx]
        seeds: [42]
        rows: [{name: factor}]
    """,
}
# The main study's cells read as an ablation against FACTOR and as a (one-backbone) transfer.
VARIANTS = {
    "rmain-ablation": ("rmain", "summary: {table: ablation, reference: factor, subject: factor}"),
    "rmain-transfer": ("rmain", "summary: {table: transfer, reference: serl-repro}"),
    "rmain-no-subject": ("rmain", "summary: {table: main, reference: serl-repro, subject: grpo}"),
    "rmain-no-reference": ("rmain", "summary: {table: ablation, reference: grpo}"),
}


@dataclass
class Ledger:
    uri: str
    root: Path
    matrices: dict[str, Matrix]


def items_of(m: float) -> pd.DataFrame:
    a, b = M[m]
    return pd.DataFrame({
        "item_id": ["a1", "a2", "b1", "b2"], "category": ["a", "a", "b", "b"],
        "success": a + b, "score": [float(s) for s in a + b],
    })  # fmt: skip


def record(
    cell: Cell, uri: str, m: float | None = None, *, status: str = "FINISHED",
    steps: tuple[tuple[float, float], ...] = ((10.0, 5.0), (10.0, 5.0)),
    wall: float = HALF_HOUR, commit: str = COMMIT_A, resume: str | None = None,
) -> str:  # fmt: skip
    """One ledger run of ``cell`` as ``factor train`` writes it; returns its run id."""
    cfg = cell.config
    tags = {
        T_CELL: cell.key, "reduction": cfg.reduction, "temperature": cfg.rollout.temperature,
        "budget": f"{cfg.continuations.budget}x{cfg.continuations.per_checkpoint}",
    }  # fmt: skip
    run = start_run(
        cfg, study=cfg.study, method=cfg.method, env=cfg.env.name, seed=cfg.seed,
        backbone=Path(cfg.model.path).name, tracking_uri=uri, cpu_cores=2, tags=tags,
        resume_run_id=resume,
    )  # fmt: skip
    for k, (root, cont) in enumerate(steps, 1):
        run.log_metrics({"root_interactions": root, "continuation_interactions": cont}, k)
    if m is not None:
        run.log_items(items_of(m))
    run.end(status, RuntimeError("boom") if status == "FAILED" else None)
    client = open_client(uri, create=False)  # round compute numbers, set after the close
    for key, value in {
        "ledger.wall_clock_seconds": wall, "ledger.gpu_seconds": 8 * wall,
        "ledger.cpu_core_seconds": 2 * wall, "git_commit": commit,
    }.items():  # fmt: skip
        client.set_tag(run.run_id, key, str(value))
    return run.run_id


def by_label(matrix: Matrix) -> dict[str, Cell]:
    return {c.label: c for c in matrix.cells}


def write_main(cells: dict[str, Cell], uri: str) -> None:
    """factor 75/50/100, serl-repro 25/50/75 (seeds 42/43/1337); grpo failed/killed/pending."""
    for seed, m in zip((42, 43), (0.75, 0.5), strict=True):
        record(cells[f"factor/twx/{seed}"], uri, m)
    for seed, m in zip((42, 43, 1337), (0.25, 0.5, 0.75), strict=True):
        record(cells[f"serl-repro/twx/{seed}"], uri, m, commit=COMMIT_B)
    killed = record(cells["factor/twx/1337"], uri, status="KILLED")  # resumed once, finished
    record(cells["factor/twx/1337"], uri, 1.0, resume=killed)
    open_client(uri, create=False).set_tag(killed, "session.2.git_commit", COMMIT_C)
    record(cells["grpo/twx/42"], uri, status="FAILED", steps=())
    record(cells["grpo/twx/43"], uri, status="KILLED")


PROTOCOL_M = {  # (method, reduction, temperature) -> M at seeds 42, 43
    ("serl-repro", "token-mean", 0.5): (0.25, 0.5), ("factor", "token-mean", 0.5): (0.5, 0.5),
    ("serl-repro", "action-mean", 0.5): (0.5, 0.5), ("factor", "action-mean", 0.5): (1.0, 0.75),
    ("serl-repro", "token-mean", 1.0): (0.5, 0.5), ("factor", "token-mean", 1.0): (0.5, 0.5),
    ("serl-repro", "action-mean", 1.0): (0.25, 0.25), ("factor", "action-mean", 1.0): (0.75, 0.75),
}  # fmt: skip


def write_protocol(matrix: Matrix, uri: str) -> None:
    for cell in matrix.cells:
        cfg = cell.config
        m = PROTOCOL_M[(cfg.method, cfg.reduction, cfg.rollout.temperature)]
        record(cell, uri, m[(42, 43).index(cfg.seed)])


def write_budget(cells: dict[str, Cell], uri: str) -> None:
    """serl 50 (100 interactions, 1 h); factor 1x1 75 (150, 1.25 h), 2x2 100 (300, 1.5 h)."""
    prefix = "factor[continuations.budget={},continuations.per_checkpoint={}]/twx/42"
    record(cells["serl-repro/twx/42"], uri, 0.5, steps=((50, 0), (50, 0)), wall=3600)
    record(cells[prefix.format(1, 1)], uri, 0.75, steps=((50, 20), (50, 30)), wall=4500)
    # Step 2 logged twice (a resumed session repeating it): its latest value counts.
    cell = cells[prefix.format(2, 2)]
    run_id = record(cell, uri, 1.0, steps=((50, 100), (50, 999)), wall=5400)
    time.sleep(0.05)
    open_client(uri, create=False).log_metric(run_id, "continuation_interactions", 100, step=2)


def write_sensitivity(cells: dict[str, Cell], uri: str) -> None:
    """eta_0 0.3 -> 50, the shared default (eta_0 0.7 = tau 1.0) -> 75, tau 0.5 -> 100."""
    record(cells["factor[credit.eta_0=0.3]/twx/42"], uri, 0.5)
    record(cells["factor[credit.eta_0=0.7]/twx/42"], uri, 0.75)
    record(cells["factor[credit.tau=0.5]/twx/42"], uri, 1.0)


def spec_file(root: Path, name: str) -> Path:
    if name in VARIANTS:
        base, summary = VARIANTS[name]
        text = textwrap.dedent(SPECS[base]).rsplit("summary:", 1)[0] + summary + "\n"
    else:
        text = textwrap.dedent(SPECS[name])
    path = root / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    root = tmp_path_factory.mktemp("study-report")
    uri = f"sqlite:///{root}/mlflow.db"
    options = Options(overrides=[f"tracking_uri={uri}", f"output_dir={root}/runs"])
    matrices = {}
    for name in [*SPECS, *VARIANTS]:
        spec, path = load_spec(str(spec_file(root, name)))
        matrices[name] = expand(spec, path, options)
    write_main(by_label(matrices["rmain"]), uri)
    write_protocol(matrices["rproto"], uri)
    write_budget(by_label(matrices["rbudget"]), uri)
    write_sensitivity(by_label(matrices["rsens"]), uri)
    record(matrices["rempty"].cells[0], uri, status="FAILED")
    return Ledger(uri, root, matrices)


@pytest.fixture(scope="module")
def results(ledger: Ledger) -> dict[str, StudyResults]:
    return {n: gather(m, matrix_states(m)) for n, m in ledger.matrices.items()}


@pytest.fixture(scope="module")
def reports(ledger: Ledger, results: dict[str, StudyResults]) -> dict[str, StudyReport]:
    return {
        n: build_report(m, results[n], seed=0, resamples=500) for n, m in ledger.matrices.items()
    }


def texts(table: Table) -> list[list[str]]:
    return [[cell_text(c, table.decimals) for c in row] for row in table.rows]


def column(table: Table, name: str) -> list[str]:
    j = table.columns.index(name)
    return [cell_text(row[j], table.decimals) for row in table.rows]


# ----------------------------------------------------------------------------- results


def test_items_hold_every_finished_cell_in_the_stats_schema(results: dict) -> None:
    items = results["rmain"].items
    head = ["env", "method", "seed", "item_id", "category", "success", "score"]
    assert list(items.columns[:7]) == head
    extra = ["run_id", "cell_key", "row", "variant", "reduction", "temperature", "budget"]
    assert {*extra, "backbone"} <= set(items.columns)
    assert len(items) == 6 * 4  # six finished cells x four items
    assert set(items["backbone"]) == {"tiny-1m"} and set(items["budget"]) == {"2x2"}
    proto = results["rproto"].items
    assert {"reduction", "rollout.temperature"} <= set(proto.columns)
    assert set(proto["rollout.temperature"]) == {"0.5", "1.0"}


def test_a_shared_default_cell_has_one_copy_of_its_items_per_variant(results: dict) -> None:
    items = results["rsens"].items
    per_variant = items.groupby("variant")["cell_key"].agg(["nunique", "size"])
    assert per_variant.loc["factor[credit.eta_0=0.7]"].tolist() == [1, 4]
    assert per_variant.loc["factor[credit.tau=1.0]"].tolist() == [1, 4]
    shared = items.loc[items["variant"] == "factor[credit.tau=1.0]", "cell_key"].iloc[0]
    assert items.loc[items["cell_key"] == shared, "variant"].nunique() == 2
    # the axis columns hold each variant's config value, defaults included
    tau = items.loc[items["variant"] == "factor[credit.eta_0=0.3]", "credit.tau"]
    assert set(tau) == {"1.0"}


def test_runs_list_every_cell_and_variant_with_state_and_costs(results: dict) -> None:
    runs = results["rmain"].runs.set_index("label")
    assert len(runs) == 9
    assert runs.loc["grpo/twx/42", "state"] == "failed"
    assert "boom" in runs.loc["grpo/twx/42", "reason"]
    assert runs.loc["grpo/twx/43", "state"] == "killed"
    assert runs.loc["grpo/twx/1337", ["state", "run_id", "sessions"]].tolist() == ["pending", "", 0]
    assert runs.loc["factor/twx/42", "interactions"] == 30.0  # (10 + 5) x 2 steps
    assert math.isnan(runs.loc["grpo/twx/42", "interactions"])  # it logged no step
    assert runs.loc["factor/twx/1337", "sessions"] == 2
    assert runs.loc["factor/twx/42", "node_hours"] == pytest.approx(0.5)
    assert runs.loc["factor/twx/42", "wall_clock"] == pytest.approx(0.5)
    sens = results["rsens"].runs
    assert len(sens) == 4 and sens["cell_key"].nunique() == 3  # the default serves two variants


def test_missing_lists_the_unfinished_cells_with_their_state(results: dict) -> None:
    missing = [(m.label, m.state) for m in results["rmain"].missing]
    assert missing == [("grpo/twx/42", "failed"), ("grpo/twx/43", "killed"),
                       ("grpo/twx/1337", "pending")]  # fmt: skip


# ----------------------------------------------------------------------------- tables


def test_main_table_is_mean_and_std_over_seeds(reports: dict) -> None:
    table = reports["rmain"].tables["table"]
    assert table.columns == ("Method", "twx (%)")
    # factor 75/50/100 -> 75.0 ± 25.0; serl-repro 25/50/75 -> 50.0 ± 25.0; grpo has no result
    assert texts(table) == [["serl-repro", "50.0 ± 25.0"], ["factor", "75.0 ± 25.0"]]
    assert table.rows[1][1].bold and not table.rows[0][1].bold


def test_bootstrap_and_seed_wins_of_subject_vs_reference(reports: dict) -> None:
    report = reports["rmain"]
    (c,) = report.comparisons
    assert (c.subject, c.reference, c.env, c.seeds) == ("factor", "serl-repro", "twx",
                                                        (42, 43, 1337))  # fmt: skip
    assert c.per_seed == pytest.approx((50.0, 0.0, 25.0))
    assert (c.wins, c.ties, c.losses) == (2, 1, 0)
    res = c.bootstrap.result
    assert 100 * res.point == pytest.approx(25.0) and c.delta == pytest.approx(25.0)
    assert 100 * res.ci_low <= 25.0 <= 100 * res.ci_high and 0.5 < res.p_positive <= 1.0
    assert "factor beats serl-repro in 2 of 3 (env, seed) pairs (1 ties, 0 losses)" in report.lines
    boot = reports["rmain"].tables["bootstrap"]
    assert column(boot, "Δ (pp)") == ["+25.0"] and column(boot, "Wins") == ["2"]


def test_ablation_has_delta_columns_against_the_reference(reports: dict) -> None:
    report = reports["rmain-ablation"]
    table = report.tables["table"]
    assert table.columns == ("Method", "twx (%)", "Δtwx")
    assert texts(table) == [["serl-repro", "50.0 ± 25.0", "-25.0"], ["factor", "75.0 ± 25.0", "—"]]
    assert all(c.bold for c in table.rows[1][:2])
    (c,) = report.comparisons  # subject = reference: every other row against it
    assert (c.subject, c.reference, c.wins, c.ties, c.losses) == ("serl-repro", "factor", 0, 1, 2)
    assert report.deltas.to_dict("records") == [{"method": "serl-repro", "env": "twx",
                                                 "delta": pytest.approx(-25.0)}]  # fmt: skip


def test_protocol_table_groups_by_reduction_with_the_temperature_as_context(reports) -> None:
    table = reports["rproto"].tables["table"]
    assert table.columns == ("Reduction", "Method", "twx (%)")
    got = [(r[0], r[1], r[2].split(" ")[0]) for r in texts(table)]
    t5, t1 = "rollout.temperature=0.5", "rollout.temperature=1.0"
    assert got == [
        (f"token-mean, {t5}", "serl-repro", "37.5"), (f"token-mean, {t5}", "factor", "50.0"),
        (f"token-mean, {t1}", "serl-repro", "50.0"), (f"token-mean, {t1}", "factor", "50.0"),
        (f"action-mean, {t5}", "serl-repro", "50.0"), (f"action-mean, {t5}", "factor", "87.5"),
        (f"action-mean, {t1}", "serl-repro", "25.0"), (f"action-mean, {t1}", "factor", "75.0"),
    ]  # fmt: skip


def test_protocol_difference_in_differences(reports: dict) -> None:
    did = reports["rproto"].tables["did"]
    assert did.columns == ("Context", "Env", "Δ token-mean (pp)", "Δ action-mean (pp)",
                           "DiD action-mean − token-mean")  # fmt: skip
    # T=0.5: (87.5 - 50) - (50 - 37.5) = 37.5 - 12.5 = 25; T=1.0: (75 - 25) - (50 - 50) = 50
    assert texts(did) == [
        ["rollout.temperature=0.5", "twx", "+12.5", "+37.5", "+25.0"],
        ["rollout.temperature=1.0", "twx", "+0.0", "+50.0", "+50.0"],
    ]
    wins = {c.context: (c.wins, c.ties, c.losses) for c in reports["rproto"].comparisons}
    assert wins == {
        "token-mean, rollout.temperature=0.5": (1, 1, 0),
        "token-mean, rollout.temperature=1.0": (0, 2, 0),
        "action-mean, rollout.temperature=0.5": (2, 0, 0),
        "action-mean, rollout.temperature=1.0": (2, 0, 0),
    }


def test_budget_table_has_cost_ratios_and_gains(reports: dict, results: dict) -> None:
    runs = results["rbudget"].runs.set_index("variant")
    # 50x2 + (100 + 100): the repeated step 2 counts once, at its latest value
    assert runs.loc["factor[continuations.budget=2,continuations.per_checkpoint=2]",
                    "interactions"] == 300.0  # fmt: skip
    table = reports["rbudget"].tables["table"]
    assert table.columns == ("B×M", "Interact. (×)", "Wall-clock (×)", "Gain (pp)")
    # 150/100, 1.25/1 h, 75 - 50; 300/100, 1.5/1 h, 100 - 50 (smoke's 2x2 is the default)
    assert texts(table) == [["1x1", "1.50", "1.25", "+25.0"],
                            ["2x2 (default)", "3.00", "1.50", "+50.0"]]  # fmt: skip
    deltas = reports["rbudget"].deltas
    assert dict(zip(deltas["method"], deltas["delta"], strict=True)) == {"1x1": 25.0, "2x2": 50.0}
    assert [c.context for c in reports["rbudget"].comparisons] == ["1x1", "2x2"]


def test_sensitivity_rows_are_variants_against_the_shared_default(reports: dict) -> None:
    report = reports["rsens"]
    table = report.tables["table"]
    assert texts(table) == [
        ["factor[credit.eta_0=0.3]", "50.0", "-25.0"],
        ["factor[credit.eta_0=0.7]", "75.0", "+0.0"],
        ["factor[credit.tau=0.5]", "100.0", "+25.0"],
        ["factor[credit.tau=1.0]", "75.0", "+0.0"],
        ["factor", "75.0", "—"],
    ]
    got = {(c.subject, c.wins, c.losses) for c in report.comparisons}  # defaults: same runs
    assert got == {("factor[credit.eta_0=0.3]", 0, 1), ("factor[credit.tau=0.5]", 1, 0)}


def test_an_unfinished_subject_or_reference_is_a_note_not_a_comparison(reports: dict) -> None:
    no_subject = reports["rmain-no-subject"]
    assert no_subject.comparisons == () and "bootstrap" not in no_subject.tables
    assert "the subject 'grpo' has no finished cell: no bootstrap or wins" in no_subject.notes
    no_reference = reports["rmain-no-reference"]
    assert no_reference.comparisons == () and no_reference.deltas is None
    assert any("the reference 'grpo' has no finished cell" in n for n in no_reference.notes)
    # the ablation table falls back to the main layout (no Δ columns without a reference)
    assert no_reference.tables["table"].columns == ("Method", "twx (%)")


def test_transfer_groups_by_backbone(reports: dict) -> None:
    table = reports["rmain-transfer"].tables["table"]
    assert table.columns[:2] == ("Backbone", "Method")
    assert [r[:2] for r in texts(table)] == [["tiny-1m", "serl-repro"], ["tiny-1m", "factor"]]


def test_cost_table_counts_states_hours_resumes_and_commits(reports: dict) -> None:
    costs = reports["rmain"].tables["costs"]
    assert costs.columns == ("Row", "Cells", "Finished", "Failed", "Killed", "Running",
                             "Pending", "Node-hours", "Core-hours", "Wall-clock h", "Resumes",
                             "Commits")  # fmt: skip
    assert texts(costs) == [
        ["grpo", "3", "0", "1", "1", "0", "1", "1.000", "2.000", "1.000", "0", "1"],
        ["serl-repro", "3", "3", "0", "0", "0", "0", "1.500", "3.000", "1.500", "0", "1"],
        ["factor", "3", "3", "0", "0", "0", "0", "1.500", "3.000", "1.500", "1", "2"],
        ["total", "9", "6", "1", "1", "0", "1", "4.000", "8.000", "4.000", "1", "3"],
    ]
    spec_hash = reports["rmain"].spec_hash
    assert spec_hash[:16] in costs.caption and COMMIT_C[:12] in costs.caption
    sens = reports["rsens"].tables["costs"]
    assert column(sens, "Cells")[-1] == "3"  # the shared default counted once in the total


def test_missing_table_names_the_cells(reports: dict) -> None:
    missing = reports["rmain"].tables["missing"]
    assert [r[:2] for r in texts(missing)] == [["grpo/twx/42", "failed"],
                                               ["grpo/twx/43", "killed"],
                                               ["grpo/twx/1337", "pending"]]  # fmt: skip
    assert "boom" in texts(missing)[0][2]


def test_no_finished_cell_gives_the_missing_cells_and_costs_only(reports: dict) -> None:
    report = reports["rempty"]
    assert list(report.tables) == ["missing", "costs"] and report.finished == 0
    assert any("no cell of study rempty has finished" in n for n in report.notes)
    assert column(report.tables["costs"], "Failed")[-1] == "1"


def test_bad_resamples_and_group_column_are_one_line_errors(ledger: Ledger, results) -> None:
    with pytest.raises(ReportError, match="--resamples must be at least 1"):
        build_report(ledger.matrices["rmain"], results["rmain"], resamples=0)
    matrix = ledger.matrices["rproto"]
    summary = matrix.spec.summary.model_copy(update={"group_column": "x"})
    matrix = dataclasses.replace(matrix, spec=matrix.spec.model_copy(update={"summary": summary}))
    with pytest.raises(ReportError, match=r"summary\.group_column 'x' is not a column"):
        build_report(matrix, results["rproto"])


# ----------------------------------------------------------------------------- files, render


def test_write_report_writes_markdown_csv_and_png(reports: dict, tmp_path: Path) -> None:
    out = tmp_path / "reports" / "rmain"
    paths = write_report(reports["rmain"], out)
    names = sorted(p.name for p in paths)
    assert names == ["bootstrap-twx.png", "bootstrap.csv", "costs.csv", "missing.csv",
                     "report.md", "table.csv"]  # fmt: skip
    assert all(p.stat().st_size > 0 for p in paths)
    assert (out / "bootstrap-twx.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "report.md").read_text()
    assert "grpo/twx/1337 | pending" in md and "factor beats serl-repro in 2 of 3" in md
    assert pd.read_csv(out / "table.csv")["twx (%)"].tolist() == [50.0, 75.0]
    # a second report replaces the folder whole: the old bootstrap plot is gone
    paths = write_report(reports["rempty"], out)
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == sorted(
        p.name for p in paths
    )
    assert not (out / "bootstrap-twx.png").exists()
    assert [p.name for p in tmp_path.joinpath("reports").iterdir()] == ["rmain"]  # no leftovers


def test_write_report_plots_deltas_and_refuses_a_foreign_folder(reports, tmp_path: Path) -> None:
    paths = write_report(reports["rsens"], tmp_path / "sens")
    assert (tmp_path / "sens" / "deltas.png") in paths
    names = {p.name for p in write_report(reports["rbudget"], tmp_path / "budget")}
    assert {"deltas.png", "bootstrap-twx-1x1.png", "bootstrap-twx-2x2.png"} <= names
    assert any("one training seed" in n for n in reports["rbudget"].notes)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ReportError, match="is not a study report folder"):
        write_report(reports["rmain"], foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("name", ["rmain", "rsens", "rproto", "rempty"])
def test_render_prints_every_table_as_literal_text(reports: dict, name: str) -> None:
    console = Console(record=True, width=250)
    render(reports[name], console)
    out = console.export_text()
    report: Any = reports[name]
    for table in report.tables.values():
        assert table.title in out
    if name == "rsens":
        assert "factor[credit.eta_0=0.3]" in out  # brackets are not read as markup
    if name == "rmain":
        assert "factor beats serl-repro in 2 of 3" in out and "grpo/twx/1337" in out
