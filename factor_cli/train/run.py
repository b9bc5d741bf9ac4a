"""A whole training run: warm start, ledger run, steps with checkpoints, evaluation, summary.

Run folder ``<output_dir>/<ledger run id>/`` (rank 0 writes it; what is marked * also goes to
the MLflow run's artifacts under the same name):

    checkpoints/            atomic, ``latest`` names the newest
    metrics.jsonl           one line per step
    eval_items_start.csv *  the starting policy's item-level results (``eval.start``; artifact
                            ``items/eval_items_start.csv``), read back on resume instead of
                            evaluating again
    eval_items.csv *        the final policy's, on the same items (artifact ``items/``)
    evals.jsonl             one line per evaluation: step (0: the start), macro success
    progress.png *          train return and eval success by step (refreshed at every eval)
    transcripts/ *          sample episodes of every step and every eval episode
                            (:mod:`factor_cli.ledger.transcripts`)
    records/ *              every step's per-action and per-continuation numbers
                            (:mod:`factor_cli.rollout.action_records`; `factor diagnose`)

At the end the final policy is compared with the starting one on the same items: the metrics
``eval_metric_start`` (step 0), ``eval_metric``, and ``eval_metric_delta`` with its 95% paired
bootstrap interval ``eval_metric_delta_ci_low`` / ``_ci_high``
(:func:`factor_cli.train.evaluate.paired_comparison`). ``resume(run_id)`` continues the same
ledger run from the newest checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from factor_cli.atomic import atomic_target, atomic_write_text, build_lock
from factor_cli.ledger import check_store, start_run
from factor_cli.ledger.records import RECORDS_DIR, record_name
from factor_cli.ledger.runs import Heartbeat
from factor_cli.ledger.transcripts import TRANSCRIPTS_DIR, file_name, to_jsonl
from factor_cli.policy.model import load_policy
from factor_cli.rollout.action_records import (
    ACTION_COLUMNS,
    CONTINUATION_COLUMNS,
    action_rows,
    continuation_rows,
)
from factor_cli.rollout.transcripts import eval_records, step_records

from . import checkpoint
from .config import TrainConfig
from .distributed import Ranks, init_distributed
from .evaluate import Comparison, Evaluation, metric, paired_comparison, play_evaluation
from .prompts import prompt_format
from .sft import (
    TAG_DATA,
    gold_examples,
    hindsight_examples,
    sft_output_dir,
    start_tags,
    supervised_finetune,
    write_warm_start_record,
)
from .trainer import StepResult, Trainer, check_value_head, ensure_model

Progress = Callable[[str, int, int], None]
Log = Callable[[str], None]

START_ITEMS = "eval_items_start.csv"
EVALS_LOG = "evals.jsonl"
PROGRESS_PNG = "progress.png"
ITEM_COLUMNS = ["env", "method", "seed", "item_id", "category", "success", "score"]


@dataclass
class RunSummary:
    run_id: str
    run_dir: Path
    steps: int
    metrics: dict[str, float]
    eval_metric: float | None
    items_path: Path | None
    comparison: Comparison | None = None
    """The final policy vs the starting one on the same items (``eval.start``; rank 0)."""
    progress_path: Path | None = None


def warm_start(cfg: TrainConfig, progress: Progress, log: Log) -> str:
    """The model RL starts from: the SFT model of this config (built once), or the base.

    A new SFT model gets ``warm_start.json`` (:mod:`factor_cli.train.sft`: the examples'
    digest and the base and warm-started weights' SHA-256); it is written into a temporary
    folder that is renamed into place, so a crash never leaves a half-made model to reuse.
    """
    base = ensure_model(cfg)
    if not cfg.sft.enabled:
        return base
    out = sft_output_dir(cfg)
    with build_lock(out):  # concurrent jobs of one config build it once
        if (out / "config.json").exists():
            log(f"warm start: reusing {out}")
            return str(out)
        _build_warm_start(cfg, base, out, progress, log)
    return str(out)


def _build_warm_start(cfg: TrainConfig, base: str, out: Path, progress: Progress, log: Log) -> None:
    """SFT ``base`` on the config's gold plays into ``out`` (called under its build lock)."""
    t0 = time.perf_counter()
    policy = load_policy(base, cfg.model.dtype, cfg.model.device)
    examples = gold_examples(
        cfg,
        policy.tokenizer,
        prompt_format(cfg),
        lambda i, n: progress("gold plays", i, n),
    )
    if cfg.sft.hindsight_walks:
        examples += hindsight_examples(cfg, policy.tokenizer, prompt_format(cfg),
                                       lambda i, n: progress("hindsight walks", i, n))  # fmt: skip
    pad = policy.tokenizer.pad_token_id or 0
    losses = supervised_finetune(
        policy.model, examples, cfg, int(pad), lambda i, n, loss: progress("sft", i, n)
    )
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # left by a builder that crashed
    policy.model.save_pretrained(tmp)
    policy.tokenizer.save_pretrained(tmp)
    record = write_warm_start_record(tmp, base, examples, losses, cfg, time.perf_counter() - t0)
    tmp.rename(out)
    log(
        f"warm start: {len(examples)} gold steps (sha256 {record[TAG_DATA][:12]}), "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {out} in {record['seconds']:.0f} s"
    )


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()


def _last_per_step(path: Path) -> list[dict[str, Any]]:
    """The records of an appended JSONL log, the last one of each step (a resumed run repeats
    steps), by step; lines that do not parse (a torn write) are skipped."""
    rows: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows[int(row["step"])] = row
    return [rows[k] for k in sorted(rows)]


@runtime_checkable
class RunLog(Protocol):
    """What training writes to its run: the ledger run on rank 0
    (:class:`~factor_cli.ledger.runs.LedgerRun`), a :class:`RankRun` on the other ranks."""

    run_id: str

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_items(self, items: pd.DataFrame, name: str = "eval_items.csv") -> Any: ...

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None: ...


class RankRun:
    """What a rank other than 0 holds instead of the ledger run: its id, and no writes."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_items(self, items: pd.DataFrame, name: str = "eval_items.csv") -> None:
        pass

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        pass


def train(
    cfg: TrainConfig,
    progress: Progress,
    log: Log,
    resume_run_id: str | None = None,
    stop_after: int | None = None,
    on_run: Callable[[str], None] | None = None,
    tags: dict[str, str] | None = None,
) -> RunSummary:
    """Train ``cfg`` (or resume a ledger run) to the end; ``stop_after`` ends early (tests).

    ``on_run`` receives the ledger run id as soon as the run is open (so an interrupted caller
    can say which run to ``--resume``). ``tags`` are added to the run's tags (a study cell's
    ``cell_key``, ``attempt``...). While the run is open a thread writes its heartbeat every
    minute (:class:`~factor_cli.ledger.runs.Heartbeat`).

    Under torchrun every rank calls this (see :mod:`factor_cli.train.distributed`): rank 0
    warm-starts the model, opens the one ledger run and writes every file; the others follow.
    """
    init_distributed(cfg.model.device)
    ranks = Ranks()
    if ranks.main:  # a bad store fails now, not after minutes of warm start
        check_store(cfg.tracking_uri)
    if not ranks.main:
        progress, log = (lambda phase, i, n: None), (lambda msg: None)
    model_path = ranks.first(lambda: warm_start(cfg, progress, log))
    check_value_head(cfg, model_path)
    with (
        _open_ledger_run(cfg, ranks, model_path, resume_run_id, tags or {}) as opened,
        Heartbeat(opened) if opened is not None else nullcontext(),
    ):
        run_id = ranks.broadcast(opened.run_id if opened is not None else None)
        run: RunLog = opened if opened is not None else RankRun(str(run_id))
        if on_run is not None:
            on_run(run.run_id)
        run_dir = Path(cfg.output_dir) / run.run_id
        if ranks.main:
            run_dir.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(cfg, model_path, progress, ranks)
        ctx = _Ctx(cfg, trainer, run, run_dir, ranks, progress, log)
        try:
            if resume_run_id:
                last = checkpoint.latest(run_dir)
                if last is not None:
                    trainer.load(last)
                    log(f"resumed {run.run_id} at step {trainer.step} from {last}")
            start = _start_eval(ctx)
            metrics = _train_steps(ctx, stop_after)
            if trainer.step < cfg.total_steps:  # stopped early (stop_after)
                return RunSummary(run.run_id, run_dir, trainer.step, metrics, None, None)
            final, items_path = _finish(ctx)
            comparison = _compare(ctx, start, final)
            plot = _plot(ctx) if ranks.main else None
            value = metric(final)
            return RunSummary(
                run.run_id, run_dir, trainer.step, metrics, value, items_path, comparison, plot
            )
        finally:
            trainer.close()


def _open_ledger_run(
    cfg: TrainConfig,
    ranks: Ranks,
    model_path: str,
    resume_run_id: str | None,
    extra_tags: dict[str, str],
) -> Any:
    """The ledger run (a context manager) on rank 0; a null context on the other ranks."""
    if not ranks.main:
        return nullcontext(None)
    return start_run(
        cfg,  # the model itself: its digest() is the config_hash tag
        study=cfg.study,
        method=cfg.method,
        env=cfg.env.name,
        seed=cfg.seed,
        backbone=Path(cfg.model.path).name,
        gpus=ranks.world if cfg.model.device.startswith("cuda") else 0,
        tracking_uri=cfg.tracking_uri,
        resume_run_id=resume_run_id,
        tags={
            "reduction": cfg.reduction,
            "temperature": cfg.rollout.temperature,
            "budget": f"{cfg.continuations.budget}x{cfg.continuations.per_checkpoint}",
            "world_size": ranks.world,
            "decoding": "constrained" if cfg.rollout.valid_action_decoding else "free",
            **start_tags(cfg, model_path),
            **extra_tags,
        },
    )


@dataclass(frozen=True)
class _Ctx:
    """What every phase of a training run after the warm start reads."""

    cfg: TrainConfig
    trainer: Trainer
    run: RunLog
    run_dir: Path
    ranks: Ranks
    progress: Progress
    log: Log


def _train_steps(ctx: _Ctx, stop_after: int | None) -> dict[str, float]:
    """Steps up to ``cfg.total_steps`` (or ``stop_after``): log, checkpoint, periodic eval.

    Returns the last step's metrics.
    """
    cfg, trainer, run, run_dir, ranks = ctx.cfg, ctx.trainer, ctx.run, ctx.run_dir, ctx.ranks
    total = cfg.total_steps
    metrics: dict[str, float] = {}
    if trainer.step == 0:  # a resumed run has its value head back from the checkpoint
        warm = trainer.value_warmup()
        if warm:
            run.log_metrics(warm, step=0)
            n, mse, secs = (warm[k] for k in ("value_warmup_targets", "value_warmup_mse",
                                              "time_value_warmup"))  # fmt: skip
            ctx.log(f"value warm-up: {n:.0f} targets, mse {mse:.3f}, {secs:.0f} s")
    while trainer.step < total:
        result = trainer.train_step()
        metrics = result.metrics
        run.log_metrics(metrics, step=result.step)
        if ranks.main:
            _append_jsonl(run_dir / "metrics.jsonl", {"step": result.step, **metrics})
            _step_transcript(ctx, result)
            _step_records(ctx, result)
        ctx.progress("steps", result.step, total)
        if result.step % cfg.checkpoint_every == 0 or result.step == total:
            trainer.save(run_dir, run.run_id)
        if cfg.eval.every and result.step % cfg.eval.every == 0 and result.step < total:
            ev = play_evaluation(trainer.backend, cfg, cfg.method, shard=trainer.shard)
            _record_eval(ctx, result.step, ev, "eval_metric")
            if ranks.main:
                _plot(ctx)
        if stop_after is not None and result.step >= stop_after:
            break
    return metrics


def _write_transcript(run: RunLog, run_dir: Path, name: str, text: str) -> None:
    """``transcripts/<name>`` written whole (temporary file + rename) and logged to the run;
    a replayed step (after a resume) rewrites its file instead of adding to it."""
    path = run_dir / TRANSCRIPTS_DIR / name
    atomic_write_text(path, text)
    run.log_artifact(path, TRANSCRIPTS_DIR)


def _step_transcript(ctx: _Ctx, result: StepResult) -> None:
    """The step's sample episodes with their credit (``transcripts.episodes_per_step``)."""
    n, rec = ctx.cfg.transcripts.episodes_per_step, result.record
    if n == 0 or rec is None:
        return
    tokenizer = ctx.trainer.policy.tokenizer
    records = step_records(result.step, rec.roots, rec.batch, rec.credit, rec.values, tokenizer, n)
    _write_transcript(ctx.run, ctx.run_dir, file_name("step", result.step), to_jsonl(records))


