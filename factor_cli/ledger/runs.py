"""One training or evaluation run as one MLflow run: ``start_run`` and :class:`LedgerRun`.

Usage (the trainer)::

    with start_run(cfg, study="main", method="factor", env="twx", seed=0,
                   backbone="tiny-1m", gpus=0, resume_run_id=ckpt.run_id) as run:
        for step in ...:
            run.log_metrics({"return/mean": r, "kl": kl}, step)   # one log_batch call
        run.log_items(eval_items)                                  # items/eval_items.csv

What gets recorded
  params   the resolved config flattened to ``a.b.c`` keys, values as text (JSON for lists,
           booleans and None); values longer than MLflow's 6,000 characters are cut with a
           marker (the full config is the ``config.json`` artifact).
  tags     study, method, env, seed, backbone, kind (train | eval), git_commit, git_dirty,
           config_hash (``TrainConfig.digest()`` for a training config), split.<file>
           (manifest digests from ``splits.lock``), hardware, gpus, cpu_cores, plus any
           ``tags=`` given (study columns such as reduction or budget go there).
  metrics  per step, as given; at every close ``wall_clock_hours``, ``node_hours`` and
           ``cpu_core_hours`` with step = session number (1, 2, ... across resumes).
  status   FINISHED (clean exit), FAILED (an exception; tag ``error`` and artifact ``error.txt``),
           KILLED (KeyboardInterrupt or SIGTERM); a SIGKILLed process leaves RUNNING.

Compute accounting (the paper's unit): node_hours = wall-clock hours x GPUs / 8, i.e. one 8-GPU
node for one hour; 0 on CPU. cpu_core_hours = wall-clock hours x cores used. Both are
accumulated as seconds in the tags ``ledger.wall_clock_seconds``, ``ledger.gpu_seconds`` and
``ledger.cpu_core_seconds``, written with every ``log_metrics``/``heartbeat`` (inside the same
``log_batch`` call), so a resumed run continues the sum and a SIGKILLed one keeps the time up to
its last log; a resume on different hardware accounts each session with its own GPU count.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import posixpath
import re
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from factor_cli import __version__

from . import provenance as prov
from .store import (
    DEFAULT_EXPERIMENT,
    LedgerError,
    first_line,
    get_experiment_id,
    open_client,
    resolve_tracking_uri,
)

if TYPE_CHECKING:
    import pandas as pd
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

GPUS_PER_NODE = 8  # the paper's node: 8 GPUs
LEDGER_VERSION = "1"
MAX_KEY = 250  # MLflow's limit on param/metric/tag key length
MAX_PARAM_VALUE = 6000  # MLflow's limit on a param value
MAX_TAG_VALUE = 8000  # MLflow's limit on a tag value
ITEMS_DIR = "items"  # artifact folder of item-level evaluation results
IDENTITY_TAGS = ("study", "method", "env", "seed", "backbone")
# What a run is (the tag ``kind``): a training run (whose final evaluation is the study's
# result) or a stand-alone evaluation of a checkpoint (``factor eval``). Runs logged before the
# tag existed are training runs.
RUN_KINDS = ("train", "eval")
DEFAULT_KIND = "train"
# Accounting tags (accumulated over sessions).
T_WALL = "ledger.wall_clock_seconds"
T_GPU = "ledger.gpu_seconds"
T_CORE = "ledger.cpu_core_seconds"
T_SESSION = "ledger.session"
T_HEARTBEAT = "ledger.heartbeat"
T_NONFINITE = "ledger.nonfinite_skipped"
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")
_clock = time.monotonic  # wall clock of a session (module-level so tests can drive it)


class RunTerminated(KeyboardInterrupt):
    """Raised in the main thread by the ledger's SIGTERM handler so the run is closed KILLED."""


# ----------------------------------------------------------------------------- keys and values


