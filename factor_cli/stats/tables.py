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

Valid-action decoding changes the task, so a results file whose runs carry the ledger's
``decoding`` tag as a column (``constrained`` or ``free``; ``factor ledger export`` adds it)
gets every layout's caption saying which rows decoded constrained (:func:`decoding_note`); one
(env, method) cell mixing constrained and free runs is refused, unless the study column itself
is ``decoding`` (``--group-column decoding`` puts them side by side).

Every layout has one signature (:class:`TableBuilder`): a :class:`TableRequest` (the validated
results and the options of every layout) in, a :class:`Table` out. :data:`TABLES` maps the kind
to its :class:`TableLayout` (builder, paper table, study column); :data:`EXPORTS` maps a text
format to its exporter.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import pandas as pd

from factor_cli.registry import Registry

from .io import shown
from .metric import category_rates, run_metrics

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


#: ``TableRequest.category_env`` value meaning: DEFAULT_CATEGORY_ENV when the results have it.
AUTO = "auto"
#: The environment whose categories the main table shows by default (the paper's Table 1).
DEFAULT_CATEGORY_ENV = "alfworld"


class TableOptionError(ValueError):
    """A table option is missing or inconsistent: the fix is an option, not the results file."""


@dataclass(frozen=True, eq=False)
class TableRequest:
    """Everything a table builder reads: the results and the options of every layout.

    A layout reads the fields its docstring names and ignores the others, so one request type
    serves every entry of :data:`TABLES`.

    Attributes:
        results: validated item-level results (``validate_results``, with the layout's study
            column among the run keys).
        envs: environments to show, in order (None: all, in order of first appearance).
        methods: methods to show, in order (None: all); budget: exactly one, the method run at
            several budgets.
        reference: ablation: the full method the Delta columns compare against.
        baseline: budget: the method the gains and cost ratios are measured against.
        category_env: main: the env whose categories get columns; None: none; :data:`AUTO`:
            :data:`DEFAULT_CATEGORY_ENV` when present, else none.
        group: protocol / transfer / budget: the study column (None: the layout's default,
            filled in by :class:`TableLayout`).
        default_budget: budget: the budget label marked ``(default)``.
        cost_columns: budget: run-level cost columns shown as ratios when the file has them.
        decimals: decimals shown.
    """

    results: pd.DataFrame = field(repr=False)
    envs: Sequence[str] | None = None
    methods: Sequence[str] | None = None
    reference: str | None = None
    baseline: str | None = None
    category_env: str | None = None
    group: str | None = None
    default_budget: str | None = None
    cost_columns: Sequence[str] = ("interactions", "wall_clock")
    decimals: int = 1


class TableBuilder(Protocol):
    """The one signature of every table layout: a request in, a table out."""

    def __call__(self, request: TableRequest) -> Table: ...


@dataclass(frozen=True)
class TableLayout:
    """A registered table kind: its builder, the paper's table, and the run's study column.

    Calling a layout fills ``request.group`` with ``study_column`` when unset, then builds, so a
    layout is itself a :class:`TableBuilder`.

    Attributes:
        build: the builder.
        paper: the paper's table this layout reproduces (e.g. ``Table 1``).
        study_column: the default study column that is part of a run's identity (None: the
            layout needs none).
        study_example: a value of that column, for error messages.
    """

    build: TableBuilder
    paper: str
    study_column: str | None = None
    study_example: str | None = None

    def __call__(self, request: TableRequest) -> Table:
        if self.study_column is not None and request.group is None:
            request = replace(request, group=self.study_column)
        note = decoding_note(request)
        table = self.build(request)
        return replace(table, caption=f"{table.caption} {note}".strip()) if note else table

    def run_keys(self, group: str | None = None) -> tuple[str, ...]:
        """Study columns a results file needs as run keys (``group`` overrides the default)."""
        if self.study_column is None:
            return ()
        return (group or self.study_column,)

    def example(self, column: str) -> str:
        """An example value of a study column, for the message saying the file lacks it."""
        if column == self.study_column and self.study_example:
            return self.study_example
        return "one value per run"


TABLES: Registry[TableLayout] = Registry("table kind")

DECODING_COLUMN = "decoding"
"""The column of the ledger's ``decoding`` tag: ``constrained`` (valid-action decoding) or
``free``."""
CONSTRAINED = "constrained"


