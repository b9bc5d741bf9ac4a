"""Greedy evaluation on the manifest's eval instances -> item-level results (stats schema)."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.base import GenerationBackend
from factor_cli.rollout.runner import RolloutRunner, Shard, Start

from .config import TrainConfig
from .data import instances
from .prompts import prompt_format


def evaluate(
    generator: GenerationBackend,
    cfg: TrainConfig,
    method: str,
    on_turn: Callable[[int, int], None] | None = None,
    shard: Shard | None = None,
    split: str = "eval",
) -> pd.DataFrame:
    """One greedy episode per instance of the manifest's ``split`` (eval, or train); columns
    env, method, seed, item_id, category, success, score (plus outcome and turns). With a
    ``shard`` each data-parallel rank plays a block of the instances and every rank returns all
    the items."""
    items = instances(cfg, split)
    if cfg.eval.max_items is not None:
        items = items[: cfg.eval.max_items]
    fmt = prompt_format(cfg)
    width = min(-(-len(items) // (shard.world if shard else 1)), 64)
    with EnvPool(cfg.env.name, width, **cfg.env.options) as pool:
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
    return pd.DataFrame(rows)


def metric(items: pd.DataFrame) -> float:
    """The paper's metric: unweighted macro average of per-category success rates."""
    return float(items.groupby("category")["success"].mean().mean())