def _step_records(ctx: _Ctx, result: StepResult) -> None:
    """The step's per-action and per-continuation records (``transcripts.records``), each
    file written whole and logged under ``records/``."""
    rec = result.record
    if not ctx.cfg.transcripts.records or rec is None:
        return
    tables = {
        "actions": (action_rows(result.step, rec.roots, rec.batch, rec.credit), ACTION_COLUMNS),
        "continuations": (continuation_rows(result.step, rec.continuations), CONTINUATION_COLUMNS),
    }
    for kind, (rows, columns) in tables.items():
        path = ctx.run_dir / RECORDS_DIR / record_name(kind, result.step)
        with atomic_target(path) as out:
            pd.DataFrame(rows, columns=list(columns)).to_csv(out, index=False)
        ctx.run.log_artifact(path, RECORDS_DIR)


def _record_eval(ctx: _Ctx, step: int, ev: Evaluation, key: str) -> float:
    """Log one evaluation's macro success as ``key`` at ``step``; on rank 0 append it to
    ``evals.jsonl`` (the progress plot) and write its episodes' transcript."""
    value = metric(ev.items)
    ctx.run.log_metrics({key: value}, step=step)
    if ctx.ranks.main:
        _append_jsonl(ctx.run_dir / EVALS_LOG, {"step": step, "eval_metric": value,
                                                 "items": len(ev.items)})  # fmt: skip
        if ctx.cfg.transcripts.eval:
            categories = ev.items["category"].astype(str).tolist()
            records = eval_records(step, ev.episodes, categories, ctx.trainer.policy.tokenizer)
            _write_transcript(ctx.run, ctx.run_dir, file_name("eval", step), to_jsonl(records))
    return value