def decoding_note(request: TableRequest) -> str:
    """The caption sentence naming the rows whose runs decoded constrained ('' when none did).

    Reads the shown envs and methods of ``request``; a missing or empty ``decoding`` value is
    an older run, which decoded freely.

    Raises:
        ValueError: an (env, method) cell (and study value, when the study column is not
            ``decoding`` itself) mixes constrained and free runs.
    """
    results = request.results
    if DECODING_COLUMN not in results.columns or request.group == DECODING_COLUMN:
        return ""
    keep = np.ones(len(results), dtype=bool)
    if request.envs:
        keep &= results["env"].isin(request.envs).to_numpy()
    if request.methods:
        keep &= results["method"].isin(request.methods).to_numpy()
    by = ["env", "method", *([request.group] if request.group in results.columns else [])]
    frame = results.loc[keep, by].astype(str)
    frame["constrained"] = (results.loc[keep, DECODING_COLUMN].astype(str) == CONSTRAINED).values
    per_cell = frame.groupby(by, sort=False)["constrained"].agg(["any", "all"]).reset_index()
    mixed = per_cell[per_cell["any"] & ~per_cell["all"]]
    if len(mixed):
        where = ", ".join(f"{k}={mixed.iloc[0][k]}" for k in by)
        raise ValueError(
            f"the runs of {where} mix decoding=constrained and decoding=free (different tasks): "
            f"select one with --where decoding=constrained (or free), or compare them with "
            f"--group-column {DECODING_COLUMN}"
        )
    constrained = per_cell[per_cell["all"]]
    if not len(constrained):
        return ""
    what = "constrained to the current admissible actions (valid-action decoding, a different task)"
    if len(constrained) == len(per_cell):
        return f"Every run's replies were {what}."
    cells = ", ".join(
        " ".join([r["method"], "on", r["env"], *(f"({k} {r[k]})" for k in by[2:])])
        for _, r in constrained.iterrows()
    )
    return f"Replies were {what} in the runs of {cells}; the others decoded freely."


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


def _category_env(request: TableRequest) -> str | None:
    """The env whose categories get columns: ``request.category_env`` with AUTO resolved."""
    wanted = request.category_env
    if wanted == AUTO:
        return DEFAULT_CATEGORY_ENV if DEFAULT_CATEGORY_ENV in set(request.results["env"]) else None
    if wanted is not None and wanted not in set(request.results["env"]):
        present = ", ".join(dict.fromkeys(request.results["env"]))
        raise ValueError(f"category env {wanted!r} not found; present: {present}")
    return wanted


def _category_summary(results: pd.DataFrame, env: str | None) -> tuple[list[str], pd.DataFrame]:
    """(categories of ``env`` in order, mean / std over seeds of each category rate x 100)."""
    if env is None:
        return [], pd.DataFrame()
    rates = category_rates(results.loc[results["env"] == env])
    categories = [str(c) for c in dict.fromkeys(rates["category"])]
    return categories, _seed_summary(rates, ["method", "category"], "rate")


def main_table(request: TableRequest) -> Table:
    """Table 1: per method, category rates of one env and M per env (mean ± std).

    Reads ``envs``, ``methods`` (what to show, in order), ``category_env`` (the env whose
    categories get their own columns: mean over seeds of the category success rate, no std)
    and ``decimals``.
    """
    results, decimals = request.results, request.decimals
    env_list = _ordered(results["env"], request.envs, "env")
    method_list = _ordered(results["method"], request.methods, "method")
    summary = _seed_summary(run_metrics(results), ["env", "method"])
    category_env = _category_env(request)
    categories, cat_summary = _category_summary(results, category_env)
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


def ablation_table(request: TableRequest) -> Table:
    """Table 4: M per env (mean ± std) and Delta_env = mean M(method) - mean M(reference), pp.

    Reads ``reference`` (required), ``envs``, ``methods`` and ``decimals``; the reference row
    is bold and listed even when ``methods`` omits it.
    """
    results, reference, decimals = request.results, request.reference, request.decimals
    if reference is None:
        raise TableOptionError(
            "table ablation needs --reference METHOD (the full method the Δ columns compare "
            "against)"
        )
    env_list = _ordered(results["env"], request.envs, "env")
    method_list = _ordered(results["method"], request.methods, "method")
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


def _study_column(kind: str, request: TableRequest) -> str:
    if request.group is None:
        raise TableOptionError(
            f"table {kind} needs a study column (--group-column NAME); build it through "
            f"TABLES.get({kind!r}), which fills in the default"
        )
    return request.group


def _grouped_table(kind: str, title: str, request: TableRequest, within_group: bool) -> Table:
    """One row per (study value, method), M per env; bold: best per env (within each group)."""
    results, decimals = request.results, request.decimals
    group = _study_column(kind, request)
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
    env_list = _ordered(frame["env"], request.envs, "env")
    method_list = _ordered(frame["method"], request.methods, "method")
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


def protocol_table(request: TableRequest) -> Table:
    """Table 2: one row per (``group`` value, method), M per env; bold: best per env.

    Reads ``group`` (the study column, default ``reduction``), ``envs``, ``methods`` and
    ``decimals``.
    """
    group = _study_column("protocol", request)
    return _grouped_table("protocol", f"{_group_label(group)} × method", request, False)


def transfer_table(request: TableRequest) -> Table:
    """Table 3: one row per (backbone, method), M per env; bold: best per env within backbone.

    Reads ``group`` (the study column, default ``backbone``), ``envs``, ``methods`` and
    ``decimals``.
    """
    return _grouped_table("transfer", "Cross-backbone transfer", request, True)


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