def safe_key(key: str) -> str:
    """An MLflow-valid key: bad characters become ``_``, path tricks are removed, <= 250 chars.

    Keys longer than the limit keep their first 240 characters and a hash of the whole key, so
    two long keys that share a prefix stay distinct.
    """
    out = _BAD_KEY_CHARS.sub("_", str(key)).strip() or "_"
    parts = [p if p not in ("", ".", "..") else "_" for p in out.split("/")]
    out = "/".join(parts)
    if posixpath.normpath(out) != out:
        out = out.replace("/", "_")
    if len(out) > MAX_KEY:
        digest = hashlib.sha256(out.encode("utf-8")).hexdigest()[:8]
        out = f"{out[: MAX_KEY - 10]}~{digest}"
    return out


def _cut(value: str, limit: int) -> tuple[str, bool]:
    """``value`` cut to ``limit`` characters with a marker naming its full length and hash."""
    if len(value) <= limit:
        return value, False
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]
    marker = f"...[cut: {len(value)} chars, sha256 {digest}]"
    return value[: limit - len(marker)] + marker, True


def param_text(value: Any) -> str:
    """A config value as MLflow param text: strings as is, everything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def flatten_config(config: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists stay one JSON value; ``{}`` is ``"{}"``."""
    data = prov.jsonable(config) if not prefix else config
    if not isinstance(data, dict):
        raise TypeError(f"the config must be a mapping, got {type(config).__name__}")
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten_config(value, f"{name}."))
        else:
            out[name] = param_text(value)
    return out


def _as_float(key: str, value: Any) -> float:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"metric {key!r} must be a number, got {type(value).__name__} {value!r}"
        ) from None


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------- the run