def _start_eval(ctx: _Ctx) -> pd.DataFrame | None:
    """The starting policy's item-level results (``eval.start``), evaluated before step 1.

    A resumed run reads them back from ``eval_items_start.csv`` instead; one resumed past
    step 0 without them (started with ``eval.start=false``) has no starting policy left to
    evaluate and returns None. Other ranks than 0 return None (only rank 0 compares).
    """
    cfg, trainer, ranks, log = ctx.cfg, ctx.trainer, ctx.ranks, ctx.log
    if not cfg.eval.start:
        return None
    path = ctx.run_dir / START_ITEMS
    if ranks.broadcast(path.exists() if ranks.main else None):  # every rank takes one branch
        log(f"starting policy: evaluated before, items in {path}")
        return pd.read_csv(path, dtype={"item_id": str, "category": str}) if ranks.main else None
    if trainer.step > 0:
        log("starting policy: not evaluated before this resumed run's first step; no comparison")
        return None
    ev = play_evaluation(
        trainer.backend,
        cfg,
        cfg.method,
        on_turn=lambda i, n: ctx.progress("eval (start)", i, n),
        shard=trainer.shard,
    )
    value = _record_eval(ctx, 0, ev, "eval_metric_start")
    ctx.run.log_items(ev.items[ITEM_COLUMNS], name=START_ITEMS)
    if ranks.main:
        with atomic_target(path) as out:  # last: its presence means the start eval is done
            ev.items.to_csv(out, index=False)
    log(f"starting policy: eval macro success {value:.4f} on {len(ev.items)} items")
    return ev.items if ranks.main else None


