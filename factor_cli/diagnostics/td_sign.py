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
from typing import Any

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


StepRows = Callable[[Path, pd.DataFrame, str, McPlan, Callable[[int, int], None]], pd.DataFrame]
"""(run folder, the step's action records, the run's method, plan, on_turn) -> rows."""


def per_kept_step(
    actions: pd.DataFrame,
    runs: pd.DataFrame,
    plan: McPlan,
    cache: Path,
    progress: Progress,
    compute: StepRows,
    teacher: bool = False,
) -> pd.DataFrame:
    """``compute``'s rows for every replayable step of ``runs`` (records of
    :func:`factor_cli.ledger.records.load_records`), each (run, step) cached under ``cache``
    (written whole, renamed into place: a rerun or a resumed one computes only what is
    missing), with the runs' method, env and seed and the step's ``phase`` (early for the
    first half of the run's recorded steps, late for the rest).

    Raises:
        ValueError: no run with a teacher (``teacher``: the others are left out), a run whose
            folder is not on this machine, or with no replayable step.
    """
    from factor_cli.credit import METHODS

    if teacher:  # a study mixes methods: probe those with a teacher, fail only if none has
        has = runs["method"].map(lambda m: METHODS.get(m).uses_teacher)
        if not has.any():
            methods = ", ".join(sorted(set(runs["method"])))
            raise ValueError(f"no run has a teacher to probe (methods: {methods})")
        runs = runs[has]
    frames = []
    for run in runs.itertuples(index=False):
        if not run.run_dir:
            raise ValueError(f"run {run.run_id[:12]}: its folder is not on this machine")
        mine = actions[actions["run_id"] == run.run_id]
        recorded = sorted(mine["step"].unique().tolist())
        steps = replayable_steps(Path(run.run_dir), recorded)
        if not steps:
            raise ValueError(
                f"run {run.run_id[:12]}: no recorded step's policy was kept (step k needs the "
                "checkpoint of k - 1); train with checkpoint_keep_every=N"
            )
        middle = (recorded[0] + recorded[-1]) / 2
        for k in steps:
            path = cache / cache_name(run.run_id, k, plan)
            if path.exists():
                rows = pd.read_csv(path, keep_default_na=False, na_values=[""])
            else:
                label = f"{run.run_id[:8]} step {k}"
                rows = compute(Path(run.run_dir), mine[mine["step"] == k], run.method, plan,
                               lambda i, n, lb=label: progress(lb, i, n))  # fmt: skip
                cache.mkdir(parents=True, exist_ok=True)
                with atomic_target(path) as tmp:
                    rows.to_csv(tmp, index=False)
            phase = "early" if k <= middle else "late"
            frames.append(rows.assign(run_id=run.run_id, method=run.method, env=run.env,
                                      seed=run.seed, phase=phase))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def cache_name(run_id: str, step: int, plan: McPlan) -> str:
    """The cache file of one (run, step, plan; ``-end``: continuations to the episode's end);
    ``-rows``: the whole rows, not the estimates
    alone as caches written before 2026-12-03 held (those are not read)."""
    mode = "" if plan.replace == "vocab" else f"-r{plan.replace}"  # older names stay valid
    mode += "-end" if plan.to_end else ""
    return f"{run_id}-step{step:06d}-n{plan.samples}-a{plan.actions}-s{plan.seed}{mode}-rows.csv"


def td_sign_estimates(
    actions: pd.DataFrame, runs: pd.DataFrame, plan: McPlan, cache: Path, progress: Progress
) -> pd.DataFrame:
    """The chosen actions of every replayable step of ``runs`` with their ``mc``, ``q``,
    ``v`` and ``phase`` (:func:`per_kept_step`)."""
    return per_kept_step(actions, runs, plan, cache, progress, _step_estimates)


def _step_estimates(
    run_dir: Path, step_actions: pd.DataFrame, method: str, plan: McPlan, on_turn: Any
) -> pd.DataFrame:
    """The chosen actions of one step with their Monte-Carlo estimates, played now."""
    k = int(step_actions["step"].iloc[0])
    chosen = draw_actions(step_actions, plan)
    ckpt = checkpoint_dir(run_dir, k - 1)
    cfg = run_config(ckpt)
    horizon = cfg.env.max_turns if plan.to_end else cfg.continuations.horizon
    plan = dataclasses.replace(plan, horizon=horizon, temperature=cfg.continuations.temperature)
    policy = load_checkpoint_policy(run_dir, ckpt, cfg)
    mc = mc_advantages(cfg, policy, step_actions, chosen, plan, on_turn=on_turn)
    cols = [c for c in chosen.columns if c not in ("run_id", "method", "env", "seed")]
    return chosen[cols].merge(mc, on=["step", "traj", "turn"], how="inner")


def value_estimates(
    actions: pd.DataFrame, runs: pd.DataFrame, plan: McPlan, cache: Path, progress: Progress
) -> pd.DataFrame:
    """:func:`td_sign_estimates` of the runs whose method has a value head (the others have no
    V_target to calibrate and are left out; none raises ValueError)."""
    from factor_cli.credit import METHODS

    has = runs["method"].map(lambda m: METHODS.get(m).uses_value_head)
    if not has.any():
        methods = ", ".join(sorted(set(runs["method"])))
        raise ValueError(f"no run has a value head to calibrate (methods: {methods})")
    return td_sign_estimates(actions, runs[has], plan, cache, progress)
