"""Reading and validating item-level result files and training-metric files.

Results schema: one row per evaluation item of a run, columns at least

    env       str    environment (e.g. alfworld, webshop, scienceworld)
    method    str    method name (e.g. FACTOR, SERL-Repro)
    seed      int    training seed of the run
    item_id   str    evaluation item; the same ids across methods of one (env, seed) pair them
    category  str    stratum of the macro metric (ALFWorld task type, ScienceWorld type x level,
                     one value for WebShop)
    success   0/1    binary success (true/false accepted)
    score     float  raw score (e.g. WebShop 0-100); used by the Wilcoxon test

Study columns (``reduction``, ``backbone``, ``budget``, ...) may follow; when one of them is part
of a run's identity it is passed as an extra run key. Every check raises ``ValueError`` with a
one-line message naming the column or value and what to do about it.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REQUIRED_COLUMNS: tuple[str, ...] = (
    "env",
    "method",
    "seed",
    "item_id",
    "category",
    "success",
    "score",
)
TEXT_COLUMNS: tuple[str, ...] = ("env", "method", "item_id", "category")
METRICS_COLUMNS: tuple[str, ...] = ("method", "seed", "step")
_CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_TRUE = {"1", "1.0", "true", "t", "yes"}
_FALSE = {"0", "0.0", "false", "f", "no"}


def read_frame(
    path: str | Path,
    text_columns: Sequence[str] = TEXT_COLUMNS,
    header: Sequence[str] = REQUIRED_COLUMNS,
) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``, ``.tsv``) or Parquet (``.parquet``, ``.pq``) file.

    ``text_columns`` are read as strings so that ids such as ``007`` keep their zeros. An empty
    file, or CSV text that is not UTF-8, fails naming the line (and byte offset) and the fix;
    ``header`` is the header line such a message suggests.
    """
    p = Path(path)
    name = p.name.lower()
    if not p.is_file():
        raise ValueError(f"no such file: {p}")
    if not name.endswith(_CSV_SUFFIXES + _PARQUET_SUFFIXES):
        raise ValueError(
            f"unsupported file type {p.suffix!r}; use one of "
            f"{', '.join(_CSV_SUFFIXES + _PARQUET_SUFFIXES)}"
        )
    if p.stat().st_size == 0 and name.endswith(_PARQUET_SUFFIXES):
        raise ValueError(
            f"the file is empty (0 bytes); write a Parquet table with the columns "
            f"{', '.join(header)} there"
        )
    try:
        if name.endswith(_PARQUET_SUFFIXES):
            frame = pd.read_parquet(p)
        else:
            text = _csv_text(p, header)
            sep = "\t" if name.endswith(".tsv") else ","
            frame = pd.read_csv(io.StringIO(text), sep=sep, dtype={c: str for c in text_columns})
    except _ReadError as exc:
        raise ValueError(str(exc)) from None
    except Exception as exc:  # parser errors of pandas / pyarrow: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"cannot read the file: {first}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    return frame


class _ReadError(Exception):
    """A problem :func:`read_frame` has already phrased for the user (not a parser error)."""


def _empty_message(header: Sequence[str]) -> str:
    return (
        f"line 1: the file is empty (no header line); write the header {','.join(header)} "
        "on line 1 and one data row per line below it"
    )