class LedgerRun:
    """An open MLflow run with the ledger's conventions; use it as a context manager.

    Attributes:
        run_id: the MLflow run id (store it in checkpoints; pass it back as ``resume_run_id``).
        tracking_uri: the store the run lives in.
        session: 1 for a new run, n+1 for the n-th resume.
        nonfinite: ``{metric key: count}`` of NaN/inf values skipped by :meth:`log_metrics`.
    """

    def __init__(
        self,
        client: MlflowClient,
        run_id: str,
        tracking_uri: str,
        *,
        identity: Mapping[str, str],
        gpus: int,
        cpu_cores: int,
        session: int,
        prior: Mapping[str, float],
        params: Mapping[str, str],
        nonfinite: Mapping[str, int] | None = None,
    ) -> None:
        self._client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.identity = dict(identity)
        self.gpus = gpus
        self.cpu_cores = cpu_cores
        self.session = session
        self.nonfinite: dict[str, int] = dict(nonfinite or {})
        self._prior = {k: float(prior.get(k, 0.0)) for k in (T_WALL, T_GPU, T_CORE)}
        self._params = dict(params)
        self._t0 = _clock()
        self._closed = False
        self._old_sigterm: Any = None
        self._sigterm_installed = False
        self._deferred_signals: list[int] = []

    # --------------------------------------------------------------- accounting

    def elapsed_seconds(self) -> float:
        """Wall-clock seconds of this session so far."""
        return _clock() - self._t0

    def accounting(self) -> dict[str, float]:
        """Accumulated seconds over all sessions: wall clock, GPU-seconds, core-seconds."""
        dt = self.elapsed_seconds()
        return {
            T_WALL: self._prior[T_WALL] + dt,
            T_GPU: self._prior[T_GPU] + dt * self.gpus,
            T_CORE: self._prior[T_CORE] + dt * self.cpu_cores,
        }

    def compute_hours(self) -> dict[str, float]:
        """``wall_clock_hours``, ``node_hours`` (x GPUs / 8) and ``cpu_core_hours`` so far."""
        acc = self.accounting()
        return {
            "wall_clock_hours": acc[T_WALL] / 3600.0,
            "node_hours": acc[T_GPU] / 3600.0 / GPUS_PER_NODE,
            "cpu_core_hours": acc[T_CORE] / 3600.0,
        }

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"ledger run {self.run_id} is closed; log inside its with-block")

    def _accounting_tags(self) -> list:
        from mlflow.entities import RunTag

        tags = {k: repr(round(v, 3)) for k, v in self.accounting().items()}
        tags[T_HEARTBEAT] = _utc_now()
        if self.nonfinite:
            tags[T_NONFINITE] = json.dumps(self.nonfinite, sort_keys=True)[:MAX_TAG_VALUE]
        return [RunTag(k, v) for k, v in tags.items()]

    # --------------------------------------------------------------- logging

    def log_params(self, config: Mapping[str, Any]) -> None:
        """Log a (nested) config as flattened params, skipping keys already logged unchanged.

        MLflow params are immutable: a key logged before with another value (a resume with an
        edited config) is not overwritten; the new value goes to the tag ``changed.<key>`` and
        a warning is logged. Keys are made MLflow-valid (:func:`safe_key`); values longer than
        6,000 characters are cut with a marker. Batches of 100 (MLflow's limit per request) go
        through one ``log_batch`` call.
        """
        from mlflow.entities import Param, RunTag

        self._check_open()
        params, changed, cut = [], [], 0
        for key, text in flatten_config(config).items():
            k = safe_key(key)
            value, was_cut = _cut(text, MAX_PARAM_VALUE)
            cut += was_cut
            if k not in self._params:
                params.append(Param(k, value))
                self._params[k] = value
            elif self._params[k] != value:
                changed.append(RunTag(safe_key(f"changed.{k}"), _cut(text, MAX_TAG_VALUE)[0]))
        if changed:
            log.warning(
                "run %s: %d param(s) differ from the values logged before (first: %s); kept "
                "the old values, new ones are in the tags changed.*",
                self.run_id,
                len(changed),
                changed[0].key[len("changed.") :],
            )
        tags = [*changed, RunTag("ledger.params_cut", str(cut))] if cut else changed
        self._client.log_batch(self.run_id, params=params, tags=tags)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log one step's metrics in ONE ``log_batch`` call (with the accounting tags).

        NaN and +-inf values are skipped and counted in :attr:`nonfinite` (and the tag
        ``ledger.nonfinite_skipped``). MLflow's client splits a call holding more than 1,000
        entities (metrics + tags) into several requests by itself.

        Raises:
            TypeError: a value is not a number; ValueError: ``step`` is not an integer >= 0 or
            two keys collide after :func:`safe_key`.
        """
        from mlflow.entities import Metric

        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        ts = int(time.time() * 1000)
        batch: dict[str, Metric] = {}
        for key, raw in metrics.items():
            value = _as_float(str(key), raw)
            k = safe_key(str(key))
            if not math.isfinite(value):
                self.nonfinite[k] = self.nonfinite.get(k, 0) + 1
                continue
            if k in batch:
                raise ValueError(f"metric keys collide after cleaning: {key!r} -> {k!r}")
            batch[k] = Metric(k, value, ts, step)
        self._client.log_batch(
            self.run_id, metrics=list(batch.values()), tags=self._accounting_tags()
        )

    def heartbeat(self) -> None:
        """Write the accumulated compute time now (e.g. during a long evaluation)."""
        self._check_open()
        self._client.log_batch(self.run_id, tags=self._accounting_tags())

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set tags (values as text, cut to MLflow's 8,000 characters) in one call."""
        from mlflow.entities import RunTag

        self._check_open()
        self._client.log_batch(
            self.run_id,
            tags=[RunTag(safe_key(k), _cut(str(v), MAX_TAG_VALUE)[0]) for k, v in tags.items()],
        )

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """Upload a file or a folder (recursively) into the run's artifacts."""
        self._check_open()
        p = Path(path)
        if p.is_dir():
            self._client.log_artifacts(self.run_id, str(p), artifact_path)
        elif p.is_file():
            self._client.log_artifact(self.run_id, str(p), artifact_path)
        else:
            raise FileNotFoundError(f"no such file or folder to log: {p}")

    def log_text(self, text: str, name: str) -> None:
        """Store ``text`` as the artifact ``name`` (may include folders: ``eval/notes.md``)."""
        self._check_open()
        self._client.log_text(self.run_id, text, name)

    def log_items(self, items: pd.DataFrame, name: str = "eval_items.csv") -> pd.DataFrame:
        """Store item-level evaluation results as ``items/<name>`` in the statistics schema.

        Columns env, method and seed may be omitted: they are filled from the run's tags; when
        present they must equal them. The frame is checked by
        :func:`factor_cli.stats.io.validate_results` (item_id, category, success 0/1, finite
        score, one row per item).

        Returns:
            The validated frame as written.

        Raises:
            ValueError: the name is not a ``.csv`` file name, or the frame breaks the schema
            or names another env, method or seed than the run.
        """
        from factor_cli.stats.io import validate_results

        self._check_open()
        if "/" in name or not name.endswith(".csv"):
            raise ValueError(f"items name {name!r} must be a plain file name ending in .csv")
        frame = items.copy()
        for position, column in enumerate(("env", "method", "seed")):
            expected = self.identity[column]
            if column not in frame.columns:
                frame.insert(position, column, int(expected) if column == "seed" else expected)
                continue
            other = frame[column].astype(str).str.strip() != expected
            if other.any():
                value = frame.loc[other, column].iloc[0]
                raise ValueError(
                    f"items column {column!r} has {value!r}, but this run is {column}={expected}"
                )
        frame = validate_results(frame)
        with tempfile.TemporaryDirectory(prefix="factor-items-") as tmp:
            path = Path(tmp) / name
            frame.to_csv(path, index=False)
            self._client.log_artifact(self.run_id, str(path), ITEMS_DIR)
        return frame

    # --------------------------------------------------------------- closing

    def end(self, status: str = "FINISHED", error: BaseException | None = None) -> None:
        """Close the run: final compute metrics, accounting tags, error (if any), status.

        Every step is attempted even if an earlier one fails (a failure is logged as a
        warning), so the status is always written when the store answers. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        from mlflow.entities import Metric, RunTag

        ts = int(time.time() * 1000)
        hours = self.compute_hours()
        metrics = [Metric(k, v, ts, self.session) for k, v in hours.items()]
        tags = self._accounting_tags()
        if error is not None:
            message = f"{type(error).__name__}: {first_line(error)}"
            tags.append(RunTag("error", _cut(message, MAX_TAG_VALUE)[0]))
        steps: list[tuple[str, Any]] = [
            ("final metrics", lambda: self._client.log_batch(self.run_id, metrics, tags=tags)),
        ]
        if error is not None:
            text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            steps.append(
                ("error.txt", lambda: self._client.log_text(self.run_id, text, "error.txt"))
            )
        steps.append(("status", lambda: self._client.set_terminated(self.run_id, status)))
        for what, call in steps:
            try:
                call()
            except Exception as exc:  # keep closing; the status matters most
                log.warning("ledger run %s: could not write %s: %s", self.run_id, what, exc)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        raise RunTerminated(f"terminated by signal {signum} (SIGTERM)")

    def _defer_signal(self, signum: int, frame: FrameType | None) -> None:
        self._deferred_signals.append(signum)

    def __enter__(self) -> LedgerRun:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._sigterm_installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):  # no interruption while closing
                held[sig] = signal.signal(sig, self._defer_signal)
        try:
            self.end(*status_of(exc))
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            if self._sigterm_installed:
                old = self._old_sigterm
                signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
                self._sigterm_installed = False
        if self._deferred_signals and exc is None:  # act on a signal that came while closing
            if signal.SIGINT in self._deferred_signals:
                raise KeyboardInterrupt
            raise RunTerminated("terminated by SIGTERM while closing the run")


class Heartbeat:
    """Write a run's heartbeat (and compute time) every ``every_s`` seconds from a thread.

    Steps log a heartbeat too, but a step (or the final evaluation) can last many minutes; a
    study tells a live remote cell from a dead one by this tag's age. A write that fails is
    logged and retried at the next beat, never raised into the training loop.
    """

    def __init__(self, run: LedgerRun, every_s: float = 60.0) -> None:
        self.run, self.every_s = run, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ledger-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.run.heartbeat()
            except Exception as exc:  # the store may be busy; the next beat tries again
                log.warning("ledger run %s: heartbeat failed: %s", self.run.run_id, exc)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def status_of(exc: BaseException | None) -> tuple[str, BaseException | None]:
    """(MLflow status, error to record) for the exception that ended a ``with`` block."""
    if exc is None:
        return "FINISHED", None
    if isinstance(exc, KeyboardInterrupt):
        return "KILLED", None
    code = exc.code if isinstance(exc, SystemExit) else getattr(exc, "exit_code", None)
    if (isinstance(exc, SystemExit) or code is not None) and code in (0, None):
        return "FINISHED", None  # sys.exit(0) / typer.Exit(0) inside the block
    return "FAILED", exc


# ----------------------------------------------------------------------------- start / resume


def _tag_float(tags: Mapping[str, str], key: str) -> float:
    try:
        return float(tags.get(key, 0.0))
    except ValueError:
        return 0.0


def _provenance_tags(
    config: Any, splits_lock: Path | None, hw: prov.Hardware, gpus: int, cores: int
) -> tuple[dict[str, str], prov.GitState]:
    git = prov.git_state()
    tags = {
        "git_commit": git.commit,
        "git_dirty": str(git.dirty).lower(),
        "git_changed_files": str(git.changed_files),
        "mlflow.source.git.commit": git.commit,
        "config_hash": prov.config_hash(config),
        "hardware": hw.describe(),
        "gpus": str(gpus),
        "cpu_cores": str(cores),
        "factor_version": __version__,
        "ledger.version": LEDGER_VERSION,
    }
    if git.diff:
        tags["git_diff_sha256"] = git.diff_sha256
    tags.update(prov.versions())
    for name, digest in prov.split_digests(splits_lock).items():
        tags[f"split.{name}"] = digest
    return tags, git


def start_run(
    config: Mapping[str, Any] | prov.Digestible,
    *,
    study: str,
    method: str,
    env: str,
    seed: int,
    backbone: str,
    gpus: int = 0,
    tracking_uri: str | None = None,
    resume_run_id: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    cpu_cores: int | None = None,
    tags: Mapping[str, Any] | None = None,
    splits_lock: Path | None = None,
    run_name: str | None = None,
    kind: str = DEFAULT_KIND,
) -> LedgerRun:
    """Open a new ledger run (or continue ``resume_run_id``) and record its provenance.

    Args:
        config: the resolved config (a mapping or a pydantic model); logged as flattened params,
            stored as the artifact ``config.json`` and hashed into ``config_hash`` by
            :func:`~factor_cli.ledger.provenance.config_hash` (``TrainConfig.digest()`` for a
            training config: pass the model itself, not its dump).
        study, method, env, seed, backbone: the run's identity tags.
        gpus: GPUs the run uses in all (node_hours = hours x gpus / 8; 0 on CPU).
        tracking_uri: store URI (default: ``$MLFLOW_TRACKING_URI``, else ``ledger/mlflow.db``).
        resume_run_id: continue this MLflow run (status back to RUNNING, clocks accumulate).
        experiment: MLflow experiment name for new runs.
        cpu_cores: cores used (default: the process's CPU affinity).
        tags: extra tags, e.g. study columns ``{"reduction": "token-mean", "budget": "2x4"}``.
        splits_lock: split lock file (default: the shipped manifests' ``splits.lock``).
        run_name: MLflow run name (default ``study/method/env/seed``).
        kind: the tag ``kind``, one of :data:`RUN_KINDS` (``factor ledger export`` collects the
            items of training runs unless told otherwise).

    Raises:
        LedgerError: the store is unusable (missing folder rights, not a database, read-only,
            unreachable) or refuses the write, the kind is unknown, or the resume id is
            unknown, deleted, or names a run of another study/method/env/seed/backbone/kind.
    """
    if kind not in RUN_KINDS:
        raise LedgerError(f"unknown run kind {kind!r}; valid: {', '.join(RUN_KINDS)}")
    uri = resolve_tracking_uri(tracking_uri)
    client = open_client(uri, create=True)
    identity = {
        "study": str(study), "method": str(method), "env": str(env), "seed": str(int(seed)),
        "backbone": str(backbone),
    }  # fmt: skip
    if gpus < 0:
        raise LedgerError(f"gpus must be >= 0, got {gpus}")
    hw = prov.hardware()
    cores = int(cpu_cores) if cpu_cores is not None else hw.cpu_cores
    ptags, git = _provenance_tags(config, splits_lock, hw, gpus, cores)
    ptags["kind"] = kind
    extra = {safe_key(k): str(v) for k, v in (tags or {}).items()}
    try:
        if resume_run_id:
            run = _resume(client, uri, resume_run_id, identity, ptags, extra, gpus, cores)
        else:
            run = _create(client, uri, experiment, identity, ptags, extra, gpus, cores, run_name)
    except LedgerError:
        raise
    except Exception as exc:  # e.g. "attempt to write a readonly database"
        raise LedgerError(f"cannot write a run to the ledger {uri}: {first_line(exc)}") from None
    try:
        run.log_params(config)
        if run.session == 1:
            run.log_text(prov.canonical_json(config), "config.json")
            if git.diff:
                run.log_text(git.diff, "git_diff.patch")
    except BaseException as exc:  # never leave a half-made run RUNNING
        run.end(*status_of(exc))
        raise
    return run


def _create(
    client: MlflowClient,
    uri: str,
    experiment: str,
    identity: dict[str, str],
    ptags: dict[str, str],
    extra: dict[str, str],
    gpus: int,
    cores: int,
    run_name: str | None,
) -> LedgerRun:
    exp_id = get_experiment_id(client, experiment, uri, create=True)
    name = run_name or "/".join(identity[k] for k in ("study", "method", "env", "seed"))
    tags = {**extra, **ptags, **identity, T_SESSION: "1"}
    mlrun = client.create_run(exp_id, run_name=name, tags=_cut_tags(tags))
    return LedgerRun(
        client, mlrun.info.run_id, uri, identity=identity, gpus=gpus, cpu_cores=cores,
        session=1, prior={}, params={},
    )  # fmt: skip


def _cut_tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {k: _cut(v, MAX_TAG_VALUE)[0] for k, v in tags.items()}


def _resume(
    client: MlflowClient,
    uri: str,
    run_id: str,
    identity: dict[str, str],
    ptags: dict[str, str],
    extra: dict[str, str],
    gpus: int,
    cores: int,
) -> LedgerRun:
    from mlflow.exceptions import MlflowException

    try:
        old = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise LedgerError(f"unknown run id {run_id!r} in {uri}; cannot resume it") from None
        raise LedgerError(f"cannot read run {run_id!r} from {uri}: {first_line(exc)}") from None
    if old.info.lifecycle_stage != "active":
        raise LedgerError(f"run {run_id} is deleted in {uri}; restore it before resuming")
    otags = old.data.tags
    for key, value in {**identity, "kind": ptags["kind"]}.items():
        if key in otags and otags[key] != value:
            raise LedgerError(
                f"run {run_id} has {key}={otags[key]}, not {value}; resume it with the same "
                f"{key} or start a new run"
            )
    session = int(_tag_float(otags, T_SESSION)) + 1
    prior = {k: _tag_float(otags, k) for k in (T_WALL, T_GPU, T_CORE)}
    try:
        nonfinite = json.loads(otags.get(T_NONFINITE, "{}"))
    except json.JSONDecodeError:
        nonfinite = {}
    tags = {**extra, T_SESSION: str(session)}
    tags.update({k: ptags[k] for k in ("gpus", "cpu_cores")})
    for key in ("git_commit", "git_dirty", "config_hash", "hardware"):  # what this session ran
        if otags.get(key) != ptags[key]:
            tags[f"session.{session}.{key}"] = ptags[key]
    for key, value in ptags.items():  # tags the first session did not record
        if key not in otags:
            tags.setdefault(key, value)
    client.update_run(run_id, status="RUNNING")
    run = LedgerRun(
        client, run_id, uri, identity=identity, gpus=gpus, cpu_cores=cores, session=session,
        prior=prior, params=old.data.params, nonfinite=nonfinite,
    )  # fmt: skip
    run.set_tags(tags)
    return run


__all__ = [
    "DEFAULT_KIND",
    "GPUS_PER_NODE",
    "ITEMS_DIR",
    "RUN_KINDS",
    "Heartbeat",
    "LedgerRun",
    "RunTerminated",
    "flatten_config",
    "safe_key",
    "start_run",
    "status_of",
]
