"""TD credit's sign on the fixed data set of ``benchmarks/value_fit.py``: how good must V be?

``value_fit.py td`` scores TD credit computed from several value estimates against a Monte-Carlo
advantage on the same actions, as `factor diagnose td-sign` does in training (paper Fig. 5B):

    A_t = r_t + V(x_{t+1}) - V(x_t),  V(x_0) = b,  V(x_T) = 0,

b the mean outcome of the other trajectories of the group (leave-one-out, as on TWX), so that
the credits of a trajectory sum to A^seq = R - b, against the reference's advantage
A^MC_t = Q^MC_t - V^MC_t, V^MC_t the mean of the reference continuations from x_t and Q^MC_t
that of x_{t+1} (the outcome R where a_t ended the episode). The data set plays K = 16
continuations from every state of its trajectories; the reference is the second half (8),
and every estimate reads the first half only, so that the two are independent:

- ``MC-k``: V(x_t) the mean of the first k continuations (k = 1, 2, 4, 8), VinePPO's value with
  K = k and no learning at all;
- the learned estimators of ``value_fit_variants`` (ridge on the prompt mean or on the boundary
  state and turn index, the turn index alone), cross-fitted over 4 folds of trajectories: each
  trajectory's values come from a fit on the other three folds' first-half targets.

Beside them the reference's ceiling (:func:`factor_cli.stats.calibration.td_sign_ceiling`): the
agreement a noiseless credit would reach against an 8-continuation reference under its model
(the true values of x_t and x_{t+1} independent draws from their posteriors), and an upper bound
on that ceiling that assumes no model (:func:`ceiling_bound`, from how often the two halves'
advantages agree with each other).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import torch
import value_fit_variants as vfv

from factor_cli.credit.advantage import leave_one_out
from factor_cli.credit.tac import td_action_credit
from factor_cli.stats.diagnose import credit_by_position, td_sign

HALF = 8  # continuations per side: estimate from [0, 8), reference from [8, 16)
FOLDS = 4
MC_K = (1, 2, 4, 8)
_LINEAR = replace(vfv.BASE, estimator="linear", horizon="rest")
LEARNED = [
    replace(_LINEAR, name="ridge, prompt mean, ~500 targets (250 states x 2)", targets=500,
            per_state=2, features="prompt_mean"),
    replace(_LINEAR, name="ridge, prompt mean, ~500 targets (500 states x 1)", targets=500,
            per_state=1, features="prompt_mean"),
    replace(_LINEAR, name="ridge, prompt mean, every fit state x 8", targets=8500,
            features="prompt_mean"),
    replace(_LINEAR, name="ridge, boundary + turn index, every fit state x 8", targets=8500,
            turn_feature=True),
    replace(_LINEAR, name="turn index alone", estimator="turn", targets=8500),
]  # fmt: skip


def _actions(data: dict[str, Any]) -> pd.DataFrame:
    """One row per action of every trajectory: its states (x_t, and x_{t+1} or -1 at the end),
    turn, trajectory, the outcome R and the baseline b, leave-one-out over the trajectory's
    group as the trainer's on TWX (:func:`factor_cli.credit.advantage.leave_one_out`)."""
    traj, turn = data["traj"].numpy(), data["turn"].numpy()
    outcome = data["root_outcome"].numpy().astype(float)
    group = data["root_group"].numpy()
    base = leave_one_out(
        torch.tensor(outcome), torch.tensor(np.unique(group, return_inverse=True)[1])
    )
    rows = []
    for i in np.unique(traj):
        idx = np.flatnonzero(traj == i)
        idx = idx[np.argsort(turn[idx])]
        for t, s in enumerate(idx):
            nxt = int(idx[t + 1]) if t + 1 < len(idx) else -1
            rows.append((int(s), nxt, t, int(i), outcome[i], float(base.v0[i])))
    return pd.DataFrame(rows, columns=["s", "next", "t", "traj", "R", "b"])


def _credit(acts: pd.DataFrame, v: np.ndarray) -> np.ndarray:
    """TAC's A*_t (:func:`factor_cli.credit.tac.td_action_credit`) with V(x_t) read from ``v``
    [N_states], r_t = R on each trajectory's last action, and v0 = b."""
    rank = acts["traj"].rank(method="dense").to_numpy(dtype=np.int64) - 1
    first = acts.groupby(rank)["b"].first().to_numpy()
    rewards = np.where(acts["next"] < 0, acts["R"], 0.0)
    credit = td_action_credit(torch.tensor(rewards), torch.tensor(v[acts["s"]]),
                              torch.tensor(rank), torch.tensor(first))  # fmt: skip
    return credit.numpy()


