"""``factor diagnose td-sign``'s data: the recorded credit of sampled actions beside their
independent Monte-Carlo advantages (:mod:`.replay`), for every step of a run whose policy was
kept (step k needs the checkpoint of step k - 1).

Each (run, step) is estimated once and cached as a CSV under the cache folder, named by its
run, step and the plan (samples, actions, seed), written whole and renamed into place; a rerun
(or one interrupted and started again) reads what is there and plays only the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from factor_cli.atomic import atomic_target

from .replay import (
    McPlan,
    checkpoint_dir,
    draw_actions,
    load_checkpoint_policy,
    mc_advantages,
    run_config,
)

Progress = Callable[[str, int, int], None]
"""(label, done, total): the progress of the (run, step) being played."""


def replayable_steps(run_dir: Path, recorded: list[int]) -> list[int]:
    """The recorded steps k whose policy (the checkpoint of step k - 1) was kept."""
    kept = {int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").glob("step-*")}
    return [k for k in recorded if k - 1 in kept]


def cache_name(run_id: str, step: int, plan: McPlan) -> str:
    return f"{run_id}-step{step:06d}-n{plan.samples}-a{plan.actions}-s{plan.seed}.csv"


def td_sign_estimates(
    actions: pd.DataFrame, runs: pd.DataFrame, plan: McPlan, cache: Path, progress: Progress
) -> pd.DataFrame:
    """The chosen actions of every replayable step of ``runs`` (records of
    :func:`factor_cli.ledger.records.load_records`) with their ``mc``, ``q``, ``v`` and
    ``phase``: early for the first half of the run's recorded steps, late for the rest.

    Raises:
        ValueError: a run whose folder is not on this machine, or with no replayable step.
    """
    frames = []
    for run in runs.itertuples(index=False):
        mine = actions[actions["run_id"] == run.run_id]
        if not run.run_dir:
            raise ValueError(f"run {run.run_id[:12]}: its folder is not on this machine")
        recorded = sorted(mine["step"].unique().tolist())
        steps = replayable_steps(Path(run.run_dir), recorded)
        if not steps:
            raise ValueError(
                f"run {run.run_id[:12]}: no recorded step's policy was kept (step k needs the "
                "checkpoint of k - 1); train with checkpoint_keep_every=N"
            )
        middle = (recorded[0] + recorded[-1]) / 2
        for k in steps:
            est = _step_estimates(Path(run.run_dir), run.run_id, mine[mine["step"] == k], plan,
                                  cache, progress)  # fmt: skip
            frames.append(est.assign(phase="early" if k <= middle else "late"))
    return pd.concat(frames, ignore_index=True)


def _step_estimates(
    run_dir: Path, run_id: str, step_actions: pd.DataFrame, plan: McPlan, cache: Path,
    progress: Progress,
) -> pd.DataFrame:  # fmt: skip
    """The chosen actions of one step with their estimates, from the cache or played now."""
    k = int(step_actions["step"].iloc[0])
    chosen = draw_actions(step_actions, plan)
    path = cache / cache_name(run_id, k, plan)
    if path.exists():
        mc = pd.read_csv(path)
    else:
        ckpt = checkpoint_dir(run_dir, k - 1)
        cfg = run_config(ckpt)
        plan = dataclasses.replace(plan, horizon=cfg.continuations.horizon,
                                   temperature=cfg.continuations.temperature)  # fmt: skip
        policy = load_checkpoint_policy(run_dir, ckpt, cfg)
        label = f"{run_id[:8]} step {k}"
        mc = mc_advantages(cfg, policy, step_actions, chosen, plan,
                           on_turn=lambda i, n: progress(label, i, n))  # fmt: skip
        cache.mkdir(parents=True, exist_ok=True)
        with atomic_target(path) as tmp:
            mc.to_csv(tmp, index=False)
    return chosen.merge(mc, on=["step", "traj", "turn"], how="inner")
