"""Every credit estimator on the same recorded rollouts (``factor diagnose compare``).

A run's per-action records (:mod:`.action_records`) hold what an action-level estimator reads:
per trajectory its group, A^seq_i and V~(x_0) (so r_{T-1} = A^seq_i + V~(x_0) under every outcome
convention: :mod:`factor_cli.credit.advantage`), per action its turn and V_target(x_t). Replaying
one step's records through each estimator of :data:`factor_cli.credit.ESTIMATORS` gives the
credit each method would have given those very actions: one rollout set, many estimators.

Anchor states (GiGPO, HGPO) are keyed by the episode's history, the task instance and the
actions before x_t: in the deterministic games the records come from, the same history is the
same state, but two histories that reach one state (a step back and forth) are not merged, so
GiGPO finds at most the anchors the observation text would give, never more. Estimators that
read the value head give no credit (NaN) on runs whose records hold no values.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from factor_cli.credit import CreditConfig
from factor_cli.credit.estimators import ESTIMATORS, CreditInputs
from factor_cli.credit.states import anchor_state_keys

COMPARED = ("broadcast", "gigpo", "hgpo", "td", "gae-0.95")
"""The default estimators: GRPO's and SERL-Repro's broadcast A^seq, GiGPO, HGPO, FACTOR's TD
residuals, and GAE(0.95) on the same value head."""
USED_BY = {
    "broadcast": "grpo, serl-repro",
    "gigpo": "gigpo",
    "hgpo": "hgpo",
    "td": "factor",
    "gae-0.95": "gae-0.95",
    "td-3": "td-3",
    "td-5": "td-5",
    "gae-0.9": "gae-0.9",
    "uniform": "wo-tac",
}
"""The methods of :data:`factor_cli.credit.METHODS` whose action credit each estimator is."""
KEYS = ["run_id", "step", "traj", "turn"]


def history_keys(actions: pd.DataFrame) -> list[str]:
    """One key per row (rows of one step, sorted by trajectory and turn): the task instance
    and the actions taken before x_t."""
    keys: list[str] = []
    history: list[str] = []
    last = None
    for traj, instance, action in zip(actions["traj"], actions["instance"], actions["action"]):
        if traj != last:
            history, last = [str(instance)], traj
        keys.append("\x1f".join(history))
        history.append(str(action))
    return keys


def recorded_inputs(step: pd.DataFrame) -> CreditInputs:
    """The estimators' inputs rebuilt from one run-step's action rows (sorted by traj, turn;
    trajectories numbered 0..N-1 as packed)."""
    traj = torch.tensor(step["traj"].to_numpy(), dtype=torch.long)
    per_traj = step.drop_duplicates("traj").set_index("traj").sort_index()
    a_seq = torch.tensor(per_traj["a_seq"].to_numpy(), dtype=torch.float64)
    v0 = torch.tensor(per_traj["v0"].to_numpy(), dtype=torch.float64)
    last = torch.tensor((step["traj"] != step["traj"].shift(-1)).to_numpy())
    rewards = torch.where(last, (a_seq + v0)[traj], torch.zeros((), dtype=torch.float64))
    values = pd.to_numeric(step["value"], errors="coerce").fillna(0.0).to_numpy()
    return CreditInputs(
        rewards=rewards,
        values=torch.tensor(values, dtype=torch.float64),
        traj_index=traj,
        v0=v0,
        a_seq=a_seq,
        group_index=torch.tensor(per_traj["group"].to_numpy(), dtype=torch.long),
        state_key=anchor_state_keys(history_keys(step)),
    )


def replay_credit(
    actions: pd.DataFrame,
    estimators: Sequence[str] = COMPARED,
    cfg: CreditConfig | None = None,
) -> pd.DataFrame:
    """Per recorded action (columns run_id, method, env, seed, step, traj, turn, length,
    credit: the run's own), one column per estimator: its credit A_t on the same actions
    (NaN for value-reading estimators on runs without values). ``cfg``: the estimators'
    hyperparameters (GiGPO's omega, HGPO's depth, the TD gamma; default the paper's)."""
    for name in estimators:
        ESTIMATORS.get(name)  # an unknown name fails here, naming the valid ones
    cfg = cfg or CreditConfig()
    frames = []
    for _, step in actions.sort_values(KEYS).groupby(["run_id", "step"], sort=False):
        out = step[["run_id", "method", "env", "seed", *KEYS[1:], "length", "credit"]].copy()
        has_values = pd.to_numeric(step["value"], errors="coerce").notna().all()
        inp = recorded_inputs(step)
        for name in estimators:
            est = ESTIMATORS.get(name)
            if est.uses_values and not has_values:
                out[name] = float("nan")
                continue
            gen = torch.Generator().manual_seed(0)  # the shuffled estimators' draw
            out[name] = est(inp, cfg, gen).double().numpy()
        frames.append(out)
    if not frames:
        raise ValueError("no recorded actions to replay")
    return pd.concat(frames, ignore_index=True)