def _compare(ctx: _Ctx, start: pd.DataFrame | None, final: pd.DataFrame) -> Comparison | None:
    """Final vs starting policy on the items both evaluated, logged at the run's last step
    (rank 0)."""
    if start is None or not ctx.ranks.main:
        return None
    cmp = paired_comparison(start, final, seed=ctx.cfg.seed)
    if cmp.items < len(final):
        ctx.log(f"start vs final: {cmp.items} of the {len(final)} final items were evaluated at "
                "the start (eval.max_items changed?); compared on those")  # fmt: skip
    ctx.run.log_metrics(
        {
            "eval_metric_delta": cmp.delta,
            "eval_metric_delta_ci_low": cmp.ci_low,
            "eval_metric_delta_ci_high": cmp.ci_high,
        },
        step=ctx.trainer.step,
    )
    return cmp


def _plot(ctx: _Ctx) -> Path:
    """``progress.png`` from ``metrics.jsonl`` and ``evals.jsonl`` (replaced whole), logged."""
    from factor_cli.stats.progress import run_progress

    cfg, run, run_dir = ctx.cfg, ctx.run, ctx.run_dir
    train = _last_per_step(run_dir / "metrics.jsonl")
    evals = _last_per_step(run_dir / EVALS_LOG)
    out = run_dir / PROGRESS_PNG
    title = f"{cfg.study}/{cfg.method} on {cfg.env.name}, seed {cfg.seed} (run {run.run_id[:12]})"
    with tempfile.TemporaryDirectory(prefix=".progress-", dir=run_dir) as tmp:
        made = run_progress(
            [r["step"] for r in train],
            [r.get("return_mean", float("nan")) for r in train],
            [r["step"] for r in evals],
            [r["eval_metric"] for r in evals],
            Path(tmp) / PROGRESS_PNG,
            title,
            train_success=[r.get("success_rate", float("nan")) for r in train],
        )
        os.replace(made, out)
    run.log_artifact(out)
    return out


