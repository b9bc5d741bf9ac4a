"""The paper's result tables, built from item-level results, and their text exports.

Every table cell is a summary over training seeds of the macro metric M (``metric``), shown in
percent: mean over seeds and the sample standard deviation (ddof = 1, omitted with one seed).
Layouts (the paper's numbering):

- ``main``      (Table 1): one row per method; optional per-category columns of one env (mean
                 over seeds of the category success rate), then M per env (mean +- std).
- ``ablation``  (Table 4): M per env, then Delta_env = mean(M_method) - mean(M_reference) in
                 percentage points; the reference row is bold.
- ``protocol``  (Table 2): one row per (study group, method), e.g. reduction x method.
- ``transfer``  (Table 3): one row per (backbone, method); bold marks the best per backbone.
- ``budget``    (Table 5): one row per continuation budget B x M of one method: relative cost
                 columns when the file has them, and the gain over a baseline in pp per env.

"Best" is decided on the rounded values shown, so ties are all bold.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from factor_cli.registry import Registry

from .io import shown
from .metric import category_rates, run_metrics

KINDS: tuple[str, ...] = ("main", "ablation", "protocol", "budget", "transfer")
STYLES: tuple[str, ...] = ("plain", "markdown", "latex")
MISSING = "—"


@dataclass(frozen=True)
class Cell:
    """One table cell: a label (``text``) or a number with an optional seed std."""

    text: str | None = None
    value: float | None = None
    std: float | None = None
    signed: bool = False
    bold: bool = False
    decimals: int | None = None  # overrides the table's decimals (e.g. 2 for cost ratios)

    @property
    def numeric(self) -> bool:
        return self.text is None


@dataclass(frozen=True)
class Table:
    """A rendered-agnostic table: header, rows of cells, a title and a caption."""

    kind: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str
    decimals: int = 1


TABLES: Registry = Registry("table kind")


# --------------------------------------------------------------------------- formatting


def format_number(value: float, decimals: int, signed: bool = False) -> str:
    """``value`` with ``decimals`` decimals; ``+`` on positives when ``signed``; no ``-0.0``."""
    text = f"{value:.{decimals}f}"
    if float(text) == 0.0:
        text = f"{0.0:.{decimals}f}"
    if signed and not text.startswith("-"):
        text = "+" + text
    return text


def cell_text(cell: Cell, decimals: int, style: str = "plain") -> str:
    """The text of a cell in ``style`` (plain / markdown / latex); bold is applied here."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; valid: {', '.join(STYLES)}")
    decimals = decimals if cell.decimals is None else cell.decimals
    if cell.text is not None:
        body = latex_escape(cell.text) if style == "latex" else cell.text
    elif cell.value is None or not math.isfinite(cell.value):
        body = "--" if style == "latex" else MISSING
    else:
        body = format_number(cell.value, decimals, cell.signed)
        if cell.std is not None:
            pm = " $\\pm$ " if style == "latex" else " ± "
            body += pm + format_number(cell.std, decimals)
        if style == "latex" and body.startswith("-"):
            body = "$-$" + body[1:]
    if cell.bold and style == "markdown":
        return f"**{body}**"
    if cell.bold and style == "latex":
        return f"\\textbf{{{body}}}"
    return body


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "×": r"$\times$",
    "Δ": r"$\Delta$",
    "—": "--",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters (and render ±, ×, Δ, — in math / dashes)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_markdown(table: Table) -> str:
    """GitHub-flavoured Markdown: caption paragraph, then the table (numbers right-aligned)."""
    numeric = numeric_columns(table)
    lines = [f"{table.title}. {table.caption}".strip(), ""]
    lines.append("| " + " | ".join(table.columns) + " |")
    lines.append("| " + " | ".join("---:" if n else "---" for n in numeric) + " |")
    for row in table.rows:
        cells = (cell_text(c, table.decimals, "markdown") for c in row)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_latex(table: Table) -> str:
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    align = "".join("r" if n else "l" for n in numeric_columns(table))
    caption = latex_escape(f"{table.title}. {table.caption}".strip())
    lines = [
        "% requires \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "  \\centering",
        f"  \\caption{{{caption}}}",
        f"  \\begin{{tabular}}{{{align}}}",
        "    \\toprule",
        "    " + " & ".join(latex_escape(c) for c in table.columns) + " \\\\",
        "    \\midrule",
    ]
    for row in table.rows:
        cells = (cell_text(c, table.decimals, "latex") for c in row)
        lines.append("    " + " & ".join(cells) + " \\\\")
    lines += ["    \\bottomrule", "  \\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """CSV with one column per text/number column and a ``<column> std`` column where stds exist.

    Numbers are rounded to the table's decimals; a missing value is an empty field.
    """
    has_std = [any(r[j].std is not None for r in table.rows) for j in range(len(table.columns))]
    header: list[str] = []
    for name, std in zip(table.columns, has_std, strict=True):
        header += [name, f"{name} std"] if std else [name]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out: list[str] = []
        for cell, std in zip(row, has_std, strict=True):
            if cell.text is not None:
                out.append(cell.text)
            elif cell.value is None or not math.isfinite(cell.value):
                out.append("")
            else:
                places = table.decimals if cell.decimals is None else cell.decimals
                out.append(format_number(cell.value, places))
            if std:
                out.append("" if cell.std is None else format_number(cell.std, table.decimals))
        writer.writerow(out)
    return buf.getvalue()


def _places(cell: Cell, decimals: int) -> int:
    return decimals if cell.decimals is None else cell.decimals


def numeric_columns(table: Table) -> list[bool]:
    """Per column: True when every cell is a number (right-aligned in renderings)."""
    return [
        bool(table.rows) and all(r[j].numeric for r in table.rows)
        for j in range(len(table.columns))
    ]


# --------------------------------------------------------------------------- summaries


def _ordered(values: Sequence[object], wanted: Sequence[str] | None, what: str) -> list[str]:
    present = [str(v) for v in dict.fromkeys(values)]
    if not wanted:
        return present
    for w in wanted:
        if w not in present:
            raise ValueError(f"{what} {w!r} not found; present: {', '.join(present)}")
    return list(wanted)


def _seed_summary(runs: pd.DataFrame, by: Sequence[str], column: str = "metric") -> pd.DataFrame:
    """Mean, sample std (NaN for one seed) and seed count of ``column`` x 100 per ``by`` group."""
    grouped = runs.groupby(list(by), sort=False, dropna=False)[column]
    out = grouped.agg(mean="mean", std=lambda v: v.std(ddof=1), n="size").reset_index()
    out["mean"] *= 100.0
    out["std"] *= 100.0
    return out


def _lookup(summary: pd.DataFrame, **keys: object) -> pd.Series | None:
    mask = np.ones(len(summary), dtype=bool)
    for k, v in keys.items():
        mask &= (summary[k] == v).to_numpy()
    if not mask.any():
        return None
    return summary.loc[mask].iloc[0]


def _value_cell(row: pd.Series | None, with_std: bool = True) -> Cell:
    if row is None:
        return Cell()
    std = float(row["std"]) if with_std and np.isfinite(row["std"]) else None
    return Cell(value=float(row["mean"]), std=std)


def _bold_best(
    rows: list[list[Cell]], columns: Sequence[int], decimals: int, groups: Sequence[object]
) -> list[list[Cell]]:
    """Bold, per column and per group of rows, the largest value shown (ties all bold)."""
    out = [list(r) for r in rows]
    for j in columns:
        for g in dict.fromkeys(groups):
            members = [i for i, gi in enumerate(groups) if gi == g]
            shown = {
                i: round(rows[i][j].value, _places(rows[i][j], decimals))
                for i in members
                if rows[i][j].value is not None and rows[i][j].text is None
            }
            if not shown:
                continue
            best = max(shown.values())
            for i, v in shown.items():
                if v == best:
                    out[i][j] = replace(out[i][j], bold=True)
    return out


def _seed_note(summary: pd.DataFrame) -> str:
    counts = sorted({int(n) for n in summary["n"]})
    if counts == [1]:
        return "one seed per cell (no standard deviation)"
    label = "/".join(map(str, counts))
    return f"mean ± sample standard deviation over {label} seeds"


def _table(
    kind: str, title: str, columns: list[str], rows: list[list[Cell]], caption: str, decimals: int
) -> Table:
    return Table(kind, title, tuple(columns), tuple(tuple(r) for r in rows), caption, decimals)


# --------------------------------------------------------------------------- builders


@TABLES.register("main")
def main_table(
    results: pd.DataFrame,
    envs: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    category_env: str | None = None,
    decimals: int = 1,
) -> Table:
    """Table 1: per method, category rates of ``category_env`` and M per env (mean ± std).

    Args:
        results: validated item-level results.
        envs, methods: the environments / methods to show, in order (default: all, in order of
            first appearance).
        category_env: the environment whose categories get their own columns (None: none).
        decimals: decimals shown.
    """
    env_list = _ordered(results["env"], envs, "env")
    method_list = _ordered(results["method"], methods, "method")
    runs = run_metrics(results)
    summary = _seed_summary(runs, ["env", "method"])
    categories: list[str] = []
    cat_summary = pd.DataFrame()
    if category_env is not None:
        if category_env not in set(results["env"]):
            raise ValueError(
                f"category env {category_env!r} not found; present: {', '.join(env_list)}"
            )
        rates = category_rates(results.loc[results["env"] == category_env])
        categories = [str(c) for c in dict.fromkeys(rates["category"])]
        cat_summary = _seed_summary(rates, ["method", "category"], "rate")
    columns = ["Method", *categories, *(f"{e} (%)" for e in env_list)]
    rows: list[list[Cell]] = []
    for m in method_list:
        row = [Cell(text=m)]
        row += [_value_cell(_lookup(cat_summary, method=m, category=c), False) for c in categories]
        row += [_value_cell(_lookup(summary, env=e, method=m)) for e in env_list]
        rows.append(row)
    rows = _bold_best(rows, range(1, len(columns)), decimals, [0] * len(rows))
    cats = f"; {category_env} category columns: mean over seeds" if categories else ""
    caption = (
        f"Macro success rate (%) per environment, {_seed_note(summary)}{cats}. "
        "Bold marks the best value per column."
    )
    return _table("main", "Main results", columns, rows, caption, decimals)


@TABLES.register("ablation")
def ablation_table(
    results: pd.DataFrame,
    reference: str,
    envs: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    decimals: int = 1,
) -> Table:
    """Table 4: M per env (mean ± std) and Delta_env = mean M(method) - mean M(reference), pp."""
    env_list = _ordered(results["env"], envs, "env")
    method_list = _ordered(results["method"], methods, "method")
    if reference not in set(results["method"]):
        raise ValueError(
            f"reference method {reference!r} not found; present: {', '.join(method_list)}"
        )
    if reference not in method_list:
        method_list.append(reference)
    summary = _seed_summary(run_metrics(results), ["env", "method"])
    ref = {}
    for e in env_list:
        r = _lookup(summary, env=e, method=reference)
        if r is None:
            raise ValueError(f"reference method {reference!r} has no results for env {e!r}")
        ref[e] = float(r["mean"])
    columns = ["Method", *(f"{e} (%)" for e in env_list), *(f"Δ{e}" for e in env_list)]
    rows = []
    for m in method_list:
        cells = [_value_cell(_lookup(summary, env=e, method=m)) for e in env_list]
        if m == reference:
            deltas = [Cell() for _ in env_list]
        else:
            deltas = [
                Cell(value=c.value - ref[e], signed=True) if c.value is not None else Cell()
                for c, e in zip(cells, env_list, strict=True)
            ]
        row = [Cell(text=m), *cells, *deltas]
        if m == reference:
            row = [replace(c, bold=c.text is not None or c.value is not None) for c in row]
        rows.append(row)
    caption = (
        f"Macro success rate (%), {_seed_note(summary)}; Δ columns: difference from "
        f"{reference} in percentage points. Bold marks {reference}."
    )
    return _table("ablation", "Ablations", columns, rows, caption, decimals)


def reference_deltas(
    results: pd.DataFrame,
    reference: str,
    envs: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Delta = mean_seeds M(method) - mean_seeds M(reference) per (method, env), in pp.

    Returns:
        rows (method, env, delta) for every method other than ``reference`` that has the env.
    """
    env_list = _ordered(results["env"], envs, "env")
    method_list = _ordered(results["method"], methods, "method")
    if reference not in set(results["method"]):
        raise ValueError(
            f"reference method {reference!r} not found; present: "
            f"{', '.join(dict.fromkeys(results['method']))}"
        )
    summary = _seed_summary(run_metrics(results), ["env", "method"])
    rows = []
    for e in env_list:
        ref = _lookup(summary, env=e, method=reference)
        if ref is None:
            raise ValueError(f"reference method {reference!r} has no results for env {e!r}")
        for m in method_list:
            r = _lookup(summary, env=e, method=m)
            if m != reference and r is not None:
                rows.append({"method": m, "env": e, "delta": float(r["mean"] - ref["mean"])})
    return pd.DataFrame(rows, columns=["method", "env", "delta"])


def _group_label(column: str) -> str:
    return column.replace("_", " ").capitalize()


def _grouped_table(
    kind: str,
    title: str,
    results: pd.DataFrame,
    group: str,
    within_group: bool,
    envs: Sequence[str] | None,
    methods: Sequence[str] | None,
    decimals: int,
) -> Table:
    if group not in results.columns:
        raise ValueError(f"the {kind} table needs a {group!r} column; the file has none")
    empty = results[group].isna()
    if empty.any():
        row = int(np.flatnonzero(empty.to_numpy())[0])
        raise ValueError(
            f"column {group!r} is empty in data row {row + 1}; every run of the {kind} table "
            f"needs its {group} value"
        )
    frame = results.assign(**{group: results[group].astype(str)})
    env_list = _ordered(frame["env"], envs, "env")
    method_list = _ordered(frame["method"], methods, "method")
    summary = _seed_summary(
        run_metrics(frame, ("env", "method", "seed", group)), ["env", "method", group]
    )
    columns = [_group_label(group), "Method", *(f"{e} (%)" for e in env_list)]
    rows, groups = [], []
    for g in dict.fromkeys(frame[group]):
        for m in method_list:
            cells = [_value_cell(_lookup(summary, env=e, method=m, **{group: g})) for e in env_list]
            if all(c.value is None for c in cells):
                continue
            rows.append([Cell(text=str(g)), Cell(text=m), *cells])
            groups.append(g if within_group else 0)
    rows = _bold_best(rows, range(2, len(columns)), decimals, groups)
    where = f"within each {group}" if within_group else "per environment"
    caption = f"Macro success rate (%), {_seed_note(summary)}. Bold marks the best result {where}."
    return _table(kind, title, columns, rows, caption, decimals)


@TABLES.register("protocol")
def protocol_table(
    results: pd.DataFrame,
    group: str = "reduction",
    envs: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    decimals: int = 1,
) -> Table:
    """Table 2: one row per (``group`` value, method), M per env; bold: best per env."""
    return _grouped_table(
        "protocol",
        f"{_group_label(group)} × method",
        results,
        group,
        False,
        envs,
        methods,
        decimals,
    )


@TABLES.register("transfer")
def transfer_table(
    results: pd.DataFrame,
    group: str = "backbone",
    envs: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    decimals: int = 1,
) -> Table:
    """Table 3: one row per (backbone, method), M per env; bold: best per env within backbone."""
    return _grouped_table(
        "transfer", "Cross-backbone transfer", results, group, True, envs, methods, decimals
    )


_BUDGET = re.compile(r"^\s*(\d+)\s*[x×*]\s*(\d+)\s*$", re.IGNORECASE)


def _budget_order(labels: list[str]) -> list[str]:
    """Sort ``BxM`` labels by total continuations B*M, then B; other labels keep their order."""
    keys: dict[str, tuple[int, int, int]] = {}
    for b in labels:
        match = _BUDGET.match(b)
        if match is None:
            return labels
        n_b, n_m = int(match[1]), int(match[2])
        keys[b] = (n_b * n_m, n_b, n_m)
    return sorted(labels, key=keys.__getitem__)


def _cost_ratio(
    runs: pd.DataFrame,
    column: str,
    envs: Sequence[str],
    method: str,
    baseline: str,
    group: str,
    budget: str,
) -> float | None:
    """mean_env [ mean_seeds c(method at budget) / mean_seeds c(baseline) ]; None if undefined."""
    ratios = []
    for e in envs:
        at_env = runs.loc[runs["env"] == e]
        ours = at_env.loc[(at_env["method"] == method) & (at_env[group] == budget), column].mean()
        base = at_env.loc[at_env["method"] == baseline, column].mean()
        if np.isfinite(ours) and np.isfinite(base) and base != 0:
            ratios.append(ours / base)
    return float(np.mean(ratios)) if ratios else None


def _run_level(results: pd.DataFrame, column: str, keys: list[str]) -> pd.DataFrame:
    """One value of a run-level column per run; it must be constant within the run."""
    values = pd.to_numeric(results[column], errors="coerce")
    bad = values.isna() & results[column].notna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(
            f"column {column!r} must hold numbers; data row {row + 1} has "
            f"{shown(results[column].iloc[row])}"
        )
    frame = results[keys].assign(**{column: values})
    spread = frame.groupby(keys, sort=False, dropna=False)[column].agg(["min", "max", "count"])
    bad = spread.loc[(spread["max"] != spread["min"]) & (spread["count"] > 0)]
    if len(bad):
        run = ", ".join(f"{k}={v}" for k, v in zip(keys, bad.index[0], strict=True))
        raise ValueError(
            f"column {column!r} must be constant within a run (it is a run-level cost), but "
            f"varies for {run}"
        )
    return spread["min"].rename(column).reset_index()


@TABLES.register("budget")
def budget_table(
    results: pd.DataFrame,
    method: str,
    baseline: str,
    group: str = "budget",
    envs: Sequence[str] | None = None,
    cost_columns: Sequence[str] = ("interactions", "wall_clock"),
    default_budget: str | None = None,
    decimals: int = 1,
) -> Table:
    """Table 5: per budget of ``method``: cost ratios and gain over ``baseline`` per env (pp).

    Gain_env(b) = mean over seeds of M(method at budget b) - mean over seeds of M(baseline).
    A cost column c (``interactions``, ``wall_clock``; run-level numbers, optional) gives the
    ratio mean_seeds c(method at b) / mean_seeds c(baseline) per env, averaged over envs.
    """
    if group not in results.columns:
        raise ValueError(f"the budget table needs a {group!r} column (e.g. 2x4); the file has none")
    for name in (method, baseline):
        if name not in set(results["method"]):
            present = ", ".join(dict.fromkeys(results["method"]))
            raise ValueError(f"method {name!r} not found; present: {present}")
    ours = results.loc[results["method"] == method]
    if ours[group].isna().any():
        raise ValueError(f"rows of {method!r} need a {group!r} value (e.g. 2x4); some are empty")
    frame = results.assign(**{group: results[group].astype(str)})
    env_list = _ordered(frame["env"], envs, "env")
    keys = ["env", "method", "seed", group]
    summary = _seed_summary(run_metrics(frame, keys), ["env", "method", group])
    base = summary.loc[summary["method"] == baseline].groupby("env")["mean"].mean()
    for e in env_list:
        if e not in base.index:
            raise ValueError(f"baseline {baseline!r} has no results for env {e!r}")
    budgets = _budget_order(list(dict.fromkeys(frame.loc[frame["method"] == method, group])))
    costs = [c for c in cost_columns if c in frame.columns]
    cost_runs = {c: _run_level(frame, c, keys) for c in costs}
    cost_label = {"interactions": "Interact. (×)", "wall_clock": "Wall-clock (×)"}
    label = "B×M" if group == "budget" else _group_label(group)
    gain_cols = [f"Gain {e} (pp)" if len(env_list) > 1 else "Gain (pp)" for e in env_list]
    columns = [label, *(cost_label.get(c, f"{c} (×)") for c in costs), *gain_cols]
    rows = []
    for b in budgets:
        name = f"{b} (default)" if default_budget is not None and b == default_budget else b
        row = [Cell(text=name)]
        for c in costs:
            ratio = _cost_ratio(cost_runs[c], c, env_list, method, baseline, group, b)
            row.append(Cell(value=ratio, decimals=2))
        for e in env_list:
            r = _lookup(summary, env=e, method=method, **{group: b})
            row.append(
                Cell(value=float(r["mean"]) - float(base[e]), signed=True)
                if r is not None
                else Cell()
            )
        rows.append(row)
    first_gain = 1 + len(costs)
    rows = _bold_best(rows, range(first_gain, len(columns)), decimals, [0] * len(rows))
    seeds = "/".join(map(str, sorted({int(n) for n in summary["n"]})))
    caption = (
        f"Gain of {method} over {baseline} in macro success (pp) per continuation budget, "
        f"means over {seeds} seed(s)"
        + (f"; cost columns: ratio to {baseline}, averaged over environments" if costs else "")
        + ". Bold marks the largest gain."
    )
    return _table("budget", "Continuation budget", columns, rows, caption, decimals)
