"""Independent Monte-Carlo advantages of recorded actions, played under the policy of a kept
checkpoint (``factor diagnose td-sign``, the paper's Fig. 5B / Table 19).

For a recorded action a_t of root trajectory i at training step k, the policy that played it is
the one of checkpoint k - 1 (kept by ``checkpoint_keep_every``). From the restored state x_t
(reset + replay of a_0..a_{t-1}) N continuations estimate V(x_t); from x_{t+1} (the replay
includes a_t) N more estimate Q(x_t, a_t). Both sample at the continuations' temperature for at
most their horizon of further turns (the protocol of the value head's own targets, with N in
place of M), and each return is the episode's outcome G, 0 for one that never finished:

    A^MC_t = mean_n G(x_{t+1}, n) - mean_n G(x_t, n)

When a_t ended the episode (t = T - 1 with a success, or fewer than the turn limit's turns),
Q(x_t, a_t) is the recorded G_i itself. Only the sign of A^MC_t is compared with the credit's,
and any positive affine map of G (the conventions' terminal targets) keeps it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from factor_cli.rollout.continuations import HORIZON, TEMPERATURE, outcome_of
from factor_cli.rollout.runner import Episode, Job, RolloutRunner, Start
from factor_cli.train import checkpoint
from factor_cli.train.config import TrainConfig

POLICY_TAG = "engine"  # the policy engine's folder in a checkpoint (:class:`.engine.Engine`)
MC_COLUMNS = ("step", "traj", "turn", "samples", "mc_seed", "q", "v", "mc", "failed",
              "q_returns", "v_returns")  # fmt: skip
"""``q_returns`` / ``v_returns``: each continuation's return, ";"-joined (the noise ceiling's
split halves need them; "" where Q is the recorded outcome)."""


@dataclass(frozen=True)
class McPlan:
    """How many actions of a step are estimated and how."""

    samples: int = 16
    """N: continuations from x_t and from x_{t+1} each (the paper's 16)."""
    actions: int = 32
    """Actions drawn per step (uniformly, seeded), among those with non-zero credit."""
    seed: int = 0
    horizon: int = HORIZON
    temperature: float = TEMPERATURE
    replace: str = "vocab"
    """token-perturb's replacement tokens: ``vocab`` (uniform over the vocabulary) or
    ``admissible`` (uniform over the tokens of the state's admissible actions)."""
    to_end: bool = False
    """td-sign and value: play each continuation until the episode ends (the env's turn limit)
    instead of for the run's ``continuations.horizon`` turns, so that the reference is the
    return a state can still reach, whatever horizon the run's value targets used."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """The checkpoint written after step ``step``; FileNotFoundError names the kept ones."""
    path = run_dir / "checkpoints" / f"step-{step:06d}"
    if not (path / "state.pt").exists():
        kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
        raise FileNotFoundError(
            f"{run_dir}: no checkpoint of step {step} (kept: {', '.join(kept) or 'none'}); "
            "train with checkpoint_keep_every=N to keep every N-th"
        )
    return path


def run_config(ckpt: Path) -> TrainConfig:
    """The training config a checkpoint was written under."""
    return TrainConfig.model_validate(checkpoint.load_state(ckpt)["config"])


def load_checkpoint_policy(run_dir: Path, ckpt: Path, cfg: TrainConfig) -> Any:
    """The policy of checkpoint ``ckpt``: the run's exported model (architecture, tokenizer)
    with the checkpoint's weights (ZeRO-3 shards are gathered by DeepSpeed's converter)."""
    from factor_cli.policy.model import load_policy

    base = run_dir / "model"
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"{run_dir}: no exported model/ (the run did not finish)")
    policy = load_policy(str(base), cfg.model.dtype, cfg.model.device)
    states = torch.load(
        ckpt / POLICY_TAG / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
    )["module"]
    own = policy.model.state_dict()
    if any(states.get(k, torch.empty(0)).shape != v.shape for k, v in own.items()):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        states = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=POLICY_TAG)
    policy.model.load_state_dict(states, strict=False)
    return policy


def draw_actions(actions: pd.DataFrame, plan: McPlan) -> pd.DataFrame:
    """Up to ``plan.actions`` rows of one step's action records with non-zero credit, drawn
    uniformly with a stream seeded by (seed, step); in (traj, turn) order."""
    pool = actions[actions["credit"].abs() > 1e-6].sort_values(["traj", "turn"])
    step = int(actions["step"].iloc[0])
    rng = random.Random(f"td-sign:{plan.seed}:{step}")
    chosen = sorted(rng.sample(range(len(pool)), min(plan.actions, len(pool))))
    return pool.iloc[chosen]


def ends_episode(row: Any, max_turns: int) -> bool:
    """Whether a_t ended its episode: the last action of a win, or of a shorter-than-limit play."""
    last = int(row.turn) == int(row.turns) - 1
    return last and (bool(row.success) or int(row.turns) < max_turns)


def mc_advantages(
    cfg: TrainConfig,
    policy: Any,
    step_actions: pd.DataFrame,
    chosen: pd.DataFrame,
    plan: McPlan,
    on_turn: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """A^MC_t (module docstring) of each ``chosen`` action, one row each (:data:`MC_COLUMNS`):
    ``step_actions`` are all the step's records (for the trajectories' action strings)."""
    from factor_cli.envs.pool import EnvPool
    from factor_cli.train.generation import make_backend
    from factor_cli.train.prompts import prompt_format

    plays = {
        traj: rows.sort_values("turn")["action"].astype(str).tolist()
        for traj, rows in step_actions.groupby("traj")
    }
    max_turns = int(cfg.env.max_turns or 0) or 10**9
    jobs: list[Job] = []
    for a, row in enumerate(chosen.itertuples(index=False)):
        played, t = plays[row.traj], int(row.turn)
        sides = [played[:t]] if ends_episode(row, max_turns) else [played[:t], played[: t + 1]]
        for s, prefix in enumerate(sides):
            start = Start(row.instance, int(row.group), prefix, None, plan.horizon)
            key = (a * 2 + s) * plan.samples
            jobs += [Job(start, key + n, plan.seed, plan.temperature, scored=False)
                     for n in range(plan.samples)]  # fmt: skip
    if not jobs:  # a step whose every group had one outcome: no action has credit to check
        return pd.DataFrame(columns=list(MC_COLUMNS))
    gen = make_backend(cfg.rollout, policy)
    try:
        with EnvPool.of(cfg.env, min(len(jobs), 64)) as pool:
            runner = RolloutRunner(pool, gen, prompt_format(cfg), plan.horizon,
                                   constrain=cfg.rollout.valid_action_decoding)  # fmt: skip
            episodes, _ = runner.play(jobs, on_turn=on_turn)
    finally:
        gen.close()
    return _estimates(chosen, episodes, plan, max_turns)


def _estimates(
    chosen: pd.DataFrame, episodes: list[Episode], plan: McPlan, max_turns: int
) -> pd.DataFrame:
    rows, i, n = [], 0, plan.samples
    for row in chosen.itertuples(index=False):
        v_eps = episodes[i : i + n]
        i += n
        if ends_episode(row, max_turns):
            q_eps, q = [], float(row.outcome)
        else:
            q_eps = episodes[i : i + n]
            i += n
            q = sum(map(outcome_of, q_eps)) / n
        v = sum(map(outcome_of, v_eps)) / n
        failed = sum(ep.start_failed for ep in [*v_eps, *q_eps])
        rows.append({"step": int(row.step), "traj": int(row.traj), "turn": int(row.turn),
                     "samples": n, "mc_seed": plan.seed, "q": q, "v": v, "mc": q - v,
                     "failed": failed, "q_returns": _joined(q_eps),
                     "v_returns": _joined(v_eps)})  # fmt: skip
    return pd.DataFrame(rows, columns=list(MC_COLUMNS))


def _joined(episodes: list[Episode]) -> str:
    return ";".join(f"{outcome_of(ep):g}" for ep in episodes)