def _finish(ctx: _Ctx) -> tuple[pd.DataFrame, Path]:
    """Export the final model (atomically) and evaluate it; returns (items, items path)."""
    cfg, trainer, run, run_dir, ranks = ctx.cfg, ctx.trainer, ctx.run, ctx.run_dir, ctx.ranks
    final = run_dir / "model"
    tmp = run_dir / ".model.tmp"
    trainer.engine.save_pretrained(tmp, trainer.policy.tokenizer)  # all ranks: ZeRO-3
    if ranks.main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    ev = play_evaluation(
        trainer.backend,
        cfg,
        cfg.method,
        on_turn=lambda i, n: ctx.progress("eval", i, n),
        shard=trainer.shard,
    )
    items_path = run_dir / "eval_items.csv"
    if ranks.main:
        with atomic_target(items_path) as out:
            ev.items.to_csv(out, index=False)
    run.log_items(ev.items[ITEM_COLUMNS])
    _record_eval(ctx, trainer.step, ev, "eval_metric")
    return ev.items, items_path


def evaluate_checkpoint(
    cfg: TrainConfig,
    model_path: str | Path,
    progress: Progress,
    *,
    split: str = "eval",
    evaluated_run: str | None = None,
    out: Path | None = None,
    on_run: Callable[[str], None] | None = None,
) -> EvalSummary:
    """Greedy evaluation of a saved model directory (no training engine) as one ledger run.

    The run (``kind=eval``, name ``eval/<study>/<method>/<env>/<seed>/<split>``) records the
    config (``config_hash`` = ``cfg.digest()``), the tags ``eval.checkpoint`` (the model folder,
    absolute), ``eval.run_id`` (the training run evaluated: ``evaluated_run``, else read from a
    ``<output_dir>/<run id>/model`` path), ``eval.split``, ``env`` and the manifests' digests
    (``split.<file>`` of the ``splits.lock`` beside them), the metric ``eval_metric`` (macro
    success) and the artifact ``items/eval_items.csv`` (the statistics schema, as a training
    run's final evaluation). Items are also written to
    ``<output_dir>/evals/<ledger run id>/eval_items_<env>.csv``, one folder per evaluation so
    concurrent ones never share a file, and to ``out`` when given. With ``transcripts.eval``
    every episode goes to ``transcripts/eval-000000.jsonl`` in that folder and the run's
    artifacts (``factor ledger show RUN --eval`` reads it). An exception closes the run
    FAILED, Ctrl-C or SIGTERM KILLED.

    Args:
        split: the manifest split played (:data:`factor_cli.splits.manifest.SPLITS`): ``eval``,
            or ``train`` (greedy play on training instances: how well the policy fits them).
        on_run: receives the ledger run id once the run is open.

    Raises:
        ValueError: an unknown split, no instances of it (checked before a run opens), an
            unusable ledger (:class:`~factor_cli.ledger.LedgerError`).
    """
    from factor_cli.resources import splits_dir
    from factor_cli.splits.manifest import SPLITS
    from factor_cli.stats.io import REQUIRED_COLUMNS

    from .data import instances

    if split not in SPLITS:
        raise ValueError(f"split {split!r}: unknown; valid: {', '.join(SPLITS)}")
    instances(cfg, split)  # a missing manifest or an empty split fails before the run opens
    model_dir = Path(model_path).resolve()
    evaluated = evaluated_run or _run_id_of(model_dir)
    tags = {"eval.checkpoint": str(model_dir), "eval.split": split}
    if evaluated:
        tags["eval.run_id"] = evaluated
    with start_run(
        cfg,
        kind="eval",
        study=cfg.study,
        method=cfg.method,
        env=cfg.env.name,
        seed=cfg.seed,
        backbone=Path(cfg.model.path).name,
        gpus=1 if cfg.model.device.startswith("cuda") else 0,
        tracking_uri=cfg.tracking_uri,
        tags=tags,
        splits_lock=splits_dir(cfg.env.splits_dir) / "splits.lock",
        run_name=f"eval/{cfg.study}/{cfg.method}/{cfg.env.name}/{cfg.seed}/{split}",
    ) as run:
        if on_run is not None:
            on_run(run.run_id)
        ev, tokenizer = _greedy_play(cfg, model_dir, progress, split)
        items = ev.items
        value = metric(items)
        folder = Path(cfg.output_dir) / EVALS_DIR / run.run_id
        local = folder / f"eval_items_{cfg.env.name}.csv"
        if cfg.transcripts.eval:  # every episode, as a training run's evaluations
            categories = items["category"].astype(str).tolist()
            records = eval_records(0, ev.episodes, categories, tokenizer)
            _write_transcript(run, folder, file_name("eval", 0), to_jsonl(records))
        for path in (local, out):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_target(path) as tmp:
                    items.to_csv(tmp, index=False)
        run.log_items(items[list(REQUIRED_COLUMNS)])
        run.log_metrics({"eval_metric": value}, step=0)
    return EvalSummary(run.run_id, items, value, local, out)


