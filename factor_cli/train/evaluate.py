"""Greedy evaluation on the manifest's eval instances -> item-level results (stats schema), and
the paired comparison of two evaluations on the same items (the starting policy vs the final)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.base import GenerationBackend
from factor_cli.rollout.runner import Episode, RolloutRunner, Shard, Start

from .config import TrainConfig
from .data import instances
from .prompts import prompt_format


@dataclass
class Evaluation:
    """One greedy evaluation: the item-level results and the episodes played (same order)."""

    items: pd.DataFrame
    episodes: list[Episode]


def evaluate(
    generator: GenerationBackend,
    cfg: TrainConfig,
    method: str,
    on_turn: Callable[[int, int], None] | None = None,
    shard: Shard | None = None,
    split: str = "eval",
) -> pd.DataFrame:
    """The item-level results of :func:`play_evaluation` (arguments as there)."""
    return play_evaluation(generator, cfg, method, on_turn, shard, split).items


def play_evaluation(
    generator: GenerationBackend,
    cfg: TrainConfig,
    method: str,
    on_turn: Callable[[int, int], None] | None = None,
    shard: Shard | None = None,
    split: str = "eval",
) -> Evaluation:
    """One greedy episode per instance of the manifest's ``split`` (eval, or train); item
    columns env, method, seed, item_id, category, success, score (plus outcome and turns). With
    a ``shard`` each data-parallel rank plays a block of the instances and every rank returns
    all the items and episodes."""
    items = instances(cfg, split)
    if cfg.eval.max_items is not None:
        items = items[: cfg.eval.max_items]
    fmt = prompt_format(cfg)
    width = min(-(-len(items) // (shard.world if shard else 1)), 64)
    with EnvPool.of(cfg.env, width) as pool:
        runner = RolloutRunner(
            pool,
            generator,
            fmt,
            max_turns=cfg.env.max_turns or pool[0].max_turns,
            shard=shard,
            constrain=cfg.rollout.valid_action_decoding,
        )
        eps = runner.run(
            [Start(i.instance_id) for i in items], greedy=True, seed=cfg.seed, on_turn=on_turn
        )
    rows = []
    for inst, ep in zip(items, eps):
        out = ep.outcome
        rows.append(
            {
                "env": cfg.env.name,
                "method": method,
                "seed": cfg.seed,
                "item_id": inst.instance_id,
                "category": inst.category,
                "success": int(bool(out and out.success)),
                "score": float(out.score) if out else 0.0,
                "outcome": float(out.outcome) if out else 0.0,
                "turns": len(ep.turns),
            }
        )
    return Evaluation(pd.DataFrame(rows), eps)


def metric(items: pd.DataFrame) -> float:
    """The paper's metric: unweighted macro average of per-category success rates."""
    return float(items.groupby("category")["success"].mean().mean())


REPLICATES = 10_000  # bootstrap replicates of the start -> final comparison
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Comparison:
    """Final minus starting policy on the same eval items (macro success, fractions)."""

    start: float
    """M_start: macro success of the starting policy (after SFT, before step 1)."""
    final: float
    """M_final: macro success of the final policy."""
    delta: float
    """M_final - M_start."""
    ci_low: float
    ci_high: float
    """Percentile interval of the paired bootstrap at ``confidence``."""
    items: int
    """Items evaluated by both (the pairs)."""
    replicates: int
    confidence: float


def paired_comparison(
    start: pd.DataFrame,
    final: pd.DataFrame,
    seed: int,
    replicates: int = REPLICATES,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Delta = M(final) - M(start) over the items both evaluated, with a paired bootstrap CI.

    With d_i = s^final_i - s^start_i and categories c, Delta = (1/C) sum_c mean_{i in c} d_i
    (the macro metric is linear in s). A replicate resamples the items with replacement within
    every category (sizes kept, each item carries its pair d_i): the one-seed case of
    :func:`factor_cli.stats.hierarchical_bootstrap`, seeded by ``seed``.

    Raises:
        ValueError: the two evaluations share no item.
    """
    from factor_cli.stats import hierarchical_bootstrap

    pairs = start[["item_id", "category", "success"]].merge(
        final[["item_id", "success"]], on="item_id", suffixes=("_start", "_final")
    )
    if pairs.empty:
        raise ValueError("the start and final evaluations share no item; nothing to compare")
    d = (pairs["success_final"] - pairs["success_start"]).to_numpy(dtype=np.float64)
    category = pairs["category"].astype(str).to_numpy()
    boot = hierarchical_bootstrap([d], [category], replicates, seed, confidence)
    return Comparison(
        start=metric(pairs.rename(columns={"success_start": "success"})),
        final=metric(pairs.rename(columns={"success_final": "success"})),
        delta=boot.point,
        ci_low=boot.ci_low,
        ci_high=boot.ci_high,
        items=len(pairs),
        replicates=replicates,
        confidence=confidence,
    )
