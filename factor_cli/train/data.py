"""Train and eval instances from the split manifests, and seeded group sampling."""

from __future__ import annotations

import random
from dataclasses import dataclass

from factor_cli.resources import splits_dir
from factor_cli.splits.manifest import MANIFEST_NAMES, read_manifest

from .config import TrainConfig


@dataclass(frozen=True)
class Instance:
    instance_id: str
    category: str


def instances(cfg: TrainConfig, split: str) -> list[Instance]:
    """Distinct instances of ``split`` (train | eval) in the env's manifest, filtered by games."""
    name = MANIFEST_NAMES.get(cfg.env.name)
    if name is None:
        raise ValueError(f"environment {cfg.env.name!r} has no split manifest")
    rows = read_manifest(splits_dir(cfg.env.splits_dir) / name)
    games = set(cfg.env.games)
    seen: dict[str, Instance] = {}
    for r in rows:
        if r.split == split and (not games or r.category in games):
            seen.setdefault(r.instance_id, Instance(r.instance_id, r.category))
    if not seen:
        raise ValueError(
            f"{name}: no {split} instances for games {sorted(games) or 'all'}; check env.games"
        )
    return list(seen.values())


def sample_groups(pool: list[Instance], groups: int, seed: int, step: int) -> list[Instance]:
    """``groups`` distinct instances for training step ``step`` (seeded by seed and step)."""
    rng = random.Random(f"{seed}/{step}")
    if groups <= len(pool):
        return rng.sample(pool, groups)
    return [rng.choice(pool) for _ in range(groups)]
