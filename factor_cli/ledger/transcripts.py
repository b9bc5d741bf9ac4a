"""Transcripts: what the agent did, episode by episode, with the credit each action and token got.

A training run writes (rank 0 only; :mod:`factor_cli.train.run`) into its run folder
``<output_dir>/<run id>/transcripts/`` and into the MLflow run's artifacts under the same name:

    step-<k:06d>.jsonl   sample root episodes of training step k (``transcripts.episodes_per_step``)
    eval-<k:06d>.jsonl   every episode of the evaluation after step k (0: the starting policy)

One JSON object per line, one line per episode (:class:`EpisodeRecord`, schema version
:data:`VERSION`). Each file is written whole to a temporary file and renamed (a crash leaves the
previous file or none), and rewritten whole when a resumed run replays a step, so a step never
appears twice. A reader still tolerates a torn last line (a file copied while being written, a
full disk): it is skipped and flagged (:attr:`Transcript.torn`); a bad line before the last one
is an error naming the file and line.

Per episode: kind (step | eval), step, position in its file, instance, group, category,
outcome G_i, success, raw score, A^seq_i and V~(x_0) (training episodes; null in an eval),
and per turn t: the prompt x_t as decoded text, the observation, the reply, the executable
action, validity, the feedback Phi_t, the reward r_t, the admissible actions shown, the credit
A*_t (the method's per-action credit), V_target(x_t) (null without a value head), and the
reply's tokens with their action mask and allocation weight omega_{t,j} (SERL: w_{t,j}; null
for non-action tokens and in an eval).

This module holds the schema (the writer in :mod:`factor_cli.rollout.transcripts` builds these
records) and reading a run's transcripts back from the ledger (``factor ledger show``).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .store import (
    DEFAULT_EXPERIMENT,
    LedgerError,
    first_line,
    get_experiment_id,
    open_client,
    resolve_tracking_uri,
)

VERSION = 1
TRANSCRIPTS_DIR = "transcripts"  # in the run folder and in the MLflow run's artifacts
KINDS = ("step", "eval")
_NAME = re.compile(r"^(step|eval)-(\d+)\.jsonl$")
RUN_ID_CHARS = frozenset("0123456789abcdef")
RUN_ID_LENGTH = 32  # MLflow's run ids: 32 lower-case hex digits


class TranscriptError(LedgerError):
    """A run without transcripts, an unknown step or episode, or an unreadable file."""


def file_name(kind: str, step: int) -> str:
    """``step-000003.jsonl`` / ``eval-000000.jsonl``: the file of ``kind`` after step ``step``."""
    if kind not in KINDS:
        raise ValueError(f"transcript kind {kind!r}: unknown; valid: {', '.join(KINDS)}")
    return f"{kind}-{step:06d}.jsonl"


def parse_name(name: str) -> tuple[str, int] | None:
    """(kind, step) of a transcript file name, None for any other file."""
    m = _NAME.match(name)
    return (m.group(1), int(m.group(2))) if m else None


# ----------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class TurnRecord:
    """One turn t of an episode: context, reply, action, environment reply, credit."""

    t: int
    prompt: str
    """x_t as the model saw it (the decoded prompt token ids, truncation included)."""
    observation: str
    reply: str
    action: str
    valid: bool
    feedback: str
    """Phi_t: the environment's reply to the action."""
    reward: float
    done: bool
    admissible: list[str]
    """The admissible actions the prompt showed (empty when the prompt shows none)."""
    tokens: list[str]
    """The reply's tokens as text (their concatenation is the reply)."""
    action_mask: list[bool]
    """Per token: part of the executable action (the action-token branch of the loss)."""
    weights: list[float | None]
    """Per token: allocation weight omega_{t,j} (mean 1 over the action's tokens under APM);
    None for non-action tokens (their branch has coefficient A^seq_i) and in an eval."""
    credit: float | None = None
    """A*_t, the method's per-action credit (None in an eval)."""
    value: float | None = None
    """V_target(x_t) of the value head (None without one, and in an eval)."""
    prompt_truncated: bool = False

    @property
    def mean_weight(self) -> float | None:
        """w-bar_t = mean_j of the action tokens' weights (1 under APM), None without weights."""
        w = [x for x in self.weights if x is not None]
        return sum(w) / len(w) if w else None


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode of a transcript file (one JSON line)."""

    kind: str
    """``step`` (a training step's sample) or ``eval``."""
    step: int
    """Training step k (1-based); for an eval, the steps trained before it (0: the start)."""
    episode: int
    """Position in its file: what ``factor ledger show --episode`` takes."""
    instance: str
    group: int
    outcome: float
    """G_i on the environment convention's scale."""
    success: bool
    score: float
    turns: list[TurnRecord]
    category: str | None = None
    a_seq: float | None = None
    """A^seq_i (training episodes)."""
    v0: float | None = None
    """V~(x_0), the TAC boundary potential (b_i or 0; training episodes)."""
    task: str = ""
    error: str | None = None
    """Why the episode was cut short, if it was."""
    trajectory: int | None = None
    """Index of the trajectory in its step's packed batch (training episodes)."""
    version: int = field(default=VERSION)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def credit_sum(self) -> float | None:
        """sum_t A*_t (equals A^seq_i for conserving credit), None without credit."""
        c = [t.credit for t in self.turns if t.credit is not None]
        return sum(c) if c else None


def _build(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` with a one-line error naming ``where`` and the missing or extra key."""
    if not isinstance(data, dict):
        raise TranscriptError(f"{where}: expected a JSON object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is f.default_factory is MISSING}
    missing = sorted(required - data.keys())
    if missing:
        raise TranscriptError(f"{where}: missing field {missing[0]!r} of {cls.__name__}")
    return cls(**{k: v for k, v in data.items() if k in names})  # newer writers' extras: ignored


def episode_from_json(data: Any, where: str) -> EpisodeRecord:
    """Parse one line's object; ``where`` (file and line) names it in errors."""
    ep = _build(EpisodeRecord, data, where)
    turns = [_build(TurnRecord, t, f"{where} turn {i}") for i, t in enumerate(ep.turns)]
    return EpisodeRecord(**{**{f.name: getattr(ep, f.name) for f in fields(ep)}, "turns": turns})


def to_jsonl(records: Iterable[EpisodeRecord]) -> str:
    """The file text: one compact JSON object per line, newline-terminated."""
    return "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in records)


def parse_jsonl(text: str, name: str) -> tuple[list[EpisodeRecord], bool]:
    """(episodes, torn) of a transcript file's text.

    A last line that is not valid JSON (or lacks its newline and does not parse) is a torn
    write: skipped, and ``torn`` is True. A bad line before it raises :class:`TranscriptError`.
    """
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]  # tail: text after the last newline ("" if none)
    out: list[EpisodeRecord] = []
    torn = False
    rows = [*complete, *([tail] if tail.strip() else [])]
    for n, line in enumerate(rows, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(rows):
                torn = True
                break
            raise TranscriptError(f"{name} line {n}: not JSON ({exc.msg})") from None
        out.append(episode_from_json(data, f"{name} line {n}"))
    return out, torn


# ----------------------------------------------------------------------------- reading a run


@dataclass(frozen=True)
class Transcript:
    """The episodes of one transcript file of a run."""

    run_id: str
    kind: str
    step: int
    episodes: list[EpisodeRecord]
    torn: bool
    """The file's last line was a torn write and was skipped."""


@dataclass(frozen=True)
class TranscriptIndex:
    """Which transcript files a run has: training steps and evaluations, ascending."""

    run_id: str
    steps: list[int]
    evals: list[int]

    def of(self, kind: str) -> list[int]:
        return self.steps if kind == "step" else self.evals


def _client(tracking_uri: str | None) -> tuple[str, Any]:
    uri = resolve_tracking_uri(tracking_uri)
    return uri, open_client(uri, create=False)


def find_run(
    run: str, tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT
) -> str:
    """The full id of the ledger run ``run`` (a whole run id, or a unique prefix of one).

    Raises:
        TranscriptError: not a run id, no run or several runs match (the message says which).
    """
    uri, client = _client(tracking_uri)
    return _find_run(client, uri, run, experiment)


def _find_run(client: Any, uri: str, run: str, experiment: str) -> str:
    prefix = run.strip().lower()
    if not prefix or not set(prefix) <= RUN_ID_CHARS or len(prefix) > RUN_ID_LENGTH:
        raise TranscriptError(
            f"run {run!r}: not a ledger run id (32 hex digits, or a prefix of one); "
            "`factor ledger list` shows the runs"
        )
    if len(prefix) == RUN_ID_LENGTH:
        try:
            return str(client.get_run(prefix).info.run_id)
        except Exception:
            raise TranscriptError(f"run {run}: no such run in {uri}") from None
    exp_id = get_experiment_id(client, experiment, uri, create=False)
    ids: list[str] = []
    token = None
    while exp_id is not None:
        page = client.search_runs([exp_id], max_results=1000, page_token=token)
        ids += [r.info.run_id for r in page if r.info.run_id.startswith(prefix)]
        token = page.token
        if not token:
            break
    if not ids:
        raise TranscriptError(
            f"run {run}: no run id starts with it in {uri} (experiment {experiment}); "
            "`factor ledger list` shows the runs"
        )
    if len(ids) > 1:
        shown = ", ".join(sorted(i[:12] for i in ids)[:4])
        raise TranscriptError(
            f"run {run}: ambiguous, {len(ids)} runs start with it ({shown}...); give more digits"
        )
    return ids[0]


def transcript_index(run_id: str, tracking_uri: str | None = None) -> TranscriptIndex:
    """The transcript files logged to run ``run_id`` (a full id).

    Raises:
        TranscriptError: the run logged none (it predates transcripts, or recorded none).
    """
    return _index(_client(tracking_uri)[1], run_id)


def artifact_names(
    client: Any, run_id: str, folder: str, error: type[LedgerError] = LedgerError
) -> list[str]:
    """The file names in the run's artifact ``folder`` (none when it is absent); a store that
    cannot list them raises ``error`` in one line."""
    try:
        listed = client.list_artifacts(run_id, folder)
    except Exception as exc:
        raise error(f"run {run_id}: cannot list its artifacts ({first_line(exc)})") from None
    return [Path(f.path).name for f in listed if not f.is_dir]


def _index(client: Any, run_id: str) -> TranscriptIndex:
    names = artifact_names(client, run_id, TRANSCRIPTS_DIR, TranscriptError)
    found = [p for p in (parse_name(name) for name in names) if p]
    steps = sorted(k for kind, k in found if kind == "step")
    evals = sorted(k for kind, k in found if kind == "eval")
    if not steps and not evals:
        raise TranscriptError(
            f"run {run_id}: no transcripts in its artifacts ({TRANSCRIPTS_DIR}/); it predates "
            "them or ran with transcripts.episodes_per_step=0 and transcripts.eval=false"
        )
    return TranscriptIndex(run_id, steps, evals)


def read_transcript(
    run_id: str, kind: str, step: int, tracking_uri: str | None = None
) -> Transcript:
    """The episodes of ``kind`` (step | eval) after step ``step`` of run ``run_id``."""
    return _read(_client(tracking_uri)[1], run_id, kind, step)


def _read(client: Any, run_id: str, kind: str, step: int) -> Transcript:
    name = file_name(kind, step)
    with tempfile.TemporaryDirectory(prefix="factor-transcript-") as tmp:
        try:
            local = client.download_artifacts(run_id, f"{TRANSCRIPTS_DIR}/{name}", tmp)
            text = Path(local).read_text(encoding="utf-8")
        except Exception as exc:
            raise TranscriptError(
                f"run {run_id}: cannot read {TRANSCRIPTS_DIR}/{name} ({first_line(exc)})"
            ) from None
    episodes, torn = parse_jsonl(text, f"{TRANSCRIPTS_DIR}/{name}")
    return Transcript(run_id, kind, step, episodes, torn)


def open_transcript(
    run: str,
    step: int | None = None,
    evaluation: bool = False,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> tuple[Transcript, TranscriptIndex]:
    """The transcript ``factor ledger show`` asks for: run id or prefix, training step (default:
    the last one recorded) or, with ``evaluation``, the evaluation after that step (default: the
    last evaluation; 0 is the starting policy's).

    Raises:
        TranscriptError: bad run, no transcripts, or no file for that step (the message lists
            the steps there are).
    """
    uri, client = _client(tracking_uri)
    run_id = _find_run(client, uri, run, experiment)
    index = _index(client, run_id)
    kind = "eval" if evaluation else "step"
    have = index.of(kind)
    what = "evaluations" if evaluation else "training steps"
    if not have:
        raise TranscriptError(f"run {run_id}: no {what} recorded in its transcripts")
    k = have[-1] if step is None else step
    if k not in have:
        raise TranscriptError(
            f"--step {k}: run {run_id[:12]} has no {'evaluation' if evaluation else 'step'} "
            f"transcript there; {what} recorded: {ranges(have)}"
        )
    return _read(client, run_id, kind, k), index


def ranges(steps: list[int]) -> str:
    """``1-4, 6, 8-9``: a compact list of sorted integers."""
    out: list[str] = []
    lo = prev = steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        out.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if s is not None:
            lo = prev = s
    return ", ".join(out)
