"""``factor study report``: the paper-layout table, the bootstrap, win counts and costs of a study.

``build_report(matrix, gather(matrix, states))`` works on whatever has finished: a partial study
gets its tables from the finished cells and lists the missing ones; a study with no finished
cell gets a report holding only the missing cells and the cost table (and a note saying so),
since the compute already spent (failed runs included) is worth reporting.

Labels. A table row is a method (``summary.by: method``) or a variant, ``row[axis=value,...]``
(``by: row``, sensitivity sweeps where every row is FACTOR). When two variants of one layout
would share a method label (same env, seed and study column), variants are used instead (with a
note). In ``by: row`` the reference may be a row name: its cells at no axis point (the sweep's
default, e.g. eta_0 = 0.7) are then the reference, a row of their own named after the row.

Grouped layouts (protocol, budget, transfer) take the study column ``summary.group_column``
(default: the layout's, reduction / budget / backbone). Axes that vary within one (label, env,
seed, group value), e.g. the protocol study's rollout temperature beside the reduction, join the
group value as ``value, key=v`` (the *context*), so every table row is one configuration.

Comparisons (hierarchical bootstrap and wins). Subject S vs reference R per env (and per group
value): Delta = (1/|seeds|) sum_s (M_s(S) - M_s(R)) over the seeds both finished, in pp, with the
percentile CI and P(Delta > 0) of :func:`factor_cli.stats.report.bootstrap_report`; wins / ties /
losses: the seeds where M_s(S) >, =, < M_s(R). When S = R (an ablation against full FACTOR), every
other table row is compared with R instead. In the budget layout R (the method without
continuations) has one budget, so every budget of S is compared with it.

Difference-in-differences (protocol): per env e and context, with g_1, g_2 the values of the
group column (spec order, e.g. token-mean then action-mean) and Mbar the mean over seeds of the
macro metric as the table shows it,

    DiD_e = [Mbar_e(S | g_2) - Mbar_e(R | g_2)] - [Mbar_e(S | g_1) - Mbar_e(R | g_1)]   (pp)

(with more than two values, each g_k, k >= 2, against g_1).

``write_report(report, out_dir)`` writes report.md, one CSV per table and the PNG plots into a
staging folder beside ``out_dir`` and then swaps it in whole (see :func:`write_report`).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .matrix import (
    Cell,
    Matrix,
    axis_points,
    cell_key,
    override_items,
    override_text,
    variant_label,
)
from .results import MissingCell, StudyResults
from .spec import SpecError

if TYPE_CHECKING:
    import pandas as pd

    from factor_cli.stats.report import BootstrapReport
    from factor_cli.stats.tables import Table
    from factor_cli.train.config import TrainConfig

GROUPED = ("protocol", "budget", "transfer")
MARKER = ".factor-study-report"  # names the files of the report in its folder
CONFIDENCE = 0.95
RUN_COSTS = ("interactions", "wall_clock")  # run-level cost columns of the budget table
_TIE = 1e-9  # |M_s(S) - M_s(R)| in pp below this is a tie (float rounding of equal rates)


class ReportError(SpecError):
    """A study report that cannot be built or written; one line naming what and the fix."""


@dataclass(frozen=True, eq=False)
class Comparison:
    """Subject vs reference on one env (and context): per-seed differences, wins, bootstrap.

    Attributes:
        per_seed: M_s(subject) - M_s(reference) in pp, for ``seeds`` (ascending).
        bootstrap: the hierarchical bootstrap, None when it could not run (see ``note``).
        primary: the study's own subject vs reference (not one ablation row vs the reference).
    """

    subject: str
    reference: str
    context: str
    env: str
    seeds: tuple[int, ...]
    per_seed: tuple[float, ...]
    wins: int
    ties: int
    losses: int
    bootstrap: BootstrapReport | None
    primary: bool
    note: str = ""

    @property
    def delta(self) -> float:
        """Delta = mean over seeds of M_s(subject) - M_s(reference), pp."""
        return sum(self.per_seed) / len(self.per_seed)


@dataclass(frozen=True, eq=False)
class StudyReport:
    """Everything ``factor study report`` shows and writes.

    Attributes:
        tables: file stem -> table, in the order shown: ``table`` (the paper layout), ``did``
            (protocol), ``bootstrap`` (comparisons and wins), ``missing``, ``costs``.
        comparisons: every subject-vs-reference comparison (the ``bootstrap`` table's rows).
        deltas: rows (method, env, delta in pp) of the bar chart (ablation Delta, budget
            gains), None when the layout has none; ``deltas_reference`` what delta refers to.
        lines: one-line summaries (bootstrap of the study's comparison, win counts).
        notes: what is partial or skipped, and why.
    """

    study: str
    title: str
    spec_path: str
    spec_hash: str
    kind: str
    cells: int
    finished: int
    tables: dict[str, Table]
    comparisons: tuple[Comparison, ...]
    deltas: pd.DataFrame | None
    deltas_reference: str
    missing: tuple[MissingCell, ...]
    lines: tuple[str, ...]
    notes: tuple[str, ...]
    seed: int = 0
    resamples: int = 2000


@dataclass
class _View:
    """The items as the tables see them: ``method`` is the row label, the group column set."""

    frame: pd.DataFrame
    labels: list[str]
    envs: list[str]
    reference: str | None
    subject: str | None
    group: str | None
    by_row: bool
    pairwise: bool  # subject = reference: every other row is compared with the reference
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- labels


def _plan_labels(matrix: Matrix, by_row: bool) -> list[str]:
    """Row labels in spec order (rows, then axis points), for sorting what has finished."""
    spec, out = matrix.spec, []
    for row in spec.rows:
        points = axis_points(spec.axes, spec.axes_mode) if row.crossed else [{}]
        out += [variant_label(row.name, p) for p in points] if by_row else [row.method_name]
    return list(dict.fromkeys(out))


def _ordered(values: Sequence[str], plan: Sequence[str]) -> list[str]:
    """The distinct ``values``: those in ``plan`` in plan order, then the others as they come."""
    present = list(dict.fromkeys(values))
    rank = {v: i for i, v in enumerate(plan)}
    return sorted(present, key=lambda v: (rank.get(v, len(rank)), present.index(v)))


def row_base_config(matrix: Matrix, cell: Cell) -> TrainConfig | None:
    """The config of the cell's (first) row at no axis point: the row's default variant."""
    from factor_cli.train.config import ConfigError, load_config

    items = list(cell.overrides)
    for item in reversed(override_items(cell.point)):  # the point's items are the last of the row's
        last = len(items) - 1 - items[::-1].index(item)
        del items[last]
    try:
        return load_config(matrix.base, items)
    except ConfigError:
        return None


def default_cells(matrix: Matrix, row: str) -> set[str]:
    """Keys of the cells of ``row`` at no axis point (one per env and seed, when in the matrix).

    An uncrossed row's cells are that; for a crossed row, the cell whose config equals the row's
    config without its axis point (a sweep's shared default), found by config hash.
    """
    keys, found, done = {c.key for c in matrix.cells}, set(), set()
    for cell in matrix.cells:
        if cell.row != row or cell.config is None or (cell.env, cell.seed) in done:
            continue
        done.add((cell.env, cell.seed))  # the row's base config is one per (env, seed)
        cfg = row_base_config(matrix, cell) if cell.point else cell.config
        if cfg is not None and cell_key(cfg) in keys:
            found.add(cell_key(cfg))
    return found


def _collide(frame: pd.DataFrame, group: str | None) -> bool:
    """Whether two runs would share a table row: same (label, env, seed, group) and item."""
    keys = ["method", "env", "seed", *([group] if group else []), "item_id"]
    return bool(frame.duplicated(subset=keys).any())


def _with_default_reference(matrix: Matrix, frame: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Add one copy of the reference row's default cells labelled ``reference`` (by: row)."""
    import pandas as pd

    rows_named = {r.name for r in matrix.spec.rows}
    keys = default_cells(matrix, reference) if reference in rows_named else set()
    rows = frame.loc[frame["cell_key"].isin(keys)].drop_duplicates(["cell_key", "item_id"])
    if rows.empty:
        return frame
    return pd.concat([frame, rows.assign(method=reference, variant=reference)], ignore_index=True)


# ----------------------------------------------------------------------------- view


def _group_column(matrix: Matrix, kind: str, items: pd.DataFrame) -> str | None:
    from factor_cli.stats.tables import TABLES

    if kind not in GROUPED:
        return None
    group = matrix.spec.summary.group_column or TABLES.get(kind).study_column
    if group not in items.columns:
        known = ", ".join(c for c in items.columns if c not in ("success", "score", "item_id"))
        raise ReportError(
            f"{matrix.spec_path}: summary.group_column {group!r} is not a column of the study's "
            f"results; use one of: {known}"
        )
    return group


def _contexts(frame: pd.DataFrame, group: str, matrix: Matrix) -> pd.DataFrame:
    """Set ``_group`` (the raw value), ``_context`` (other varying axes) and the composite.

    Rows are sorted by group value (the spec's axis order when the column is an axis), so the
    tables list the groups in that order.
    """
    raw = frame[group].astype(str)
    keys = ["method", "env", "seed", group]
    others = [
        a
        for a in matrix.spec.axes
        if a != group and a in frame.columns and frame.groupby(keys)[a].nunique().gt(1).any()
    ]
    values = frame[others].astype(str).itertuples(index=False)
    context = [", ".join(f"{k}={v}" for k, v in zip(others, vs, strict=True)) for vs in values]
    out = frame.assign(_group=raw, _context=context if others else "")
    out[group] = [f"{g}, {c}" if c else g for g, c in zip(raw, out["_context"], strict=True)]
    spec_order = [override_text(v) for v in matrix.spec.axes.get(group, [])]
    ranks = {v: i for i, v in enumerate(_ordered(raw.tolist(), spec_order))}
    rank = out["_group"].map(ranks)
    return out.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank")


def _labelled(matrix: Matrix, items: pd.DataFrame, group: str | None, by_row: bool) -> pd.DataFrame:
    """The items with ``method`` = the row label, the default reference and the contexts."""
    reference = matrix.spec.summary.reference
    frame = items.assign(method=items["variant"] if by_row else items["method"])
    if by_row and reference not in set(frame["method"]):
        frame = _with_default_reference(matrix, frame, reference)
    return _contexts(frame, group, matrix) if group is not None else frame


def _with_costs(results: StudyResults) -> pd.DataFrame:
    """The items with their run's costs ``interactions`` and ``wall_clock`` (budget table)."""
    costs = results.runs[["run_id", *RUN_COSTS]].drop_duplicates("run_id")
    return results.items.merge(costs, on="run_id", how="left", validate="many_to_one")


def _view(matrix: Matrix, results: StudyResults, kind: str) -> _View:
    """Relabel the items for the tables (module docstring: labels, grouped layouts)."""
    summary, items = matrix.spec.summary, _with_costs(results)
    group = _group_column(matrix, kind, items)
    by_row, notes = summary.by == "row", []
    frame = _labelled(matrix, items, group, by_row)
    if not by_row and _collide(frame, group):
        by_row = True
        frame = _labelled(matrix, items, group, by_row)
        notes.append("some rows share a method: the tables show one row per variant")
    labels = _ordered(frame["method"].tolist(), _plan_labels(matrix, by_row))
    envs = _ordered(frame["env"].tolist(), matrix.spec.envs)
    reference = summary.reference if summary.reference in labels else None
    if reference is None:
        notes.append(
            f"the reference {summary.reference!r} has no finished cell: no Δ, "
            "bootstrap or wins against it"
        )
    subject = summary.subject if summary.subject in labels else None
    pairwise = summary.subject == summary.reference
    if subject is None and not pairwise:
        notes.append(f"the subject {summary.subject!r} has no finished cell: no bootstrap or wins")
    return _View(frame, labels, envs, reference, subject, group, by_row, pairwise, notes)


# ----------------------------------------------------------------------------- the paper table


def _envs_of(view: _View, label: str) -> list[str]:
    rows = view.frame.loc[view.frame["method"] == label, "env"]
    return [e for e in view.envs if e in set(rows)]


def default_budget(matrix: Matrix, method: str) -> str | None:
    """``BxM`` of ``method``'s row at no axis point (the budget marked ``(default)``)."""
    for cell in matrix.cells:
        if cell.method == method and cell.config is not None:
            cfg = row_base_config(matrix, cell) if cell.point else cell.config
            if cfg is not None:
                return f"{cfg.continuations.budget}x{cfg.continuations.per_checkpoint}"
    return None


def _table_request(matrix: Matrix, view: _View, kind: str, notes: list[str]) -> tuple[str, Any]:
    """The layout actually built and its request (a fallback when the reference is missing)."""
    from factor_cli.stats.tables import AUTO, TableRequest

    request = TableRequest(
        view.frame, envs=view.envs, methods=view.labels, category_env=AUTO, group=view.group
    )
    ref = view.reference
    if kind == "ablation" and ref is not None:
        envs = _envs_of(view, ref)
        if envs != view.envs:
            notes.append(
                f"the ablation table shows the envs where {ref!r} finished: {', '.join(envs)}"
            )
        return kind, replace(request, reference=ref, envs=envs)
    if kind == "budget":
        if ref is None or view.subject is None or view.subject == ref:
            notes.append(
                "the budget table needs the subject and the reference finished: "
                "showing one row per (budget, method) instead"
            )
            return "protocol", request
        budget = default_budget(matrix, view.subject)
        envs = _envs_of(view, ref)
        return kind, replace(
            request, methods=[view.subject], baseline=ref, envs=envs, default_budget=budget
        )
    return ("main" if kind == "ablation" else kind), request


def _paper_table(matrix: Matrix, view: _View, kind: str, notes: list[str]) -> Table | None:
    """The ``summary.table`` layout of :data:`factor_cli.stats.tables.TABLES` on the view."""
    from factor_cli.stats.tables import TABLES

    if kind == "none":
        return None
    built, request = _table_request(matrix, view, kind, notes)
    try:
        table = TABLES.get(built)(request)
    except ValueError as exc:
        notes.append(f"the {built} table could not be built: {exc}")
        return None
    return replace(table, title=matrix.spec.title or table.title)


# ----------------------------------------------------------------------------- comparisons


def _pairs(view: _View) -> list[tuple[str, str, bool]]:
    """(subject, reference, primary) pairs: the study's own, or every row vs the reference."""
    ref = view.reference
    if ref is None:
        return []
    if view.pairwise:
        return [(label, ref, False) for label in view.labels if label != ref]
    return [(view.subject, ref, True)] if view.subject is not None else []


def _reference_rows(view: _View, label: str, context: str) -> pd.DataFrame | None:
    """The reference's rows for one group value; all of them if it has only one value."""
    rows = view.frame.loc[view.frame["method"] == label]
    if view.group is None:
        return rows
    at = rows.loc[rows[view.group] == context]
    if len(at):
        return at
    return rows if rows[view.group].nunique() == 1 else None


def _bootstrap(
    a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str], env: str, seed: int, resamples: int
) -> tuple[BootstrapReport | None, str]:
    import pandas as pd

    from factor_cli.stats.report import BootstrapRequest, bootstrap_report

    request = BootstrapRequest(env, names[0], names[1], resamples, seed, CONFIDENCE)
    try:
        return bootstrap_report(pd.concat([a, b], ignore_index=True), request), ""
    except ValueError as exc:
        return None, f"bootstrap of {names[0]} vs {names[1]} on {env} skipped: {exc}"


def _compare(
    a: pd.DataFrame,
    b: pd.DataFrame,
    key: tuple[str, str, str, str],
    primary: bool,
    seed: int,
    resamples: int,
) -> Comparison | str | None:
    """One comparison on the seeds both finished; a note when there is none, None if trivial."""
    from factor_cli.stats.metric import run_metrics

    subject, reference, context, env = key
    ma = run_metrics(a, ("seed",)).set_index("seed")["metric"]
    mb = run_metrics(b, ("seed",)).set_index("seed")["metric"]
    seeds = sorted(set(ma.index) & set(mb.index))
    where = f"{env}{f' ({context})' if context else ''}"
    if not seeds:
        return f"{subject} vs {reference} on {where}: no seed finished for both"
    a, b = a.loc[a["seed"].isin(seeds)], b.loc[b["seed"].isin(seeds)]
    if set(a["run_id"]) == set(b["run_id"]):  # a variant that is the reference's own cell
        return None
    diffs = tuple(100.0 * float(ma[s] - mb[s]) for s in seeds)
    boot, note = _bootstrap(a, b, (subject, reference), env, seed, resamples)
    return Comparison(
        subject, reference, context, env, tuple(int(s) for s in seeds), diffs,
        sum(d > _TIE for d in diffs), sum(abs(d) <= _TIE for d in diffs),
        sum(d < -_TIE for d in diffs), boot, primary, note,
    )  # fmt: skip


def _comparisons(view: _View, seed: int, resamples: int, notes: list[str]) -> list[Comparison]:
    """Every pair of :func:`_pairs` per group value and env (module docstring)."""
    out = []
    for subject, reference, primary in _pairs(view):
        rows = view.frame.loc[view.frame["method"] == subject]
        contexts = list(dict.fromkeys(rows[view.group])) if view.group else [""]
        for context in contexts:
            a_rows = rows.loc[rows[view.group] == context] if view.group else rows
            b_rows = _reference_rows(view, reference, context)
            if b_rows is None:
                notes.append(f"{reference} has no run at {context} to compare {subject} with")
                continue
            for env in [e for e in view.envs if e in set(a_rows["env"])]:
                key = (subject, reference, context, env)
                a, b = a_rows.loc[a_rows["env"] == env], b_rows.loc[b_rows["env"] == env]
                got = _compare(a, b, key, primary, seed, resamples)
                if isinstance(got, str):
                    notes.append(got)
                elif got is not None:
                    out.append(got)
                    notes += [got.note] if got.note else []
    single = sum(c.bootstrap is not None and len(c.seeds) == 1 for c in out)
    if single:
        notes.append(
            f"{single} comparison(s) rest on one training seed: their CIs resample "
            "items only and ignore seed-to-seed variance"
        )
    return out


def _comparison_row(c: Comparison, context: bool) -> tuple[Any, ...]:
    """Subject, reference, [context], env, seeds, Delta, CI, P(Delta > 0), wins, ties, losses."""
    from factor_cli.stats.tables import Cell

    res = c.bootstrap.result if c.bootstrap is not None else None
    low, high, p = (None, None, None) if res is None else (res.ci_low, res.ci_high, res.p_positive)
    return (
        Cell(text=c.subject),
        Cell(text=c.reference),
        *([Cell(text=c.context)] if context else []),
        Cell(text=c.env),
        Cell(value=len(c.seeds), decimals=0),
        Cell(value=c.delta, signed=True),
        *(Cell(value=None if v is None else 100.0 * v, signed=True) for v in (low, high)),
        Cell(value=p, decimals=3),
        *(Cell(value=n, decimals=0) for n in (c.wins, c.ties, c.losses)),
    )


def _bootstrap_table(
    comparisons: Sequence[Comparison], group: str | None, seed: int, resamples: int
) -> Table:
    """One row per comparison: Delta, CI, P(Delta > 0), wins / ties / losses."""
    from factor_cli.stats.tables import Table

    context = group is not None and any(c.context for c in comparisons)
    columns = (
        "Subject", "Reference", *([group] if context else []), "Env", "Seeds", "Δ (pp)",
        "CI low (pp)", "CI high (pp)", "P(Δ > 0)", "Wins", "Ties", "Losses",
    )  # fmt: skip
    rows = tuple(_comparison_row(c, context) for c in comparisons)
    caption = (
        "Δ = mean over the seeds both finished of M(subject) − M(reference), pp; "
        f"{100 * CONFIDENCE:g}% percentile CI and P(Δ > 0) from the hierarchical (seed → item) "
        f"bootstrap, {resamples} replicates, generator seed {seed}; wins / ties / losses: "
        "seeds where the subject's macro metric is above / equal to / below the reference's."
    )
    return Table("bootstrap", "Subject vs reference", columns, rows, caption, 1)


def _lines(comparisons: Sequence[Comparison]) -> list[str]:
    """Bootstrap lines of the study's own comparison and the win count of every pair."""
    lines, wins = [], {}
    for c in comparisons:
        if c.primary and c.bootstrap is not None:
            res = c.bootstrap.result
            where = f"{c.env}{f' ({c.context})' if c.context else ''}"
            lines.append(
                f"{where}: {c.subject} − {c.reference} = {c.delta:+.1f} pp, "
                f"{100 * CONFIDENCE:g}% CI [{100 * res.ci_low:+.1f}, {100 * res.ci_high:+.1f}], "
                f"P(Δ > 0) = {res.p_positive:.3f} ({len(c.seeds)} seeds)"
            )
        w = wins.setdefault((c.subject, c.reference, c.context), [0, 0, 0])
        w[0], w[1], w[2] = w[0] + c.wins, w[1] + c.ties, w[2] + c.losses
    for (subject, reference, context), (w, t, lo) in wins.items():
        where = f" ({context})" if context else ""
        lines.append(
            f"{subject} beats {reference}{where} in {w} of {w + t + lo} (env, seed) pairs "
            f"({t} ties, {lo} losses)"
        )
    return lines


# ----------------------------------------------------------------------------- DiD and deltas


def _seed_means(frame: pd.DataFrame, keys: Sequence[str]) -> dict[tuple, float]:
    """Mean over seeds of the macro metric, in %, per ``keys`` (Mbar of the tables)."""
    from factor_cli.stats.metric import run_metrics

    runs = run_metrics(frame, (*keys, "seed"))
    means = runs.groupby(list(keys), sort=False)["metric"].mean() * 100.0
    return {k if isinstance(k, tuple) else (k,): float(v) for k, v in means.items()}


def _did_table(view: _View, kind: str, notes: list[str]) -> Table | None:
    """Protocol: the gap S - R under each group value and DiD vs the first (module docstring)."""
    from factor_cli.stats.tables import Cell, Table

    s, r = view.subject, view.reference
    if kind != "protocol" or s is None or r is None or s == r:
        return None
    groups = list(dict.fromkeys(view.frame["_group"]))
    if len(groups) < 2:
        notes.append(
            f"one {view.group} value only ({', '.join(groups)}): no difference-in-differences"
        )
        return None
    means = _seed_means(view.frame, ("env", "method", "_group", "_context"))
    contexts = list(dict.fromkeys(view.frame["_context"]))
    rows = []
    for context in contexts:
        for env in view.envs:
            gaps = [_gap(means, (env, s, g, context), (env, r, g, context)) for g in groups]
            dids = [None if g is None or gaps[0] is None else g - gaps[0] for g in gaps[1:]]
            cells = [Cell(value=v, signed=True) for v in (*gaps, *dids)]
            rows.append(((Cell(text=context),) if any(contexts) else ()) + (Cell(text=env), *cells))
    columns = [
        *(["Context"] if any(contexts) else []),
        "Env",
        *(f"Δ {g} (pp)" for g in groups),
        *(f"DiD {g} − {groups[0]}" for g in groups[1:]),
    ]
    caption = (
        f"Δ = mean over seeds of M({s}) − M({r}) under each {view.group} value, pp; "
        f"DiD = Δ({groups[1]}) − Δ({groups[0]}) (pp), per env."
    )
    title = "Difference-in-differences"
    return Table("did", title, tuple(columns), tuple(rows), caption, 1)


def _gap(means: dict[tuple, float], a: tuple, b: tuple) -> float | None:
    return means[a] - means[b] if a in means and b in means else None


def _deltas(view: _View, kind: str) -> pd.DataFrame | None:
    """The bar chart's rows (method, env, delta pp): ablation Δ or budget gains, else None."""
    import pandas as pd

    from factor_cli.stats.tables import reference_deltas

    ref = view.reference
    if ref is None:
        return None
    if kind == "ablation":
        try:
            out = reference_deltas(view.frame, ref, _envs_of(view, ref), view.labels)
        except ValueError:
            return None
        return out if len(out) else None
    if kind != "budget" or view.subject is None or view.subject == ref:
        return None
    means = _seed_means(view.frame, ("env", "method", view.group))
    refs = _seed_means(view.frame.loc[view.frame["method"] == ref], ("env",))
    rows = [
        {"method": g, "env": e, "delta": v - refs[(e,)]}
        for (e, m, g), v in means.items() if m == view.subject and (e,) in refs
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["method", "env", "delta"]) if rows else None


# ----------------------------------------------------------------------------- costs, missing

_RUNNING = ("running", "stale")
_PENDING = ("pending", "invalid")


def _cost_cells(runs: pd.DataFrame) -> list[Any]:
    """Counts per state, summed hours, resumes and distinct commits of some cells' runs."""
    from factor_cli.stats.tables import Cell

    state = runs["state"]
    counts = [
        len(runs),
        (state == "finished").sum(),
        (state == "failed").sum(),
        (state == "killed").sum(),
        state.isin(_RUNNING).sum(),
        state.isin(_PENDING).sum(),
    ]
    hours = [runs[c].sum() for c in ("node_hours", "cpu_core_hours", "wall_clock_hours")]
    resumes = (runs["sessions"] - 1).clip(lower=0).sum()
    commits = {c for text in runs["git_commits"] for c in text.split()}
    return [
        *(Cell(value=float(n), decimals=0) for n in counts),
        *(Cell(value=float(h), decimals=3) for h in hours),
        Cell(value=float(resumes), decimals=0),
        Cell(value=float(len(commits)), decimals=0),
    ]


def _costs_table(matrix: Matrix, results: StudyResults, by_row: bool) -> Table:
    """Per row (or variant) and in total: cells by state, compute, resumes and git commits."""
    from factor_cli.stats.tables import Cell, Table

    runs, key = results.runs, "variant" if by_row else "row"
    rows = []
    for name in _ordered(runs[key].tolist(), _plan_labels(matrix, by_row)):
        cells = runs.loc[runs[key] == name].drop_duplicates("cell_key")
        rows.append((Cell(text=name), *_cost_cells(cells)))
    every = runs.drop_duplicates("cell_key")
    rows.append((Cell(text="total", bold=True), *_cost_cells(every)))
    columns = (
        "Variant" if by_row else "Row",
        "Cells",
        "Finished",
        "Failed",
        "Killed",
        "Running",
        "Pending",
        "Node-hours",
        "Core-hours",
        "Wall-clock h",
        "Resumes",
        "Commits",
    )
    commits = sorted({c[:12] for text in every["git_commits"] for c in text.split()})
    caption = (
        f"Compute of study {matrix.spec.name}, spec {matrix.spec_path} (hash "
        f"{matrix.spec_hash[:16]}): every cell's ledger run, failed and killed ones included "
        "(a cell serving several variants counts in each, once in the total); node-hours = "
        "wall-clock hours × GPUs / 8; running includes stale runs, pending includes cells "
        f"invalid here; resumes = sessions − 1; commits: {', '.join(commits) or 'none'}."
    )
    return Table("costs", "Cost", columns, tuple(rows), caption, 1)


def _missing_table(missing: Sequence[MissingCell], cells: int) -> Table:
    from factor_cli.stats.tables import Cell, Table

    reasons = [m.reason.splitlines()[0] if m.reason else "" for m in missing]
    rows = tuple(
        (Cell(text=m.label), Cell(text=m.state), Cell(text=why))
        for m, why in zip(missing, reasons, strict=True)
    )
    caption = (
        f"{len(missing)} of {cells} cells have no results; `factor study run` starts or resumes "
        "them (failed ones with --retry-failed K)."
    )
    return Table("missing", "Missing cells", ("Cell", "State", "Reason"), rows, caption, 1)


# ----------------------------------------------------------------------------- the report


def _results_tables(
    matrix: Matrix, results: StudyResults, seed: int, resamples: int
) -> tuple[dict[str, Table], list[Comparison], pd.DataFrame | None, bool, list[str]]:
    """The tables that need finished cells: paper layout, DiD, bootstrap (and the chart rows)."""
    kind = matrix.spec.summary.table
    view = _view(matrix, results, kind)
    notes, tables = view.notes, {}
    table = _paper_table(matrix, view, kind, notes)
    if table is not None:
        tables["table"] = table
    did = _did_table(view, kind, notes)
    if did is not None:
        tables["did"] = did
    comparisons = _comparisons(view, seed, resamples, notes)
    if comparisons:
        tables["bootstrap"] = _bootstrap_table(comparisons, view.group, seed, resamples)
    return tables, comparisons, _deltas(view, kind), view.by_row, notes


def build_report(
    matrix: Matrix, results: StudyResults, seed: int = 0, resamples: int = 2000
) -> StudyReport:
    """Every table of the study's report from what has finished (module docstring).

    Args:
        seed: seed of the bootstrap's generator (``numpy.random.default_rng(seed)`` per
            comparison, so a comparison's numbers do not depend on the others).
        resamples: R, the bootstrap replicates per comparison.

    Raises:
        ReportError: ``resamples`` < 1, or a ``summary.group_column`` the results lack.
    """
    if resamples < 1:
        raise ReportError(f"--resamples must be at least 1, got {resamples}")
    spec, finished = matrix.spec, results.finished_cells
    tables: dict[str, Table] = {}
    comparisons: list[Comparison] = []
    deltas, by_row, notes = None, spec.summary.by == "row", []
    if finished:
        tables, comparisons, deltas, by_row, notes = _results_tables(
            matrix, results, seed, resamples
        )
    else:
        notes.append(
            f"no cell of study {spec.name} has finished with results yet (0 of "
            f"{len(matrix.cells)}): this report holds the missing cells and the cost "
            "table only"
        )
    if results.missing:
        tables["missing"] = _missing_table(results.missing, len(matrix.cells))
    tables["costs"] = _costs_table(matrix, results, by_row)
    return StudyReport(
        spec.name, spec.title or spec.name, str(matrix.spec_path), matrix.spec_hash,
        spec.summary.table, len(matrix.cells), finished, tables, tuple(comparisons), deltas,
        spec.summary.reference, results.missing, tuple(_lines(comparisons)), tuple(notes),
        seed, resamples,
    )  # fmt: skip


# ----------------------------------------------------------------------------- writing


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def _plots(report: StudyReport, folder: Path) -> list[str]:
    """PNGs: the Δ / gain bar chart, the bootstrap distribution of each primary comparison."""
    from factor_cli.stats import plots

    names = []
    if report.deltas is not None:
        ref = report.deltas_reference
        title = f"Gain over {ref} (pp)" if report.kind == "budget" else f"Δ vs {ref} (pp)"
        plots.ablation_deltas(report.deltas, ref, folder / "deltas.png", title=title)
        names.append("deltas.png")
    for c in report.comparisons:
        if not c.primary or c.bootstrap is None:
            continue
        res = c.bootstrap.result
        name = _slug(f"bootstrap-{c.env}-{c.context}" if c.context else f"bootstrap-{c.env}")
        plots.bootstrap_distribution(
            100.0 * res.distribution, 100.0 * res.point,
            (100.0 * res.ci_low, 100.0 * res.ci_high), res.p_positive, folder / f"{name}.png",
            title=f"{c.subject} − {c.reference} on {c.env}"
            f"{f' ({c.context})' if c.context else ''}: P(Δ > 0) = {res.p_positive:.3f}",
        )  # fmt: skip
        names.append(f"{name}.png")
    return names


def markdown(report: StudyReport, images: Sequence[str] = ()) -> str:
    """report.md: header, notes, every table, the summary lines and the plots."""
    from factor_cli.stats.tables import to_markdown

    parts = [
        f"# {report.title}: study report\n",
        f"Study `{report.study}`, spec `{report.spec_path}` (hash `{report.spec_hash}`): "
        f"{report.finished} of {report.cells} cells finished with results.\n",
    ]
    if report.notes:
        parts.append("".join(f"- note: {n}\n" for n in report.notes))
    for name, table in report.tables.items():
        parts.append(f"## {table.title}\n\n{to_markdown(table)}")
        if name == "bootstrap" and report.lines:
            parts.append("".join(f"- {line}\n" for line in report.lines))
    parts += [f"![{Path(i).stem}]({i})\n" for i in images]
    return "\n".join(parts)


def _check_replaceable(out_dir: Path) -> None:
    if out_dir.exists() and (
        not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / MARKER).exists())
    ):
        raise ReportError(
            f"{out_dir} exists and is not a study report folder (no {MARKER} in it); move it "
            "away or write the report elsewhere"
        )