def _budget_subjects(request: TableRequest) -> tuple[str, str]:
    """(method, baseline) of the budget table; both must be set and present in the results."""
    methods, baseline = request.methods, request.baseline
    if not methods or len(methods) != 1 or baseline is None:
        raise TableOptionError(
            "table budget needs exactly one --method (the method run at several budgets) and "
            "--baseline METHOD (the method the gains are measured against)"
        )
    for name in (methods[0], baseline):
        if name not in set(request.results["method"]):
            present = ", ".join(dict.fromkeys(request.results["method"]))
            raise ValueError(f"method {name!r} not found; present: {present}")
    return methods[0], baseline


def _budget_frame(request: TableRequest, method: str, group: str) -> pd.DataFrame:
    """The results with the budget column as text; every run of ``method`` must have one."""
    results = request.results
    if group not in results.columns:
        raise ValueError(f"the budget table needs a {group!r} column (e.g. 2x4); the file has none")
    if results.loc[results["method"] == method, group].isna().any():
        raise ValueError(f"rows of {method!r} need a {group!r} value (e.g. 2x4); some are empty")
    return results.assign(**{group: results[group].astype(str)})


def budget_table(request: TableRequest) -> Table:
    """Table 5: per budget of one method: cost ratios and gain over a baseline per env (pp).

    Gain_env(b) = mean over seeds of M(method at budget b) - mean over seeds of M(baseline).
    A cost column c (``cost_columns``: run-level numbers, optional) gives the ratio
    mean_seeds c(method at b) / mean_seeds c(baseline) per env, averaged over envs.

    Reads ``methods`` (exactly one), ``baseline`` (required), ``group`` (the budget column,
    default ``budget``), ``envs``, ``cost_columns``, ``default_budget`` and ``decimals``.
    """
    method, baseline = _budget_subjects(request)
    group = _study_column("budget", request)
    frame = _budget_frame(request, method, group)
    env_list = _ordered(frame["env"], request.envs, "env")
    keys = ["env", "method", "seed", group]
    summary = _seed_summary(run_metrics(frame, keys), ["env", "method", group])
    base = summary.loc[summary["method"] == baseline].groupby("env")["mean"].mean()
    for e in env_list:
        if e not in base.index:
            raise ValueError(f"baseline {baseline!r} has no results for env {e!r}")
    budgets = _budget_order(list(dict.fromkeys(frame.loc[frame["method"] == method, group])))
    costs = [c for c in request.cost_columns if c in frame.columns]
    cost_runs = {c: _run_level(frame, c, keys) for c in costs}
    cost_label = {"interactions": "Interact. (×)", "wall_clock": "Wall-clock (×)"}
    label = "B×M" if group == "budget" else _group_label(group)
    gain_cols = [f"Gain {e} (pp)" if len(env_list) > 1 else "Gain (pp)" for e in env_list]
    columns = [label, *(cost_label.get(c, f"{c} (×)") for c in costs), *gain_cols]
    rows = []
    for b in budgets:
        default = request.default_budget is not None and b == request.default_budget
        row = [Cell(text=f"{b} (default)" if default else b)]
        for c in costs:
            ratio = _cost_ratio(cost_runs[c], c, env_list, method, baseline, group, b)
            row.append(Cell(value=ratio, decimals=2))
        for e in env_list:
            r = _lookup(summary, env=e, method=method, **{group: b})
            gain = None if r is None else float(r["mean"]) - float(base[e])
            row.append(Cell(value=gain, signed=True) if gain is not None else Cell())
        rows.append(row)
    rows = _bold_best(rows, range(1 + len(costs), len(columns)), request.decimals, [0] * len(rows))
    seeds = "/".join(map(str, sorted({int(n) for n in summary["n"]})))
    caption = (
        f"Gain of {method} over {baseline} in macro success (pp) per continuation budget, "
        f"means over {seeds} seed(s)"
        + (f"; cost columns: ratio to {baseline}, averaged over environments" if costs else "")
        + ". Bold marks the largest gain."
    )
    return _table("budget", "Continuation budget", columns, rows, caption, request.decimals)


# --------------------------------------------------------------------------- registries

# Registered in the order the CLI lists them.
TABLES.add("main", TableLayout(main_table, "Table 1"))
TABLES.add("ablation", TableLayout(ablation_table, "Table 4"))
TABLES.add("protocol", TableLayout(protocol_table, "Table 2", "reduction", "token-mean"))
TABLES.add("budget", TableLayout(budget_table, "Table 5", "budget", "2x4"))
TABLES.add("transfer", TableLayout(transfer_table, "Table 3", "backbone", "qwen2.5-7b"))
KINDS: tuple[str, ...] = tuple(TABLES.names())

#: Text exports of a table, by format name.
EXPORTS: Registry[Callable[[Table], str]] = Registry("table format")
EXPORTS.add("csv", to_csv)
EXPORTS.add("markdown", to_markdown)
EXPORTS.add("latex", to_latex)