def _q(acts: pd.DataFrame, ref: np.ndarray) -> np.ndarray:
    """Q^MC_t: ``ref`` [N_states] at x_{t+1}, or the outcome R where a_t ended the episode."""
    return np.where(acts["next"] >= 0, ref[acts["next"].clip(lower=0)], acts["R"])


def _frame(acts: pd.DataFrame, name: str, v: np.ndarray, ref: np.ndarray) -> pd.DataFrame:
    q = _q(acts, ref)
    return pd.DataFrame({
        "method": name, "phase": "late", "run_id": "fixed", "step": 0, "traj": acts["traj"],
        "credit": _credit(acts, v), "mc": q - ref[acts["s"]], "q": q, "v": ref[acts["s"]],
        "samples": HALF,
    })  # fmt: skip


def ceiling_bound(acts: pd.DataFrame, g: np.ndarray) -> float:
    """A model-free upper bound on the ceiling against one half: with a_n the share of actions
    whose two halves' advantages agree in sign (both non-zero), and c_n the chance that one
    half's sign is the true one, a_n = c_n^2 + (1 - c_n)^2 if the halves err independently;
    that is convex in c_n, so mean c <= (1 + sqrt(2 mean a - 1)) / 2. A noiseless credit agrees
    with a half on mean c of the actions."""
    halves = (g[:, :HALF].mean(1), g[:, HALF : 2 * HALF].mean(1))
    a, b = (_q(acts, v) - v[acts["s"]] for v in halves)
    both = (a != 0) & (b != 0)
    agree = float((np.sign(a[both]) == np.sign(b[both])).mean())
    return (1.0 + np.sqrt(max(2.0 * agree - 1.0, 0.0))) / 2.0


def _cross_fit(data: dict[str, Any], v: vfv.Variant) -> np.ndarray:
    """A learned estimator's V for every state, each fold's from a fit on the other folds'
    first-half targets (the reference half never seen)."""
    first = dict(data, outcome=data["outcome"][:, :HALF], length=data["length"][:, :HALF])
    traj = data["traj"].numpy()
    ids = np.random.default_rng(0).permutation(np.unique(traj))
    out = np.zeros(len(traj))
    for f in range(FOLDS):
        held = np.isin(traj, ids[f::FOLDS])
        out[held] = vfv._predict(first, v, np.flatnonzero(~held), np.flatnonzero(held), 0)[0]
    return out


def positions(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Credit share by turn in wins (:func:`factor_cli.stats.diagnose.credit_by_position`) when
    TD credit reads the best value the data set has, the mean of all 16 continuations: does a
    calibrated value leave any position of a winning play with a negative mean share?"""
    acts = _actions(data)
    g = vfv._returns(data, "rest")
    frame = acts.rename(columns={"t": "turn"}).assign(
        method="MC-16", run_id="fixed", step=0, success=acts["R"] > 0, a_seq=acts["R"] - acts["b"],
        credit=_credit(acts, g.mean(1)), turns=acts.groupby("traj")["t"].transform("size"),
    )  # fmt: skip
    table = credit_by_position(frame).query("result == 'success'")
    keep = ["position", "share_actions", "share", "share_low", "share_high"]
    return table[keep].to_dict("records")


def run_td(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per estimate (module docstring): r against the reference half, and TD credit's
    sign agreement with its advantage, with the 95% interval over trajectories and the ceiling.
    A line on stderr per learned estimate (the 5M set's take minutes)."""
    torch.set_num_threads(1)
    g = vfv._returns(data, "rest")
    ref = g[:, HALF:].mean(1)
    acts = _actions(data)
    print(f"[td] prompt-mean features of {len(g)} states", file=sys.stderr, flush=True)
    vfv._prompt_mean(data)  # once: the folds' copies of ``data`` share it
    values = {f"MC-{k} (first {k} continuations)": g[:, :k].mean(1) for k in MC_K}
    for n, v in enumerate(LEARNED, 1):
        print(f"[td] {n}/{len(LEARNED)} cross-fitting {v.name}", file=sys.stderr, flush=True)
        values[v.name] = _cross_fit(data, v)
    frame = pd.concat([_frame(acts, name, v, ref) for name, v in values.items()])
    signs = td_sign(frame).query("phase == 'late'").set_index("method")
    bound = ceiling_bound(acts, g)
    rows = []
    for name, v in values.items():
        s = signs.loc[name]
        rows.append({
            "estimate": name, "r": float(np.corrcoef(v, ref)[0, 1]), "actions": int(s["actions"]),
            "TD sign agreement": float(s["agreement"]),
            "95% CI": f"[{s['ci_low']:.2f}, {s['ci_high']:.2f}]", "ceiling": float(s["ceiling"]),
            "ceiling at most": bound,
        })  # fmt: skip
    return rows
