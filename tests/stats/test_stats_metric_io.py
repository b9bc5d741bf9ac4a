"""The macro metric on hand-computable runs, and validation of results files (one-line errors)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factor_cli.stats import (
    filter_rows,
    macro_success,
    macro_weights,
    paired_runs,
    read_frame,
    read_results,
    run_metrics,
    score_matrix,
    validate_metrics,
    validate_results,
)
from factor_cli.stats.metric import category_rates


def frame(rows: list[tuple]) -> pd.DataFrame:
    cols = ["env", "method", "seed", "item_id", "category", "success", "score"]
    return pd.DataFrame(rows, columns=cols)


# ----------------------------------------------------------------------------- metric


def test_macro_success_hand_example() -> None:
    # category a: 2/3 solved, b: 0/1, c: 1/2 -> (2/3 + 0 + 1/2) / 3 = 7/18
    success = [1, 1, 0, 0, 1, 0]
    category = ["a", "a", "a", "b", "c", "c"]
    assert macro_success(success, category) == pytest.approx(7 / 18, abs=1e-15)


def test_macro_success_single_category_is_plain_mean() -> None:
    s = [1, 0, 1, 1, 0]
    assert macro_success(s, ["all"] * 5) == pytest.approx(0.6, abs=1e-15)


def test_macro_differs_from_micro_when_categories_are_unbalanced() -> None:
    # micro mean 4/5 = 0.8; macro (1 + 0) / 2 = 0.5
    assert macro_success([1, 1, 1, 1, 0], ["a", "a", "a", "a", "b"]) == pytest.approx(0.5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4)), min_size=1, max_size=40))
def test_macro_weights_sum_to_one_and_match_loop(pairs: list[tuple[int, int]]) -> None:
    success = np.array([p[0] for p in pairs])
    category = np.array([p[1] for p in pairs])
    codes = pd.factorize(pd.Series(category))[0]
    w = macro_weights(codes)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    cats = sorted(set(category.tolist()))
    loop = sum(success[category == c].mean() for c in cats) / len(cats)
    assert macro_success(success, category) == pytest.approx(loop, abs=1e-12)


def test_run_metrics_and_category_rates() -> None:
    df = frame(
        [
            ("alf", "A", 1, "i1", "x", 1, 1.0),
            ("alf", "A", 1, "i2", "x", 0, 0.0),
            ("alf", "A", 1, "i3", "y", 1, 1.0),
            ("alf", "A", 2, "i1", "x", 1, 1.0),
            ("alf", "A", 2, "i2", "x", 1, 1.0),
            ("alf", "A", 2, "i3", "y", 0, 0.0),
        ]
    )
    runs = run_metrics(validate_results(df))
    assert runs["metric"].tolist() == pytest.approx([0.75, 0.5])
    assert runs["n_items"].tolist() == [3, 3]
    assert runs["n_categories"].tolist() == [2, 2]
    rates = category_rates(validate_results(df))
    assert rates["rate"].tolist() == pytest.approx([0.5, 1.0, 1.0, 0.0])


def test_score_matrix_pivot_and_hole() -> None:
    long = pd.DataFrame(
        {
            "seed": [1, 1, 2, 2],
            "task": ["a", "b", "a", "b"],
            "v": [0.1, 0.2, 0.3, 0.4],
        }
    )
    x, runs = score_matrix(long, "v", "task", ["b", "a"])
    np.testing.assert_array_equal(x, [[0.2, 0.1], [0.4, 0.3]])
    assert runs == [1, 2]
    with pytest.raises(ValueError, match="seed 2 has no result for task 'b'"):
        score_matrix(long.iloc[:3], "v", "task", ["a", "b"])
    with pytest.raises(ValueError, match="no results for task 'c'"):
        score_matrix(long, "v", "task", ["a", "c"])


# ----------------------------------------------------------------------------- validation

GOOD = [
    ("alf", "A", 1, "i1", "x", 1, 1.0),
    ("alf", "B", 1, "i1", "x", 0, 0.0),
    ("alf", "A", 1, "i2", "y", 0, 0.0),
    ("alf", "B", 1, "i2", "y", 1, 1.0),
]


def test_validate_normalises_types() -> None:
    df = frame(GOOD)
    df["success"] = [True, False, "false", "1"]
    df["seed"] = [1.0, 1.0, 1.0, 1.0]
    out = validate_results(df)
    assert out["success"].tolist() == [1, 0, 0, 1]
    assert out["seed"].dtype == np.int64


@pytest.mark.parametrize(
    ("column", "value", "pattern"),
    [
        ("success", 0.5, r"column 'success' must be binary .* data row 2 has 0\.5"),
        ("success", np.nan, r"column 'success' must be binary .* data row 2"),
        ("success", "maybe", r"column 'success' must be binary .* 'maybe'"),
        ("seed", "abc", r"column 'seed' must hold integers; data row 2 has 'abc'"),
        ("seed", 1.5, r"column 'seed' must hold integers; data row 2 has 1\.5"),
        ("score", "x", r"column 'score' must hold finite numbers; data row 2 has 'x'"),
        ("category", None, r"column 'category' is empty in data row 2"),
        ("item_id", " ", r"column 'item_id' is empty in data row 2"),
    ],
)
def test_validate_rejects_bad_values(column: str, value: object, pattern: str) -> None:
    df = frame(GOOD).astype({column: object})
    df.loc[1, column] = value
    with pytest.raises(ValueError, match=pattern):
        validate_results(df)


@pytest.mark.parametrize(
    "column", ["env", "method", "seed", "item_id", "category", "success", "score"]
)
def test_validate_names_a_missing_column(column: str) -> None:
    with pytest.raises(ValueError, match=f"missing column '{column}'"):
        validate_results(frame(GOOD).drop(columns=[column]))


def test_validate_rejects_duplicates_unless_study_column_is_a_run_key() -> None:
    df = pd.concat([frame(GOOD).assign(reduction="tm"), frame(GOOD).assign(reduction="am")])
    with pytest.raises(
        ValueError, match="duplicate rows for env=alf, method=A, seed=1, item_id=i1"
    ):
        validate_results(df)
    assert len(validate_results(df, run_keys=("reduction",))) == 8
    assert len(validate_results(filter_rows(df, ["reduction=am"]))) == 4


def test_filter_rows_errors() -> None:
    df = frame(GOOD)
    with pytest.raises(ValueError, match="must look like COLUMN=VALUE"):
        filter_rows(df, ["seed"])
    with pytest.raises(ValueError, match="names column 'nope'"):
        filter_rows(df, ["nope=1"])
    with pytest.raises(ValueError, match="matches no row; values of 'seed': 1"):
        filter_rows(df, ["seed=2"])
    assert len(filter_rows(df, ["seed=1", "method=A"])) == 2


def test_empty_file_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no rows"):
        validate_results(frame([]))
    bad = tmp_path / "r.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"unsupported file type '\.json'"):
        read_frame(bad)
    with pytest.raises(ValueError, match="no such file"):
        read_frame(tmp_path / "missing.csv")


HEADER = "env,method,seed,item_id,category,success,score"
EMPTY_FILES = {
    "zero bytes": ("r.csv", b""),
    "blank lines": ("r.csv", b"\n  \n"),
    "empty gzip": ("r.csv.gz", gzip.compress(b"")),
    "empty tsv": ("r.tsv", b"\n"),
}


@pytest.mark.parametrize("case", EMPTY_FILES)
def test_empty_text_file_names_line_1_and_the_header(tmp_path: Path, case: str) -> None:
    name, data = EMPTY_FILES[case]
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError) as err:
        read_frame(tmp_path / name)
    message = str(err.value)
    assert message.startswith("line 1: the file is empty (no header line)")
    assert f"write the header {HEADER} on line 1" in message
    assert "\n" not in message


def test_empty_parquet_and_metrics_header(tmp_path: Path) -> None:
    (tmp_path / "r.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="the file is empty \\(0 bytes\\); write a Parquet table"):
        read_frame(tmp_path / "r.parquet")
    (tmp_path / "m.csv").write_bytes(b"")
    with pytest.raises(ValueError, match="write the header method,seed,step,reward on line 1"):
        read_frame(tmp_path / "m.csv", header=("method", "seed", "step", "reward"))


@pytest.mark.parametrize("compress", [False, True])
def test_non_utf8_names_the_line_and_byte_offset(tmp_path: Path, compress: bool) -> None:
    lines = [HEADER, "alf,A,1,i1,x,1,1.0", "alf,A,1,i2,caf\xe9,0,0.0", "alf,A,1,i3,x,1,1.0"]
    data = "\n".join(lines).encode("latin-1")  # the e-acute is one byte 0xe9, invalid UTF-8
    offset = data.index(b"\xe9")
    name = "r.csv.gz" if compress else "r.csv"
    (tmp_path / name).write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(ValueError) as err:
        read_frame(tmp_path / name)
    assert str(err.value) == (
        f"line 3 (byte offset {offset}) is not valid UTF-8 (byte 0xe9); re-save the file as "
        f"UTF-8, e.g. iconv -f latin1 -t utf-8 {name} > fixed.csv"
    )


def test_utf8_text_with_bom_and_accents_reads(tmp_path: Path) -> None:
    text = HEADER + "\nalf,A,1,i1,café,1,1.0\n"
    (tmp_path / "r.csv").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    got = read_frame(tmp_path / "r.csv")
    assert list(got.columns) == HEADER.split(",")
    assert got["category"].tolist() == ["café"]


def test_broken_gzip_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "r.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match=r"not a readable gzip file .*compress it again with gzip"):
        read_frame(tmp_path / "r.csv.gz")


def test_csv_and_parquet_round_trip_keep_ids_as_text(tmp_path: Path) -> None:
    df = frame(GOOD)
    df["item_id"] = ["007", "007", "010", "010"]
    df.to_csv(tmp_path / "r.csv", index=False)
    df.to_parquet(tmp_path / "r.parquet", index=False)
    a = read_results(tmp_path / "r.csv")
    b = read_results(tmp_path / "r.parquet")
    assert a["item_id"].tolist() == ["007", "007", "010", "010"]
    pd.testing.assert_frame_equal(a, b)


# ----------------------------------------------------------------------------- pairing


def test_paired_runs_aligns_items() -> None:
    rows = [*GOOD[::-1]]  # order in the file must not matter
    (run,) = paired_runs(validate_results(frame(rows)), "alf", "A", "B")
    assert run.item_id.tolist() == ["i1", "i2"]
    assert run.diff.tolist() == [1.0, -1.0]
    assert run.category.tolist() == ["x", "y"]


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("web", "A", "B"), r"env 'web' not found; present: alf"),
        (("alf", "C", "B"), r"method 'C' not found in env 'alf'; present: A, B"),
        (("alf", "A", "A"), r"method and baseline are both 'A'"),
    ],
)
def test_paired_runs_names_missing_values(args: tuple[str, str, str], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        paired_runs(validate_results(frame(GOOD)), *args)


def test_paired_runs_rejects_unpaired_items_seeds_and_categories() -> None:
    unpaired = validate_results(frame([*GOOD, ("alf", "A", 1, "i3", "y", 1, 1.0)]))
    with pytest.raises(
        ValueError, match=r"not paired .* 1 item_id\(s\) only in 'A', 0 only in 'B' \(e.g. 'i3'\)"
    ):
        paired_runs(unpaired, "alf", "A", "B")
    extra_seed = validate_results(frame([*GOOD, ("alf", "A", 2, "i1", "x", 1, 1.0)]))
    with pytest.raises(ValueError, match="seed 2 has results for 'A' but not for 'B'"):
        paired_runs(extra_seed, "alf", "A", "B")
    clash = frame(GOOD)
    clash.loc[1, "category"] = "z"
    with pytest.raises(ValueError, match=r"item 'i1' .* category 'x' for 'A' but 'z' for 'B'"):
        paired_runs(validate_results(clash), "alf", "A", "B")
    with pytest.raises(ValueError, match="seed 5 has no results for 'A'"):
        paired_runs(validate_results(frame(GOOD)), "alf", "A", "B", seeds=[5])


def test_validate_metrics() -> None:
    df = pd.DataFrame({"method": ["A", "A"], "seed": [1, 1], "step": [0, 10], "r": [0.1, None]})
    out = validate_metrics(df, "r")
    assert len(out) == 1
    with pytest.raises(ValueError, match="missing column 'loss'"):
        validate_metrics(df, "loss")
