"""`factor stats` end to end through typer's CliRunner on small files written to tmp_path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from factor_cli.cli.stats import app
from factor_cli.stats import AGGREGATES, TABLES, hierarchical_bootstrap, macro_success

runner = CliRunner()
SEEDS = (42, 43, 1337)
CATS = {"pick": 6, "look": 4, "heat": 5}


def make_results(path: Path, rng_seed: int = 0) -> pd.DataFrame:
    """Two methods x 3 seeds on 'alfworld' (3 categories) and 'webshop' (one category)."""
    rng = np.random.default_rng(rng_seed)
    items = [("alfworld", f"a{c}{k}", c) for c, n in CATS.items() for k in range(n)]
    items += [("webshop", f"w{k:02d}", "all") for k in range(12)]
    rows = []
    for seed in SEEDS:
        ease = rng.random(len(items))
        for method, p in (("FACTOR", 0.75), ("SERL", 0.6)):
            success = ease < p + rng.normal(scale=0.1, size=len(items))
            for (env, item, cat), s in zip(items, success, strict=True):
                score = 100.0 if s else float(rng.integers(0, 90))
                rows.append((env, method, seed, item, cat, int(s), score))
    df = pd.DataFrame(
        rows, columns=["env", "method", "seed", "item_id", "category", "success", "score"]
    )
    df.to_csv(path, index=False)
    return df


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    path = tmp_path_factory.mktemp("stats") / "results.csv"
    return path, make_results(path)


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return res.exit_code, res.stdout, res.stderr


def one_line_error(code: int, err: str) -> str:
    assert code == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_json_matches_library(data: tuple[Path, pd.DataFrame]) -> None:
    path, df = data
    code, out, err = invoke(
        "bootstrap",
        "-i",
        str(path),
        "--env",
        "alfworld",
        "--method",
        "FACTOR",
        "--baseline",
        "SERL",
        "--replicates",
        "3000",
        "--seed",
        "5",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    assert {"point", "ci_low", "ci_high", "p_positive", "replicates", "per_seed"} <= set(got)
    # per-seed differences recomputed independently from the raw frame (macro metric, in pp)
    for seed in SEEDS:
        rows = df[(df["env"] == "alfworld") & (df["seed"] == seed)].sort_values("item_id")
        a = rows[rows["method"] == "FACTOR"]
        b = rows[rows["method"] == "SERL"]
        want = 100 * (
            macro_success(a["success"], a["category"]) - macro_success(b["success"], b["category"])
        )
        assert got["per_seed"][str(seed)] == pytest.approx(want, abs=1e-9)
    assert got["point"] == pytest.approx(np.mean(list(got["per_seed"].values())))
    assert got["replicates"] == 3000
    assert got["ci_low"] <= got["point"] <= got["ci_high"]
    # same generator seed -> the same numbers as the library call
    rows = df[df["env"] == "alfworld"].sort_values("item_id")
    diffs, strata = [], []
    for seed in SEEDS:
        r = rows[rows["seed"] == seed]
        diffs.append(
            r[r["method"] == "FACTOR"]["success"].to_numpy(float)
            - r[r["method"] == "SERL"]["success"].to_numpy(float)
        )
        strata.append(r[r["method"] == "FACTOR"]["category"].to_numpy())
    lib = hierarchical_bootstrap(diffs, strata, 3000, np.random.default_rng(5))
    assert got["ci_low"] == pytest.approx(100 * lib.ci_low)
    assert got["p_positive"] == pytest.approx(lib.p_positive)


def test_bootstrap_rich_output(data: tuple[Path, pd.DataFrame]) -> None:
    path, _ = data
    code, out, err = invoke(
        "bootstrap", "-i", str(path), "-e", "webshop", "-m", "FACTOR", "-b", "SERL", "-r", "500"
    )
    assert code == 0, err
    assert "95% CI (pp)" in out and "P(Δ > 0)" in out and "1337" in out


# ----------------------------------------------------------------------------- tests


def with_discordant_pairs(df: pd.DataFrame, env: str, seed: int) -> pd.DataFrame:
    """A copy where, on (env, seed), FACTOR wins two items and loses one (W, L >= 1 for sure)."""
    out = df.copy()
    items = sorted(out.loc[out["env"] == env, "item_id"].unique())[:3]
    for item, factor in zip(items, (1, 1, 0), strict=True):
        for method, s in (("FACTOR", factor), ("SERL", 1 - factor)):
            row = (out["env"] == env) & (out["seed"] == seed) & (out["item_id"] == item)
            row &= out["method"] == method
            out.loc[row, ["success", "score"]] = [s, 100.0 * s]
    return out


def test_item_tests_json_against_scipy(data: tuple[Path, pd.DataFrame], tmp_path: Path) -> None:
    _, base = data
    df = with_discordant_pairs(base, "webshop", 43)
    path = tmp_path / "results.csv"
    df.to_csv(path, index=False)
    code, out, err = invoke(
        "tests",
        "-i",
        str(path),
        "-e",
        "webshop",
        "-m",
        "FACTOR",
        "-b",
        "SERL",
        "--seed",
        "43",
        "--json",
    )
    assert code == 0, err
    got = json.loads(out)
    rows = df[(df["env"] == "webshop") & (df["seed"] == 43)].sort_values("item_id")
    a, b = rows[rows["method"] == "FACTOR"], rows[rows["method"] == "SERL"]
    sa, sb = a["success"].to_numpy(), b["success"].to_numpy()
    wins, losses = int(((sa == 1) & (sb == 0)).sum()), int(((sa == 0) & (sb == 1)).sum())
    assert wins >= 2 and losses >= 1  # guaranteed by with_discordant_pairs
    assert (got["wins"], got["losses"]) == (wins, losses)
    assert got["mcnemar_exact_p"] == pytest.approx(sps.binomtest(wins, wins + losses).pvalue)
    assert got["mcnemar_chi2"] == pytest.approx((abs(wins - losses) - 1) ** 2 / (wins + losses))
    xa, xb = a["score"].to_numpy(), b["score"].to_numpy()
    want = sps.wilcoxon(
        xa,
        xb,
        method="exact" if len(set(np.abs(xa - xb)[xa != xb])) == np.sum(xa != xb) else "asymptotic",
        correction=False,
    )
    assert got["wilcoxon_stat"] == pytest.approx(want.statistic)
    assert got["wilcoxon_p"] == pytest.approx(want.pvalue)
    # one category: the stratified test is the uncorrected McNemar test
    assert got["stratified_chi2"] == pytest.approx((wins - losses) ** 2 / (wins + losses))
    for key in ("mcnemar_p", "stratified_p", "stratified_exact_p"):
        assert 0.0 <= got[key] <= 1.0


def test_item_tests_rich_output_and_success_wilcoxon(data: tuple[Path, pd.DataFrame]) -> None:
    path, _ = data
    code, out, err = invoke(
        "tests",
        "-i",
        str(path),
        "-e",
        "alfworld",
        "-m",
        "FACTOR",
        "-b",
        "SERL",
        "-s",
        "42",
        "--wilcoxon-on",
        "success",
    )
    assert code == 0, err
    assert "stratified McNemar (macro)" in out and "pick" in out and "Wilcoxon" in out


# ----------------------------------------------------------------------------- aggregate


def test_aggregate_json(data: tuple[Path, pd.DataFrame]) -> None:
    path, df = data
    code, out, err = invoke(
        "aggregate", "-i", str(path), "--baseline", "SERL", "-r", "500", "--json"
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["tasks"] == ["alfworld", "webshop"]
    factor = got["methods"]["FACTOR"]
    assert factor["runs"] == 3
    scores = []
    for seed in SEEDS:
        for env in ("alfworld", "webshop"):
            r = df[(df["method"] == "FACTOR") & (df["seed"] == seed) & (df["env"] == env)]
            scores.append(100 * macro_success(r["success"], r["category"]))
    assert factor["mean"]["point"] == pytest.approx(np.mean(scores))
    assert factor["median"]["point"] == pytest.approx(np.median(scores))
    assert factor["iqm"]["point"] == pytest.approx(sps.trim_mean(scores, 0.25))
    poi = factor["probability_of_improvement"]
    assert poi["low"] <= poi["point"] <= poi["high"]
    assert "probability_of_improvement" not in got["methods"]["SERL"]


def test_aggregate_by_category(data: tuple[Path, pd.DataFrame]) -> None:
    path, _ = data
    code, out, err = invoke(
        "aggregate", "-i", str(path), "--tasks", "category", "-m", "FACTOR", "-r", "200"
    )
    assert code == 0, err
    assert "4 task(s) (category)" in out


# ----------------------------------------------------------------------------- table


# format -> what its output must hold besides the method names
FORMAT_MARKS = {
    "rich": ["Main results", "alfworld (%)", "±"],
    "csv": ["Method,pick,look,heat,alfworld (%),alfworld (%) std,webshop (%),webshop (%) std\n"],
    "markdown": ["| Method | pick | look | heat | alfworld (%) | webshop (%) |", " ± "],
    "latex": [r"\toprule", r"$\pm$", r"\end{tabular}"],
}


@pytest.mark.parametrize("fmt", FORMAT_MARKS)
def test_table_main_formats(data: tuple[Path, pd.DataFrame], fmt: str) -> None:
    path, _ = data
    code, out, err = invoke("table", "main", "-i", str(path), "--format", fmt)
    assert code == 0, err
    assert "FACTOR" in out and "SERL" in out
    for mark in FORMAT_MARKS[fmt]:
        assert mark in out, (fmt, mark)


def test_table_main_csv_header_is_the_first_line(data: tuple[Path, pd.DataFrame]) -> None:
    path, _ = data
    code, out, err = invoke("table", "main", "-i", str(path), "--format", "csv")
    assert code == 0, err
    assert out.splitlines()[0] == (
        "Method,pick,look,heat,alfworld (%),alfworld (%) std,webshop (%),webshop (%) std"
    )


def test_table_ablation_to_file(data: tuple[Path, pd.DataFrame], tmp_path: Path) -> None:
    path, _ = data
    out_file = tmp_path / "t" / "ablation.md"
    code, _, err = invoke(
        "table",
        "ablation",
        "-i",
        str(path),
        "--reference",
        "FACTOR",
        "--format",
        "markdown",
        "--output",
        str(out_file),
    )
    assert code == 0, err
    text = out_file.read_text()
    assert "| **FACTOR** |" in text and "ΔWebshop" not in text and "Δwebshop" in text


def test_table_protocol_and_budget(tmp_path: Path) -> None:
    base = make_results(tmp_path / "r.csv")
    both = pd.concat([base.assign(reduction="token-mean"), base.assign(reduction="action-mean")])
    both.to_csv(tmp_path / "p.csv", index=False)
    code, out, err = invoke("table", "protocol", "-i", str(tmp_path / "p.csv"), "-f", "csv")
    assert code == 0, err
    assert out.splitlines()[1].startswith("token-mean,FACTOR,")
    budget = base.assign(
        budget=np.where(base["method"] == "FACTOR", "2x4", ""),
        wall_clock=np.where(base["method"] == "FACTOR", 1.25, 1.0),
    )
    budget.to_csv(tmp_path / "b.csv", index=False)
    code, out, err = invoke(
        "table", "budget", "-i", str(tmp_path / "b.csv"), "-m", "FACTOR", "-b", "SERL", "-f", "csv"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "B×M,Wall-clock (×),Gain alfworld (pp),Gain webshop (pp)"
    assert lines[1].startswith("2x4,1.25,")


# ----------------------------------------------------------------------------- plots


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


def test_plots_write_png(data: tuple[Path, pd.DataFrame], tmp_path: Path) -> None:
    path, _ = data
    metrics = tmp_path / "metrics.csv"
    rows = [
        (m, s, step, 0.1 * step / 10 + 0.01 * s % 3)
        for m in ("FACTOR", "SERL")
        for s in SEEDS
        for step in range(0, 50, 10)
    ]
    pd.DataFrame(rows, columns=["method", "seed", "step", "reward"]).to_csv(metrics, index=False)
    runs = {
        "curves.png": ("plot", "curves", "--metrics", str(metrics), "--smooth", "2"),
        "ablation.png": ("plot", "ablation", "-i", str(path), "--reference", "SERL"),
        "boot.png": (
            "plot",
            "bootstrap",
            "-i",
            str(path),
            "-e",
            "alfworld",
            "-m",
            "FACTOR",
            "-b",
            "SERL",
            "-r",
            "500",
        ),
        "profile.png": ("plot", "profile", "-i", str(path), "-r", "100"),
    }
    for name, args in runs.items():
        code, _, err = invoke(*args, "-o", str(tmp_path / name))
        assert code == 0, (name, err)
        assert _is_png(tmp_path / name), name


# ----------------------------------------------------------------------------- bad input


def write(df: pd.DataFrame, path: Path) -> str:
    df.to_csv(path, index=False)
    return str(path)


def test_bad_inputs_give_one_line_errors(data: tuple[Path, pd.DataFrame], tmp_path: Path) -> None:
    path, df = data
    common = ["-m", "FACTOR", "-b", "SERL"]
    cases = {
        "missing column": (
            [
                "bootstrap",
                "-i",
                write(df.drop(columns=["category"]), tmp_path / "a.csv"),
                "-e",
                "alfworld",
                *common,
            ],
            ["a.csv", "missing column 'category'"],
        ),
        "unknown env": (
            ["bootstrap", "-i", str(path), "-e", "webshp", *common],
            ["results.csv", "env 'webshp' not found", "alfworld, webshop"],
        ),
        "unknown method": (
            ["tests", "-i", str(path), "-e", "alfworld", "-m", "GRPO", "-b", "SERL", "-s", "42"],
            ["method 'GRPO' not found in env 'alfworld'", "FACTOR, SERL"],
        ),
        "unpaired items": (
            [
                "bootstrap",
                "-i",
                write(df.drop(index=[3]), tmp_path / "b.csv"),
                "-e",
                "alfworld",
                *common,
            ],
            ["b.csv", "items are not paired between 'FACTOR' and 'SERL'", "seed 42"],
        ),
        "non-binary success": (
            [
                "bootstrap",
                "-i",
                write(df.assign(success=df["score"]), tmp_path / "c.csv"),
                "-e",
                "alfworld",
                *common,
            ],
            ["c.csv", "column 'success' must be binary", "100.0"],
        ),
        "missing file": (
            ["table", "main", "-i", str(tmp_path / "none.csv")],
            ["no such file", "none.csv"],
        ),
        "bad kind": (["table", "best", "-i", str(path)], ["table kind 'best'", "main, ablation"]),
        "ablation without reference": (["table", "ablation", "-i", str(path)], ["--reference"]),
        "study column missing": (
            ["table", "transfer", "-i", str(path)],
            ["results.csv", "study column 'backbone'", "--group-column"],
        ),
        "bad replicates": (
            ["bootstrap", "-i", str(path), "-e", "alfworld", *common, "-r", "0"],
            ["--replicates must be at least 1"],
        ),
        "bad where": (
            ["bootstrap", "-i", str(path), "-e", "alfworld", *common, "--where", "seed=7"],
            ["filter 'seed=7' matches no row"],
        ),
        "seed not evaluated": (
            ["tests", "-i", str(path), "-e", "alfworld", *common, "-s", "7"],
            ["seed 7 has no results for 'FACTOR'"],
        ),
        "bad plot suffix": (
            ["plot", "ablation", "-i", str(path), "--reference", "SERL", "-o", "x.jpg"],
            ["ending in .png"],
        ),
        "bad tasks": (["aggregate", "-i", str(path), "--tasks", "items"], ["--tasks 'items'"]),
        "metric missing": (
            [
                "plot",
                "curves",
                "--metrics",
                str(path),
                "--metric",
                "reward",
                "-o",
                str(tmp_path / "c.png"),
            ],
            ["missing column 'step'"],
        ),
    }
    for name, (args, needles) in cases.items():
        code, _, err = invoke(*args)
        line = one_line_error(code, err)
        for needle in needles:
            assert needle in line, (name, line)


def test_every_command_has_help() -> None:
    for args in (
        ["--help"],
        ["bootstrap", "--help"],
        ["tests", "--help"],
        ["table", "--help"],
        ["aggregate", "--help"],
        ["plot", "--help"],
        ["plot", "curves", "--help"],
        ["plot", "ablation", "--help"],
        ["plot", "bootstrap", "--help"],
        ["plot", "profile", "--help"],
    ):
        code, out, err = invoke(*args)
        assert code == 0, (args, err)
        assert "Usage" in out
    code, out, _ = invoke("bootstrap", "--help")
    assert "resamples the training seeds" in out


# ----------------------------------------------------------------------------- files and seeds

EMPTY_AND_LATIN1 = {
    "empty": (b"", "line 1: the file is empty (no header line); write the header"),
    "blank": (b"\n\n", "line 1: the file is empty (no header line); write the header"),
    "latin-1": (  # 48 bytes of header line, then 24 before the Latin-1 e-acute 0xe9
        b"env,method,seed,item_id,category,success,score\nalfworld,FACTOR,42,a1,caf\xe9,1,1\n",
        "line 2 (byte offset 72) is not valid UTF-8 (byte 0xe9); re-save the file as UTF-8",
    ),
}


@pytest.mark.parametrize("case", EMPTY_AND_LATIN1)
def test_empty_or_non_utf8_input_is_one_line_naming_file_and_line(
    tmp_path: Path, case: str
) -> None:
    data, needle = EMPTY_AND_LATIN1[case]
    bad = tmp_path / "bad.csv"
    bad.write_bytes(data)
    for args in (
        ["bootstrap", "-i", str(bad), "-e", "alfworld", "-m", "FACTOR", "-b", "SERL"],
        ["tests", "-i", str(bad), "-e", "alfworld", "-m", "FACTOR", "-b", "SERL", "-s", "42"],
        ["aggregate", "-i", str(bad)],
        ["table", "main", "-i", str(bad)],
        ["plot", "curves", "--metrics", str(bad), "-o", str(tmp_path / "c.png")],
    ):
        code, _, err = invoke(*args)
        line = one_line_error(code, err)
        assert line.startswith(f"error: {bad}: {needle}"), (args, line)


def test_single_seed_bootstrap_warns_on_stderr(data: tuple[Path, pd.DataFrame]) -> None:
    path, _ = data
    args = ["-i", str(path), "-e", "webshop", "-m", "FACTOR", "-b", "SERL", "-r", "200"]
    code, out, err = invoke("bootstrap", *args, "--where", "seed=43", "--json")
    assert code == 0, err
    assert json.loads(out)["per_seed"].keys() == {"43"}  # stdout stays one JSON object
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("warning: only one training seed (43) of 'FACTOR' and 'SERL'")
    assert "ignores seed-to-seed variance" in line
    code, _, err = invoke("bootstrap", *args)  # three seeds: no warning
    assert (code, err) == (0, "")


# ----------------------------------------------------------------------------- registries

# kind -> (extra study columns of the file, options, exact CSV header)
TABLE_CLI = {
    "main": (
        {},
        ["--category-env", "none"],
        "Method,alfworld (%),alfworld (%) std,webshop (%),webshop (%) std",
    ),
    "ablation": (
        {},
        ["--reference", "SERL"],
        "Method,alfworld (%),alfworld (%) std,webshop (%),webshop (%) std,Δalfworld,Δwebshop",
    ),
    "protocol": (
        {"reduction": "action-mean"},
        [],
        "Reduction,Method,alfworld (%),alfworld (%) std,webshop (%),webshop (%) std",
    ),
    "budget": (
        {"budget": "2x4"},
        ["-m", "FACTOR", "-b", "SERL"],
        "B×M,Gain alfworld (pp),Gain webshop (pp)",
    ),
    "transfer": (
        {"backbone": "qwen2.5-7b"},
        [],
        "Backbone,Method,alfworld (%),alfworld (%) std,webshop (%),webshop (%) std",
    ),
}


@pytest.mark.parametrize("kind", TABLES.names())
def test_every_table_kind_from_the_cli(
    data: tuple[Path, pd.DataFrame], tmp_path: Path, kind: str
) -> None:
    _, df = data
    columns, options, header = TABLE_CLI[kind]
    path = tmp_path / f"{kind}.csv"
    df.assign(**columns).to_csv(path, index=False)
    code, out, err = invoke("table", kind, "-i", str(path), *options, "-f", "csv")
    assert code == 0, err
    assert out.splitlines()[0] == header


def test_aggregate_json_has_every_aggregate(data: tuple[Path, pd.DataFrame]) -> None:
    path, _ = data
    code, out, err = invoke("aggregate", "-i", str(path), "-r", "50", "--json")
    assert code == 0, err
    for entry in json.loads(out)["methods"].values():
        assert list(entry) == ["runs", *AGGREGATES.names()]


def _help_text(*args: str) -> str:
    code, out, err = invoke(*args, "--help")
    assert code == 0, (args, err)
    return " ".join(out.replace("│", " ").split())  # rich's box and line wrapping removed


def test_help_names_every_table_kind_and_aggregate() -> None:
    table_help = _help_text("table")
    for kind in TABLES.names():
        assert f"{kind} (Table " in table_help
    aggregate_help = _help_text("aggregate").lower()
    for name in AGGREGATES.names():
        assert name.replace("_", " ") in aggregate_help


def test_cli_module_imports_no_numeric_library() -> None:
    """`factor --help` stays fast: numpy, pandas, scipy and matplotlib load inside commands."""
    code = (
        "import json, sys, factor_cli.cli.stats\n"
        "heavy = ('numpy', 'pandas', 'scipy', 'matplotlib')\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_paths_with_markup_characters_reach_the_user_unchanged(tmp_path: Path) -> None:
    odd = tmp_path / "[bold]" / "[" / "bad].csv"  # .../[bold]/[/bad].csv: rich markup if parsed
    odd.parent.mkdir(parents=True)
    odd.write_bytes(b"")
    code, _, err = invoke("table", "main", "-i", str(odd))
    assert one_line_error(code, err).startswith(f"error: {odd}: line 1: the file is empty")


def test_a_relative_path_named_in_the_fix_still_leads_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The iconv hint names the file; the message must still start by saying which file."""
    data, needle = EMPTY_AND_LATIN1["latin-1"]
    (tmp_path / "bad.csv").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("bootstrap", "-i", "bad.csv", "-e", "alfworld", "-m", "FACTOR", "-b", "S")
    assert one_line_error(code, err).startswith(f"error: bad.csv: {needle}")
