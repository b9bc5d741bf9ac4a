"""A whole training run: warm start, ledger run, steps with checkpoints, evaluation, summary.

Run folder: ``<output_dir>/<ledger run id>/`` with ``checkpoints/`` (atomic, ``latest``),
``metrics.jsonl`` (one line per step) and ``eval_items.csv`` (item-level results in the statistics
schema). ``resume(run_id)`` continues the same ledger run from the newest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from factor_cli.atomic import atomic_target
from factor_cli.ledger import start_run
from factor_cli.policy.model import load_policy

from . import checkpoint
from .config import TrainConfig
from .distributed import Ranks, init_distributed
from .evaluate import evaluate, metric
from .sft import gold_examples, sft_output_dir, supervised_finetune
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
    """The model RL starts from: the SFT model of this config (built once), or the base."""
    base = ensure_model(cfg)
    if not cfg.sft.enabled:
        return base
    out = sft_output_dir(cfg)
    if (out / "config.json").exists():
        log(f"warm start: reusing {out}")
        return str(out)
    policy = load_policy(base, cfg.model.dtype, cfg.model.device)
    from factor_cli.policy.prompting import PromptFormat

    examples = gold_examples(
        cfg,
        policy.tokenizer,
        PromptFormat(history_turns=cfg.rollout.history_turns),
        lambda i, n: progress("gold plays", i, n),
    )
    pad = policy.tokenizer.pad_token_id or 0
    losses = supervised_finetune(
        policy.model, examples, cfg, int(pad), lambda i, n, loss: progress("sft", i, n)
    )
    tmp = out.parent / f".{out.name}.tmp"
    policy.model.save_pretrained(tmp)
    policy.tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    log(
        f"warm start: {len(examples)} gold steps, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; saved {out}"
    )
    return str(out)


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
) -> RunSummary:
    """Train ``cfg`` (or resume a ledger run) to the end; ``stop_after`` ends early (tests).

    ``on_run`` receives the ledger run id as soon as the run is open (so an interrupted caller
    can say which run to ``--resume``).

    Under torchrun every rank calls this (see :mod:`factor_cli.train.distributed`): rank 0
    warm-starts the model, opens the one ledger run and writes every file; the others follow.
    """
    init_distributed(cfg.model.device)
    ranks = Ranks()
    if not ranks.main:
        progress, log = (lambda phase, i, n: None), (lambda msg: None)
    model_path = ranks.first(lambda: warm_start(cfg, progress, log))
    backbone = Path(cfg.model.path).name
    gpus = ranks.world if cfg.model.device.startswith("cuda") else 0
    ledger = (
        start_run(
            cfg.model_dump(mode="json"),
            study=cfg.study,
            method=cfg.method,
            env=cfg.env.name,
            seed=cfg.seed,
            backbone=backbone,
            gpus=gpus,
            tracking_uri=cfg.tracking_uri,
            resume_run_id=resume_run_id,
            tags={
                "reduction": cfg.reduction,
                "temperature": cfg.rollout.temperature,
                "budget": f"{cfg.continuations.budget}x{cfg.continuations.per_checkpoint}",
                "world_size": ranks.world,
            },
        )
        if ranks.main
        else nullcontext(None)
    )
    with ledger as opened:
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
                    return RunSummary(run.run_id, run_dir, trainer.step, metrics, None, None)
            final = run_dir / "model"
            tmp = run_dir / ".model.tmp"
            trainer.engine.save_pretrained(tmp, trainer.policy.tokenizer)  # all ranks: ZeRO-3
            if ranks.main:
                if final.exists():
                    import shutil

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
                with atomic_target(items_path) as tmp:
                    items.to_csv(tmp, index=False)
            run.log_items(
                items[["env", "method", "seed", "item_id", "category", "success", "score"]]
            )
            run.log_metrics({"eval_metric": value}, step=trainer.step)
            return RunSummary(run.run_id, run_dir, trainer.step, metrics, value, items_path)
        finally:
            trainer.close()


def evaluate_checkpoint(cfg: TrainConfig, model_path: str, progress: Progress) -> pd.DataFrame:
    """Greedy evaluation of a saved model directory (no training engine)."""
    from factor_cli.policy.generation import BACKENDS

    policy = load_policy(model_path, cfg.model.dtype, cfg.model.device)
    gen = BACKENDS.get(cfg.rollout.backend)(
        policy, max_new_tokens=cfg.rollout.max_new_tokens, max_context=cfg.rollout.max_context
    )
    return evaluate(gen, cfg, cfg.method, on_turn=lambda i, n: progress("eval", i, n))