def _csv_text(path: Path, header: Sequence[str]) -> str:
    """The file's text, decompressed (``.gz``) and decoded as strict UTF-8.

    Decoding here, not inside pandas, is what lets an error name the file's own line and byte
    offset: pandas decodes in chunks and reports positions relative to the chunk.
    """
    raw = path.read_bytes()
    if path.name.lower().endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise _ReadError(
                f"not a readable gzip file ({exc}); compress it again with gzip"
            ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        bad = raw[exc.start : exc.start + 1].hex()
        raise _ReadError(
            f"line {line} (byte offset {exc.start}) is not valid UTF-8 (byte 0x{bad}); re-save "
            f"the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path.name} > fixed.csv"
        ) from None
    if not text.strip():
        raise _ReadError(_empty_message(header))
    return text


def _first_bad(mask: np.ndarray | pd.Series) -> int:
    return int(np.flatnonzero(np.asarray(mask))[0])


def shown(value: object) -> str:
    """A value as it should appear in an error message (numpy scalars as plain Python)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _text(frame: pd.DataFrame, column: str, hint: str) -> pd.Series:
    col = frame[column]
    empty = col.isna() | (col.astype(str).str.strip() == "")
    if empty.any():
        row = _first_bad(empty)
        raise ValueError(f"column {column!r} is empty in data row {row + 1}; {hint}")
    return col.astype(str).str.strip()


def _integers(frame: pd.DataFrame, column: str) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() | (values != np.round(values))
    if bad.any():
        row = _first_bad(bad)
        raise ValueError(
            f"column {column!r} must hold integers; data row {row + 1} has "
            f"{shown(frame[column].iloc[row])}"
        )
    return values.astype(np.int64)


def _binary(frame: pd.DataFrame, column: str) -> pd.Series:
    raw = frame[column]
    if raw.dtype == bool:
        return raw.astype(np.int8)
    numeric = pd.to_numeric(raw, errors="coerce")
    if raw.dtype == object:
        text = raw.astype(str).str.strip().str.lower()
        mapped = pd.Series(np.nan, index=raw.index)
        mapped[text.isin(_TRUE)] = 1.0
        mapped[text.isin(_FALSE)] = 0.0
        numeric = mapped.where(raw.notna())
    bad = ~numeric.isin([0.0, 1.0])
    if bad.any():
        row = _first_bad(bad)
        raise ValueError(
            f"column {column!r} must be binary (0/1 or true/false); data row {row + 1} has "
            f"{shown(raw.iloc[row])}; store the success indicator there (e.g. WebShop: "
            f"score == 100) and the raw value in 'score'"
        )
    return numeric.astype(np.int8)


def _numbers(frame: pd.DataFrame, column: str) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = ~np.isfinite(values.to_numpy(dtype=np.float64))
    if bad.any():
        row = _first_bad(bad)
        raise ValueError(
            f"column {column!r} must hold finite numbers; data row {row + 1} has "
            f"{shown(frame[column].iloc[row])}"
        )
    return values.astype(np.float64)


def validate_results(frame: pd.DataFrame, run_keys: Sequence[str] = ()) -> pd.DataFrame:
    """Check and normalise an item-level results frame (schema in the module docstring).

    Args:
        frame: the raw frame.
        run_keys: study columns that are part of a run's identity besides (env, method, seed),
            e.g. ``("reduction",)`` when one file holds both reductions of the 2x2 study.

    Returns:
        A copy with text columns as ``str``, ``seed`` int64, ``success`` int8 in {0, 1} and
        ``score`` float64; row order kept.
    """
    missing = [c for c in (*REQUIRED_COLUMNS, *run_keys) if c not in frame.columns]
    if missing:
        raise ValueError(
            f"missing column {missing[0]!r}; a results file needs the columns "
            f"{', '.join(REQUIRED_COLUMNS)}{''.join(', ' + k for k in run_keys)} "
            f"(one row per evaluation item); found: {', '.join(map(str, frame.columns))}"
        )
    if len(frame) == 0:
        raise ValueError("the results file has no rows; it needs one row per evaluation item")
    out = frame.copy()
    hints = {
        "env": "name the environment of every row",
        "method": "name the method of every row",
        "item_id": "give every evaluation item an id",
        "category": "give every item its category (one shared value for WebShop)",
    }
    for column in TEXT_COLUMNS:
        out[column] = _text(out, column, hints[column])
    out["seed"] = _integers(out, "seed")
    out["success"] = _binary(out, "success")
    out["score"] = _numbers(out, "score")
    key = ["env", "method", "seed", *run_keys, "item_id"]
    dup = out.duplicated(subset=key, keep=False)
    if dup.any():
        row = out.loc[dup].iloc[0]
        where = ", ".join(f"{k}={row[k]}" for k in key)
        raise ValueError(
            f"duplicate rows for {where} ({int(dup.sum())} duplicated rows in all); each item "
            f"must appear once per run: remove repeats, or if the file holds several studies "
            f"select one (e.g. --where reduction=action-mean) or add the study column as a run key"
        )
    return out


def read_results(path: str | Path, run_keys: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`read_frame` followed by :func:`validate_results`."""
    return validate_results(read_frame(path), run_keys)


def filter_rows(frame: pd.DataFrame, where: Sequence[str]) -> pd.DataFrame:
    """Keep the rows matching every ``COLUMN=VALUE`` condition (values compared as text)."""
    out = frame
    for cond in where:
        column, sep, value = cond.partition("=")
        column, value = column.strip(), value.strip()
        if not sep or not column:
            raise ValueError(f"filter {cond!r} must look like COLUMN=VALUE, e.g. backbone=qwen-7b")
        if column not in out.columns:
            raise ValueError(
                f"filter {cond!r} names column {column!r}, which is not in the file; columns: "
                f"{', '.join(map(str, out.columns))}"
            )
        text = out[column].astype(str).str.strip()
        # Integers read as int64 and written as 42 or 42.0 both match 42.
        keep = (text == value) | (text.str.replace(r"\.0$", "", regex=True) == value)
        if not keep.any():
            present = ", ".join(sorted(text.unique())[:10])
            raise ValueError(f"filter {cond!r} matches no row; values of {column!r}: {present}")
        out = out.loc[keep]
    return out


def require_value(frame: pd.DataFrame, column: str, value: object, context: str = "") -> None:
    """Fail unless ``value`` occurs in ``frame[column]``, listing the values present."""
    present = list(dict.fromkeys(frame[column].tolist()))
    if value not in present:
        where = f" {context}" if context else ""
        listing = ", ".join(map(str, present)) if present else "none"
        raise ValueError(f"{column} {value!r} not found{where}; present: {listing}")


@dataclass(frozen=True)
class PairedRun:
    """One seed's items evaluated under two methods A and B, aligned item by item.

    All arrays have shape [N] (N = items of that seed), sorted by ``item_id``.
    """

    seed: int
    item_id: np.ndarray
    category: np.ndarray
    success_a: np.ndarray
    success_b: np.ndarray
    score_a: np.ndarray
    score_b: np.ndarray

    @property
    def diff(self) -> np.ndarray:
        """d_i = s^A_i - s^B_i in {-1, 0, 1}, shape [N]."""
        return self.success_a.astype(np.float64) - self.success_b.astype(np.float64)


def _pair_one(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str], where: str) -> PairedRun:
    ids_a, ids_b = set(a["item_id"]), set(b["item_id"])
    only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
    if only_a or only_b:
        example = (only_a or only_b)[0]
        raise ValueError(
            f"items are not paired between {names[0]!r} and {names[1]!r} ({where}): "
            f"{len(only_a)} item_id(s) only in {names[0]!r}, {len(only_b)} only in "
            f"{names[1]!r} (e.g. {example!r}); evaluate both methods on the same items"
        )
    m = a.merge(b, on="item_id", suffixes=("_a", "_b")).sort_values("item_id", kind="stable")
    clash = m["category_a"] != m["category_b"]
    if clash.any():
        row = m.loc[clash].iloc[0]
        raise ValueError(
            f"item {row['item_id']!r} ({where}) has category {row['category_a']!r} for "
            f"{names[0]!r} but {row['category_b']!r} for {names[1]!r}; fix the category column"
        )
    return PairedRun(
        seed=int(a["seed"].iloc[0]),
        item_id=m["item_id"].to_numpy(),
        category=m["category_a"].to_numpy(),
        success_a=m["success_a"].to_numpy(dtype=np.int8),
        success_b=m["success_b"].to_numpy(dtype=np.int8),
        score_a=m["score_a"].to_numpy(dtype=np.float64),
        score_b=m["score_b"].to_numpy(dtype=np.float64),
    )


