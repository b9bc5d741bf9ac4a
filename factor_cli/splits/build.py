"""Deterministic split rules per environment, and manifest building with checksums.

ScienceWorld (paper Appendix B.3): for each of the 30 task types x 3 levels, 6 eval episodes and
18 train episodes, disjoint by (task, level, variation). Eval episodes come from ScienceWorld's
test variations, topped up from its dev variations where a task has fewer than 6; train
episodes come from its train variations, and only where a task has fewer than 18 are variations
repeated (the ``episode`` column numbers the repeats). Choices are seeded per cell.

TextWorldExpress: for each configured game, ``train`` seeds drawn from the train fold (0-999) and
``eval`` seeds from the test fold (20000-20999), with the game parameters in the manifest.

ALFWorld: the official train / valid_unseen games when ``ALFWORLD_DATA`` holds them, otherwise
the generated set (``factor envs alfworld-generate``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from factor_cli.registry import Registry

from .manifest import MANIFEST_NAMES, Row, sha256_text, update_lock, write_manifest

EVAL_PER_CELL = 6
TRAIN_PER_CELL = 18
TWX_GAMES = {"coin": (500, 100), "cookingworld": (500, 100)}

Planner = Callable[..., list[Row]]
PLANNERS: Registry[Planner] = Registry("split rule")
COUNT_RULES: Registry[Callable[[list[Row]], list[str]]] = Registry("count rule")


def _cell_rng(seed: int, *key: object) -> random.Random:
    return random.Random("/".join(map(str, (seed, *key))))


def sciworld_cell(
    variations: dict[str, list[int]], rng: random.Random
) -> tuple[list[int], list[tuple[int, int]]]:
    """(eval variations, [(train variation, episode)]) of one task x level cell."""
    test, dev = list(variations["test"]), list(variations["dev"])
    rng.shuffle(test)
    rng.shuffle(dev)
    evals = (test + dev)[:EVAL_PER_CELL]
    if len(evals) < EVAL_PER_CELL:
        raise ValueError(
            f"only {len(evals)} test + dev variations; {EVAL_PER_CELL} eval episodes needed"
        )
    train = list(variations["train"])
    if not train:
        raise ValueError("no train variations")
    rng.shuffle(train)
    picks = [(train[i % len(train)], i // len(train)) for i in range(TRAIN_PER_CELL)]
    return evals, picks


@PLANNERS.register("scienceworld")
def plan_scienceworld(env: Any, seed: int, tasks: list[str] | None = None) -> list[Row]:
    from factor_cli.envs.scienceworld import LEVELS, task_names

    rows: list[Row] = []
    for task in tasks or list(task_names()):
        variations = env.variations(task)
        for level in LEVELS:
            evals, train = sciworld_cell(variations, _cell_rng(seed, task, level))
            cat = f"{task}/{level}"
            rows += [Row(f"{task}/{level}/{v}", "eval", cat) for v in evals]
            rows += [Row(f"{task}/{level}/{v}", "train", cat, ep) for v, ep in train]
    return rows


@COUNT_RULES.register("scienceworld")
def count_scienceworld(rows: list[Row]) -> list[str]:
    problems = []
    per = Counter((r.category, r.split) for r in rows)
    for cat in sorted({r.category for r in rows}):
        for split, want in (("eval", EVAL_PER_CELL), ("train", TRAIN_PER_CELL)):
            if per[(cat, split)] != want:
                problems.append(f"{cat}: {per[(cat, split)]} {split} rows, expected {want}")
    return problems


@PLANNERS.register("twx")
def plan_twx(env: Any, seed: int, games: dict[str, tuple[int, int]] | None = None) -> list[Row]:
    rows: list[Row] = []
    for game, (n_train, n_eval) in (games or TWX_GAMES).items():
        rng = _cell_rng(seed, game)
        train = sorted(rng.sample(range(0, 1000), n_train))
        evals = sorted(rng.sample(range(20000, 21000), n_eval))
        params = {"params": env.params.get(game, "")}
        rows += [Row(f"{game}/{s}", "train", game, extra=params) for s in train]
        rows += [Row(f"{game}/{s}", "eval", game, extra=params) for s in evals]
    return rows


@COUNT_RULES.register("twx")
def count_twx(rows: list[Row]) -> list[str]:
    per = Counter((r.category, r.split) for r in rows)
    return [
        f"{cat}: no {split} rows"
        for cat in sorted({r.category for r in rows})
        for split in ("train", "eval")
        if per[(cat, split)] == 0
    ]


@PLANNERS.register("alfworld")
def plan_alfworld(env: Any, seed: int) -> list[Row]:
    """The official train / valid_unseen folds, or the generated set, of the env's data root."""
    from factor_cli.envs.alfworld_gen import split_rows

    root = env.root
    return [
        Row(d["instance_id"], d["split"], d["category"], int(d.get("episode", 0)))
        for d in split_rows(Path(root), seed)
    ]


@COUNT_RULES.register("alfworld")
def count_alfworld(rows: list[Row]) -> list[str]:
    return count_twx(rows)


def overlap(rows: list[Row]) -> set[str]:
    """Instance ids present in both train and eval (the paper's keys are the instance ids)."""
    train = {r.instance_id for r in rows if r.split == "train"}
    return train & {r.instance_id for r in rows if r.split == "eval"}


def checksum_rows(
    env: Any, rows: list[Row], progress: Callable[[int, int], None] | None = None
) -> list[Row]:
    """Fill each row's sha256 from the environment's canonical description of its instance."""
    cache: dict[str, str] = {}
    out = []
    for i, r in enumerate(rows):
        if r.instance_id not in cache:
            cache[r.instance_id] = sha256_text(env.canonical_description(r.instance_id))
        out.append(
            Row(r.instance_id, r.split, r.category, r.episode, cache[r.instance_id], r.extra)
        )
        if progress:
            progress(i + 1, len(rows))
    return out


def build_manifest(
    env_name: str,
    env: Any,
    splits_dir: Path,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> Path:
    """Plan, checksum and write ``splits_dir/<manifest>``; record its digest in the lock file."""
    rows = PLANNERS.get(env_name)(env, seed, **options)
    both = overlap(rows)
    if both:
        raise ValueError(f"{env_name}: split rule put {len(both)} instance(s) in train and eval")
    rows = checksum_rows(env, rows, progress)
    path = splits_dir / MANIFEST_NAMES[env_name]
    write_manifest(path, rows)
    update_lock(splits_dir, [path.name])
    return path
