"""A study's results read back from the ledger: the items of its finished cells, one row per run.

``gather(matrix, states)`` returns a :class:`StudyResults` with

``items``   the item-level evaluation results (artifact ``items/eval_items.csv``) of every
            FINISHED cell, in the statistics schema (env, method, seed, item_id, category,
            success, score), then run_id, cell_key, row, variant, the tag columns (reduction,
            temperature, budget, backbone, decoding) and one text column per axis key of the
            spec (the value in the cell's resolved config, written as ``--set`` text). A cell
            that stands for several variants (a sweep's shared default) contributes one copy of
            its items per variant, so every variant of every table row has its runs.
``runs``    one row per (cell, variant) of the matrix, finished or not: its state and ledger run
            (:data:`RUN_COLUMNS`), the compute it used (wall-clock, node- and CPU-core-hours,
            sessions) and the run-level costs ``interactions`` (environment interactions of
            training, see :func:`run_interactions`) and ``wall_clock`` (= wall_clock_hours).
``missing`` the cells without results (not FINISHED, or FINISHED without an items artifact),
            each with its state and reason, in matrix order.

Reading is per run (not :func:`factor_cli.ledger.report.export_items`): the runs of a sweep share
(env, method, seed) and the study tags, so only the cell key tells them apart.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .matrix import Cell, Matrix, override_text
from .state import CellState

if TYPE_CHECKING:
    import pandas as pd

ITEMS_ARTIFACT = "items/eval_items.csv"
ITEM_COLUMNS = ("env", "method", "seed", "item_id", "category", "success", "score")
TAG_COLUMNS = ("reduction", "temperature", "budget", "backbone", "decoding")  # trainer tags
INTERACTION_METRICS = ("root_interactions", "continuation_interactions")
RUN_COLUMNS = (
    "cell_key", "label", "variant", "row", "method", "env", "seed", "state", "run_id",
    "attempts", "failures", "wall_clock_hours", "node_hours", "cpu_core_hours", "sessions",
    "git_commit", "git_commits", "reason", "interactions", "wall_clock",
)  # fmt: skip


@dataclass(frozen=True)
class MissingCell:
    """A cell without results: its label (``variant/env/seed``), state and why."""

    label: str
    state: str
    reason: str = ""


@dataclass(frozen=True, eq=False)
class StudyResults:
    """What the ledger holds for a study's matrix (see the module docstring)."""

    items: pd.DataFrame
    runs: pd.DataFrame
    missing: tuple[MissingCell, ...]
    axes: tuple[str, ...]  # the axis columns of ``items``, in spec order

    @property
    def finished_cells(self) -> int:
        """Cells whose items are in ``items``."""
        return int(self.items["cell_key"].nunique()) if len(self.items) else 0


def config_value(cell: Cell, dotted: str) -> str:
    """The value of ``dotted`` (e.g. ``rollout.temperature``) in the cell's config, as text."""
    node: Any = cell.config
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return "" if node is None else override_text(node)


def git_commits(tags: dict[str, str]) -> list[str]:
    """Every git commit a run's sessions ran: ``git_commit`` and each ``session.N.git_commit``."""
    first = [tags["git_commit"]] if tags.get("git_commit") else []
    later = [v for k, v in sorted(tags.items()) if k.startswith("session.") and
             k.endswith(".git_commit") and v]  # fmt: skip
    return list(dict.fromkeys(first + later))


def run_interactions(client: Any, run_id: str) -> float:
    """Environment interactions of a run: sum_k (root_interactions_k + continuation_interactions_k).

    k runs over the training steps in the run's metric history; a step logged twice (a resumed
    session repeating the steps after its checkpoint) counts once, with its latest value. NaN
    when the run logged neither metric.
    """
    total, found = 0.0, False
    for key in INTERACTION_METRICS:
        latest: dict[int, tuple[int, float]] = {}  # step -> (timestamp, value)
        for m in client.get_metric_history(run_id, key):
            if m.step not in latest or m.timestamp >= latest[m.step][0]:
                latest[m.step] = (m.timestamp, float(m.value))
        found = found or bool(latest)
        total += sum(v for _, v in latest.values())
    return total if found else math.nan