def _swap(stage: Path, out_dir: Path) -> None:
    """Put ``stage`` in place of ``out_dir``: two renames, never a half-written folder."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(stage, 0o777 & ~umask)  # mkdtemp's 0700 would hide the report from other users
    if not out_dir.exists():
        os.rename(stage, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rmdir(old)
    os.rename(out_dir, old)
    os.rename(stage, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def write_report(report: StudyReport, out_dir: Path | str) -> list[Path]:
    """Write report.md, ``<table>.csv`` per table and the PNGs; returns the files written.

    Everything is written into a staging folder beside ``out_dir`` first, which then replaces
    ``out_dir`` as a whole, so a crash leaves the previous report (or none), never a mix. The
    folder is the report's: one that exists without the report marker is refused.

    Raises:
        ReportError: ``out_dir`` is an unrelated file or folder.
    """
    from factor_cli.stats.tables import to_csv

    out_dir = Path(out_dir)
    _check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.new-", dir=out_dir.parent))
    try:
        names = [f"{name}.csv" for name in report.tables]
        for name, table in report.tables.items():
            (stage / f"{name}.csv").write_text(to_csv(table), encoding="utf-8")
        images = _plots(report, stage)
        (stage / "report.md").write_text(markdown(report, images), encoding="utf-8")
        names = ["report.md", *names, *images]
        (stage / MARKER).write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
        _swap(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return [out_dir / n for n in names]
