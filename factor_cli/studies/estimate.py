"""What the pending cells of a study will cost, from the ledger's past runs.

For a pending cell the estimate is the mean wall-clock, node- and CPU-core-hours of FINISHED
training runs like it, most specific first:

1. runs of the same study and variant (row and axis point, any seed: tag ``study.variants``)
   on the same env and base, since a study's axis (the horizon, a budget) can change a cell's
   cost tenfold;
2. else runs of the same method and env started from the same base (the tag ``study.base`` of
   a study cell, ``config_source`` of a plain ``factor train``), in any study.

Cells with no such past run are counted as unknown, never guessed.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from .matrix import Cell, Matrix
from .state import T_BASE, T_VARIANTS, CellState, _hours, search_runs

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


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    return {h: sum(r[h] for r in runs) / len(runs) for h in HOURS}


@dataclass
class PastCosts:
    """Mean hours of finished training runs, by (study, variant, env, base) and by
    (method, env, base)."""

    by_variant: dict[tuple[str, str, str, str], dict[str, float]] = field(default_factory=dict)
    by_method: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)

    def of(self, study: str, cell: Cell, base: str) -> dict[str, float] | None:
        """The cell's estimate (None: no past run like it)."""
        for variant in cell.variants:
            found = self.by_variant.get((study, variant, cell.env, base))
            if found is not None:
                return found
        return self.by_method.get((cell.method, cell.env, base))


def past_costs(tracking_uri: str | None) -> PastCosts:
    """Mean hours of the ledger's finished training runs (:class:`PastCosts`)."""
    variants: dict[tuple[str, str, str, str], list[dict[str, float]]] = {}
    methods: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for run in search_runs(tracking_uri, "attributes.status = 'FINISHED'"):
        tags = run.data.tags
        source = tags.get(T_BASE) or tags.get(T_SOURCE)
        if tags.get("kind", "train") != "train" or not source:
            continue
        base, env, hours = source_id(source), tags.get("env", ""), _hours(tags)
        methods.setdefault((tags.get("method", ""), env, base), []).append(hours)
        for variant in _variants(tags):
            variants.setdefault((tags.get("study", ""), variant, env, base), []).append(hours)
    return PastCosts(
        {k: _mean(v) for k, v in variants.items()}, {k: _mean(v) for k, v in methods.items()}
    )


def _variants(tags: dict[str, str]) -> list[str]:
    try:
        found = json.loads(tags.get(T_VARIANTS, "[]"))
    except ValueError:
        return []  # a hand-edited tag: the run still counts by method
    return [v for v in found if isinstance(v, str)] if isinstance(found, list) else []


def estimate_pending(matrix: Matrix, states: list[CellState]) -> dict[str, Any]:
    """``pending`` cells, how many have a past cost (``known``) and the summed estimate."""
    pending = [st for st in states if st.state in ("pending", "failed", "killed", "stale")]
    costs = past_costs(matrix.tracking_uri) if pending else PastCosts()
    out: dict[str, Any] = {"pending": len(pending), "known": 0, **dict.fromkeys(HOURS, 0.0)}
    for st in pending:
        assert st.cell is not None
        past = costs.of(matrix.spec.name, st.cell, source_id(matrix.base))
        if past is None:
            continue
        out["known"] += 1
        for h in HOURS:
            out[h] += past[h]
    return out
