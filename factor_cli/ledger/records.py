"""Diagnostic records of training runs, read back from the ledger (``factor diagnose``).

A training run logs, for every step k, ``records/actions-<k:06d>.csv`` and
``records/continuations-<k:06d>.csv`` (columns in :mod:`factor_cli.rollout.action_records`);
each file is written whole and renamed into place, so a step's file is complete or absent.

:func:`load_records` takes run ids (a unique prefix is enough) and study names, and returns one
frame of actions and one of continuations over all their training runs, each row tagged with the
run's ``run_id``, ``study``, ``method``, ``env`` and ``seed``.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .report import _open, _quote, _search
from .store import DEFAULT_EXPERIMENT, LedgerError
from .transcripts import RUN_ID_CHARS, _find_run, artifact_names

RECORDS_DIR = "records"  # in the run folder and in the MLflow run's artifacts
KINDS = ("actions", "continuations")
_NAME = re.compile(r"^(actions|continuations)-(\d+)\.csv$")
RUN_TAGS = ("study", "method", "env", "seed")


class RecordsError(LedgerError):
    """A run or study without records, or a step range outside what they hold."""


def record_name(kind: str, step: int) -> str:
    """``actions-000003.csv`` / ``continuations-000003.csv``: the records of step ``step``."""
    if kind not in KINDS:
        raise ValueError(f"record kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return f"{kind}-{step:06d}.csv"


@dataclass
class Records:
    actions: pd.DataFrame
    """One row per action of every recorded step, plus the run's tags."""
    continuations: pd.DataFrame
    """One row per continuation, plus the run's tags."""
    runs: pd.DataFrame
    """One row per run read: run_id, :data:`RUN_TAGS` and run_dir (:func:`run_folder`; empty
    when the folder is not on this machine)."""


def load_records(
    targets: list[str],
    steps: tuple[int, int] | None = None,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> Records:
    """The records of the runs named by ``targets`` (run ids or prefixes, or study names),
    restricted to training steps ``steps`` = (first, last) inclusive when given.

    Raises:
        RecordsError: an unknown run or study, a run that wrote no records, or a step range
            that selects nothing in some run.
    """
    uri, client, exp_id = _open(tracking_uri, experiment)
    runs: dict[str, Any] = {}
    for target in targets:
        for run in _runs_of(client, uri, exp_id, target, experiment):
            runs[run.info.run_id] = run
    actions, conts, rows = [], [], []
    for run_id, run in runs.items():
        tags = {t: run.data.tags.get(t, "") for t in RUN_TAGS}
        a, c = _read_run(client, run_id, steps)
        actions.append(a.assign(run_id=run_id, **tags))
        conts.append(c.assign(run_id=run_id, **tags))
        rows.append({"run_id": run_id, **tags, "run_dir": str(run_folder(run) or "")})
    return Records(pd.concat(actions, ignore_index=True), pd.concat(conts, ignore_index=True),
                   pd.DataFrame(rows))  # fmt: skip


def run_folder(run: Any) -> Path | None:
    """The run's folder ``<output_dir>/<run id>`` on this machine: ``output_dir`` (a param) as
    given, relative to the working folder or else to a folder above the run's config file (a
    study cell's config lives under the study's output folder)."""
    output_dir = run.data.params.get("output_dir")
    if not output_dir:
        return None
    source = run.data.tags.get("config_source", "")
    roots = [Path.cwd(), *(Path(source).parents if Path(source).is_absolute() else [])]
    for root in roots:
        folder = root / output_dir / run.info.run_id
        if folder.is_dir():
            return folder.resolve()
    return None


def _runs_of(client: Any, uri: str, exp_id: str | None, target: str, experiment: str) -> list:
    """The training runs a target names: one run (an id or prefix), or a study's runs."""
    if exp_id is None:
        raise RecordsError(f"{target}: the ledger at {uri} has no runs")
    looks_like_id = bool(target) and set(target.lower()) <= RUN_ID_CHARS
    if not looks_like_id or len(target) < 6:
        found = [
            r
            for r in _search(client, exp_id, f"tags.study = {_quote(target)}")
            if r.data.tags.get("kind", "train") == "train"
        ]
        if found:
            return found
        if not looks_like_id:
            raise RecordsError(
                f"{target}: no run id or study of that name in {uri}; `factor ledger list` "
                "shows the runs and their studies"
            )
    return [client.get_run(_find_run(client, uri, target, experiment))]


def _read_csv(path: str) -> pd.DataFrame:
    """A records file; only an empty field is missing (an action's text may read "None")."""
    frame = pd.read_csv(path, dtype={"instance": str}, keep_default_na=False, na_values=[""])
    if "action" in frame:
        frame["action"] = frame["action"].fillna("").astype(str)
    return frame


def _read_run(
    client: Any, run_id: str, steps: tuple[int, int] | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    names = artifact_names(client, run_id, RECORDS_DIR, RecordsError)
    found = [m for m in (_NAME.match(name) for name in names) if m]
    if not found:
        raise RecordsError(
            f"run {run_id[:12]}: no diagnostic records ({RECORDS_DIR}/); it predates them, ran "
            "with transcripts.records=false, or is an eval run"
        )
    have = sorted({int(m.group(2)) for m in found})
    if steps is not None:
        chosen = [k for k in have if steps[0] <= k <= steps[1]]
        if not chosen:
            raise RecordsError(
                f"run {run_id[:12]}: no recorded step in {steps[0]}:{steps[1]}; it has steps "
                f"{have[0]}-{have[-1]}"
            )
        have = chosen
    frames: dict[str, list[pd.DataFrame]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="factor-records-") as tmp:
        for m in found:
            if int(m.group(2)) not in have:
                continue
            local = client.download_artifacts(run_id, f"{RECORDS_DIR}/{m.group(0)}", tmp)
            frames[m.group(1)].append(_read_csv(local))
    return tuple(  # type: ignore[return-value]
        pd.concat(frames[k], ignore_index=True) if frames[k] else pd.DataFrame() for k in KINDS
    )