def _run_rows(cell: Cell, state: CellState, interactions: float) -> list[dict[str, Any]]:
    """One :data:`RUN_COLUMNS` row per variant the cell serves."""
    from factor_cli.ledger.runs import T_SESSION

    hours = state.hours or {"wall_clock_hours": 0.0, "node_hours": 0.0, "cpu_core_hours": 0.0}
    sessions = int(float(state.tags.get(T_SESSION, 1))) if state.run_id else 0
    common = {
        "cell_key": cell.key, "method": cell.method, "env": cell.env, "seed": cell.seed,
        "state": state.state, "run_id": state.run_id or "", "attempts": state.attempts,
        "failures": state.failures, **hours, "sessions": sessions,
        "git_commit": state.git_commit, "git_commits": " ".join(git_commits(state.tags)),
        "reason": state.reason, "interactions": interactions,
        "wall_clock": hours["wall_clock_hours"],
    }  # fmt: skip
    return [
        {**common, "label": f"{variant}/{cell.env}/{cell.seed}", "variant": variant, "row": row}
        for (row, _), variant in zip(cell.serves, cell.variants, strict=True)
    ]


def _cell_items(
    cell: Cell, state: CellState, local: Path, axes: Sequence[str]
) -> pd.DataFrame | str:
    """The cell's items, one copy per variant, with its study columns; or why there are none."""
    import pandas as pd

    from factor_cli.stats.io import read_frame

    try:
        items = read_frame(local)
    except ValueError as exc:
        return f"run {state.run_id}: {ITEMS_ARTIFACT}: {exc}"
    missing = [c for c in ITEM_COLUMNS if c not in items.columns]
    if missing:
        return f"run {state.run_id}: {ITEMS_ARTIFACT} lacks the column {missing[0]!r}"
    base = items[list(ITEM_COLUMNS)].assign(run_id=state.run_id, cell_key=cell.key)
    for tag in TAG_COLUMNS:
        base[tag] = state.tags.get(tag, "")
    for key in axes:
        base[key] = config_value(cell, key)
    copies = [
        base.assign(row=row, variant=variant)
        for (row, _), variant in zip(cell.serves, cell.variants, strict=True)
    ]
    return pd.concat(copies, ignore_index=True)


def _empty_items(axes: Sequence[str]) -> pd.DataFrame:
    import pandas as pd

    columns = [*ITEM_COLUMNS, "run_id", "cell_key", "row", "variant", *TAG_COLUMNS, *axes]
    return pd.DataFrame(columns=list(dict.fromkeys(columns)))


def _client(matrix: Matrix, states: Sequence[CellState]) -> Any:
    """The ledger's client, or None when no cell has a run (the store may not exist yet)."""
    if not any(s.run_id for s in states):
        return None
    from factor_cli.ledger.store import open_client, resolve_tracking_uri

    return open_client(resolve_tracking_uri(matrix.tracking_uri), create=False)


def gather(matrix: Matrix, states: Sequence[CellState]) -> StudyResults:
    """Items, runs and missing cells of ``matrix`` given its ``states`` (:func:`matrix_states`).

    Raises:
        LedgerError: the store cannot be read.
        ValueError: ``states`` is not one state per cell of the matrix, in order.
    """
    import pandas as pd

    from factor_cli.stats.io import validate_results

    if [s.key for s in states] != [c.key for c in matrix.cells]:
        raise ValueError("states must be matrix_states(matrix): one per cell, in matrix order")
    axes = tuple(matrix.spec.axes)
    client = _client(matrix, states)
    frames, runs, missing = [], [], []
    with tempfile.TemporaryDirectory(prefix="factor-study-items-") as tmp:
        for i, (cell, state) in enumerate(zip(matrix.cells, states, strict=True)):
            interactions = run_interactions(client, state.run_id) if state.run_id else math.nan
            runs += _run_rows(cell, state, interactions)
            if state.state != "finished":
                missing.append(MissingCell(cell.label, state.state, state.reason))
                continue
            got = _download(client, state.run_id, Path(tmp) / str(i))
            if isinstance(got, Path):
                got = _cell_items(cell, state, got, axes)
            if isinstance(got, str):
                missing.append(MissingCell(cell.label, "finished", got))
                continue
            frames.append(got)
    items = pd.concat(frames, ignore_index=True) if frames else _empty_items(axes)
    if frames:
        items = validate_results(items, ("variant",))
    runs_frame = pd.DataFrame(runs, columns=list(RUN_COLUMNS))
    return StudyResults(items, runs_frame, tuple(missing), axes)


def _download(client: Any, run_id: str | None, folder: Path) -> Path | str:
    """The run's items artifact downloaded into ``folder``, or why it could not be."""
    folder.mkdir(parents=True)
    try:
        return Path(client.download_artifacts(run_id, ITEMS_ARTIFACT, str(folder)))
    except Exception:  # MLflow raises several types for an absent artifact
        return f"run {run_id} is FINISHED but has no {ITEMS_ARTIFACT}"
