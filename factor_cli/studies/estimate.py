"""What the pending cells of a study will cost, from the ledger's past runs.

For a pending cell of (method, env, base) the estimate is the mean wall-clock, node- and
CPU-core-hours of the FINISHED training runs of the same method and env started from the same
base (the tag ``study.base`` of a study cell, ``config_source`` of a plain ``factor train``), in
any study. Cells with no such past run are counted as unknown, never guessed.
"""

from __future__ import annotations

import functools
from typing import Any

from .matrix import Matrix
from .state import T_BASE, CellState, _hours, search_runs

HOURS = ("wall_clock_hours", "node_hours", "cpu_core_hours")
T_SOURCE = "config_source"  # the --config of a plain `factor train`


@functools.lru_cache(maxsize=256)
def source_id(source: str) -> str:
    """One name per config source: a shipped preset's name (``smoke`` and
    ``experiments/smoke.yaml`` are one base), else the YAML's absolute path."""
    from factor_cli.resources import presets_dir
    from factor_cli.train.config import ConfigError, resolve_source

    try:
        path = resolve_source(source).resolve()
    except ConfigError:
        return source  # a file gone since: its text is all there is
    return path.stem if path.parent == presets_dir().resolve() else str(path)


def past_costs(tracking_uri: str | None) -> dict[tuple[str, str, str], dict[str, float]]:
    """Mean hours of finished training runs by (method, env, base)."""
    sums: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for run in search_runs(tracking_uri, "attributes.status = 'FINISHED'"):
        tags = run.data.tags
        source = tags.get(T_BASE) or tags.get(T_SOURCE)
        if tags.get("kind", "train") != "train" or not source:
            continue
        base = source_id(source)
        sums.setdefault((tags.get("method", ""), tags.get("env", ""), base), []).append(
            _hours(tags)
        )
    return {k: {h: sum(r[h] for r in v) / len(v) for h in HOURS} for k, v in sums.items()}


def estimate_pending(matrix: Matrix, states: list[CellState]) -> dict[str, Any]:
    """``pending`` cells, how many have a past cost (``known``) and the summed estimate."""
    pending = [st for st in states if st.state in ("pending", "failed", "killed", "stale")]
    costs = past_costs(matrix.tracking_uri) if pending else {}
    out: dict[str, Any] = {"pending": len(pending), "known": 0, **dict.fromkeys(HOURS, 0.0)}
    for st in pending:
        assert st.cell is not None
        past = costs.get((st.cell.method, st.cell.env, source_id(matrix.base)))
        if past is None:
            continue
        out["known"] += 1
        for h in HOURS:
            out[h] += past[h]
    return out
