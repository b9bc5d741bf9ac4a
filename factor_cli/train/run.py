"""A whole training run: warm start, ledger run, steps with checkpoints, evaluation, summary.

Run folder: ``<output_dir>/<ledger run id>/`` with ``checkpoints/`` (atomic, ``latest``),
``metrics.jsonl`` (one line per step) and ``eval_items.csv`` (item-level results in the statistics
schema). ``resume(run_id)`` continues the same ledger run from the newest checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from factor_cli.atomic import atomic_target, build_lock
from factor_cli.ledger import check_store, start_run
from factor_cli.ledger.runs import Heartbeat
from factor_cli.policy.model import load_policy

from . import checkpoint
from .config import TrainConfig
from .distributed import Ranks, init_distributed
from .evaluate import evaluate, metric
from .prompts import prompt_format
from .sft import (
    TAG_DATA,
    gold_examples,
    sft_output_dir,
    start_tags,
    supervised_finetune,
    write_warm_start_record,
)
from .trainer import Trainer, ensure_model

Progress = Callable[[str, int, int], None]
Log = Callable[[str], None]


@dataclass
class RunSummary:
    run_id: str
    run_dir: Path
    steps: int
    metrics: dict[str, float]
    eval_metric: float | None
    items_path: Path | None


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


class _RankRun:
    """What a rank other than 0 holds instead of the ledger run: its id, and no writes."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_items(self, items: pd.DataFrame) -> None:
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
    with (
        _open_ledger_run(cfg, ranks, model_path, resume_run_id, tags or {}) as opened,
        Heartbeat(opened) if opened is not None else nullcontext(),
    ):
        run_id = ranks.broadcast(opened.run_id if opened is not None else None)
        run = opened if opened is not None else _RankRun(str(run_id))
        if on_run is not None:
            on_run(run.run_id)
        run_dir = Path(cfg.output_dir) / run.run_id
        if ranks.main:
            run_dir.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(cfg, model_path, progress, ranks)
        try:
            if resume_run_id:
                last = checkpoint.latest(run_dir)
                if last is not None:
                    trainer.load(last)
                    log(f"resumed {run.run_id} at step {trainer.step} from {last}")
            metrics = _train_steps(cfg, trainer, run, run_dir, ranks, progress, stop_after)
            if trainer.step < cfg.total_steps:  # stopped early (stop_after)
                return RunSummary(run.run_id, run_dir, trainer.step, metrics, None, None)
            value, items_path = _finish(cfg, trainer, run, run_dir, ranks, progress)
            return RunSummary(run.run_id, run_dir, trainer.step, metrics, value, items_path)
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


def _train_steps(
    cfg: TrainConfig,
    trainer: Trainer,
    run: Any,
    run_dir: Path,
    ranks: Ranks,
    progress: Progress,
    stop_after: int | None,
) -> dict[str, float]:
    """Steps up to ``cfg.total_steps`` (or ``stop_after``): log, checkpoint, periodic eval.

    Returns the last step's metrics.
    """
    total = cfg.total_steps
    metrics: dict[str, float] = {}
    while trainer.step < total:
        result = trainer.train_step()
        metrics = result.metrics
        run.log_metrics(metrics, step=result.step)
        if ranks.main:
            _append_jsonl(run_dir / "metrics.jsonl", {"step": result.step, **metrics})
        progress("steps", result.step, total)
        if result.step % cfg.checkpoint_every == 0 or result.step == total:
            trainer.save(run_dir, run.run_id)
        if cfg.eval.every and result.step % cfg.eval.every == 0 and result.step < total:
            items = evaluate(trainer.generator, cfg, cfg.method, shard=trainer.shard)
            run.log_metrics({"eval_metric": metric(items)}, step=result.step)
        if stop_after is not None and result.step >= stop_after:
            break
    return metrics


def _finish(
    cfg: TrainConfig, trainer: Trainer, run: Any, run_dir: Path, ranks: Ranks, progress: Progress
) -> tuple[float, Path]:
    """Export the final model (atomically) and evaluate it; returns (metric, items path)."""
    final = run_dir / "model"
    tmp = run_dir / ".model.tmp"
    trainer.engine.save_pretrained(tmp, trainer.policy.tokenizer)  # all ranks: ZeRO-3
    if ranks.main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    items = evaluate(
        trainer.generator,
        cfg,
        cfg.method,
        on_turn=lambda i, n: progress("eval", i, n),
        shard=trainer.shard,
    )
    value = metric(items)
    items_path = run_dir / "eval_items.csv"
    if ranks.main:
        with atomic_target(items_path) as out:
            items.to_csv(out, index=False)
    run.log_items(items[["env", "method", "seed", "item_id", "category", "success", "score"]])
    run.log_metrics({"eval_metric": value}, step=trainer.step)
    return value, items_path


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
    concurrent ones never share a file, and to ``out`` when given. An exception closes the run
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
        items = _greedy_items(cfg, model_dir, progress, split)
        value = metric(items)
        local = Path(cfg.output_dir) / EVALS_DIR / run.run_id / f"eval_items_{cfg.env.name}.csv"
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


def _greedy_items(
    cfg: TrainConfig, model_dir: Path, progress: Progress, split: str
) -> pd.DataFrame:
    """Load the model, play every instance of ``split`` greedily, release the backend."""
    from factor_cli.policy.generation import BACKENDS

    policy = load_policy(str(model_dir), cfg.model.dtype, cfg.model.device)
    gen = BACKENDS.get(cfg.rollout.backend)(
        policy, max_new_tokens=cfg.rollout.max_new_tokens, max_context=cfg.rollout.max_context
    )
    try:
        return evaluate(
            gen, cfg, cfg.method, on_turn=lambda i, n: progress("eval", i, n), split=split
        )
    finally:
        gen.close()