def paired_runs(
    results: pd.DataFrame,
    env: str,
    method: str,
    baseline: str,
    seeds: Sequence[int] | None = None,
) -> list[PairedRun]:
    """Pair method A = ``method`` with B = ``baseline`` on one env, seed by seed.

    Args:
        results: validated results (:func:`validate_results`).
        env, method, baseline: the comparison; method != baseline.
        seeds: keep only these seeds (default: all seeds of the env, which both methods must have).

    Returns:
        One :class:`PairedRun` per seed, ascending seed.
    """
    if method == baseline:
        raise ValueError(f"method and baseline are both {method!r}; compare two different methods")
    require_value(results, "env", env)
    rows = results.loc[results["env"] == env]
    for name in (method, baseline):
        require_value(rows, "method", name, f"in env {env!r}")
    a_all = rows.loc[rows["method"] == method]
    b_all = rows.loc[rows["method"] == baseline]
    seeds_a, seeds_b = set(a_all["seed"]), set(b_all["seed"])
    if seeds is not None:
        for s in seeds:
            for name, have in ((method, seeds_a), (baseline, seeds_b)):
                if s not in have:
                    raise ValueError(
                        f"seed {s} has no results for {name!r} in env {env!r}; seeds there: "
                        f"{', '.join(map(str, sorted(have)))}"
                    )
        wanted = sorted(set(seeds))
    else:
        odd = sorted(seeds_a ^ seeds_b)
        if odd:
            s = odd[0]
            has, lacks = (method, baseline) if s in seeds_a else (baseline, method)
            raise ValueError(
                f"seed {s} has results for {has!r} but not for {lacks!r} in env {env!r}; "
                f"evaluate both methods on the same seeds or drop seed {s}"
            )
        wanted = sorted(seeds_a)
    out = []
    for s in wanted:
        a = a_all.loc[a_all["seed"] == s, ["seed", "item_id", "category", "success", "score"]]
        b = b_all.loc[b_all["seed"] == s, ["item_id", "category", "success", "score"]]
        out.append(_pair_one(a, b, (method, baseline), f"env {env!r}, seed {s}"))
    return out


def validate_metrics(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Check a training-metrics frame: columns ``method``, ``seed``, ``step`` and ``metric``.

    Returns a copy with ``method`` str, ``seed`` and ``step`` int64 and the metric float64; rows
    whose metric is missing (steps without that metric) are dropped.
    """
    missing = [c for c in (*METRICS_COLUMNS, metric) if c not in frame.columns]
    if missing:
        raise ValueError(
            f"missing column {missing[0]!r}; a metrics file needs the columns method, seed, step "
            f"and the metric to plot; found: {', '.join(map(str, frame.columns))}"
        )
    out = frame.loc[frame[metric].notna()].copy()
    if len(out) == 0:
        raise ValueError(f"column {metric!r} has no values; pick another metric column")
    out["method"] = _text(out, "method", "name the method of every row")
    out["seed"] = _integers(out, "seed")
    out["step"] = _integers(out, "step")
    out[metric] = _numbers(out, metric)
    if "env" in out.columns:
        out["env"] = _text(out, "env", "name the environment of every row")
    return out