EVALS_DIR = "evals"  # <output_dir>/evals/<ledger run id>/: one folder per `factor eval`


@dataclass
class EvalSummary:
    """What :func:`evaluate_checkpoint` produced."""

    run_id: str  # the eval's ledger run
    items: pd.DataFrame  # one row per instance (stats schema + outcome, turns)
    metric: float  # macro success
    items_path: Path  # <output_dir>/evals/<run id>/eval_items_<env>.csv
    out: Path | None  # the extra copy asked for, if any


def _run_id_of(model_dir: Path) -> str | None:
    """The training run of a ``<output_dir>/<run id>/model`` folder, else None."""
    parent = model_dir.parent.name
    is_run_id = len(parent) == 32 and all(c in "0123456789abcdef" for c in parent)  # MLflow's
    return parent if model_dir.name == "model" and is_run_id else None


def _greedy_play(
    cfg: TrainConfig, model_dir: Path, progress: Progress, split: str
) -> tuple[Evaluation, Any]:
    """Load the model, play every instance of ``split`` greedily, release the backend; the
    evaluation and the tokenizer (for its transcript)."""
    from .generation import make_backend

    policy = load_policy(str(model_dir), cfg.model.dtype, cfg.model.device)
    gen = make_backend(cfg.rollout, policy)
    try:
        ev = play_evaluation(
            gen, cfg, cfg.method, on_turn=lambda i, n: progress("eval", i, n), split=split
        )
        return ev, policy.tokenizer
    finally:
        gen.close()
