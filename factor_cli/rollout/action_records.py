"""Per-action and per-continuation records of one training step: what ``factor diagnose`` reads.

A training run writes them (``transcripts.records``, on by default) beside its transcripts, as
``records/actions-<k:06d>.csv`` and ``records/continuations-<k:06d>.csv`` in the run folder and
the MLflow run's artifacts (:mod:`factor_cli.ledger.records`). Unlike the transcripts, which
keep a few whole episodes with their text, these keep every action of every root episode, and
numbers only.

Action columns (one row per action t of root trajectory i, packing order):

    step, traj, group, instance, turn (t), turns (T_i), action (a_t's text, which restores
    x_{t+1} by replay), length (L_t), valid,
    outcome (G_i), success, a_seq (A^seq_i), v0 (V~(x_0)), credit (A_t, the method's),
    value (the V(x_t) credit read: V_target, or the Monte-Carlo V-hat of vineppo and factor-mc;
    empty for a method that reads neither), wbar (w-bar_t = mean_j w_{t,j}),
    top_mass (the allocation's top-quartile share, :func:`~factor_cli.credit.top_quartile_mass`),
    strength (eta_k or alpha_k of the step: 0 while the teacher is off)

Continuation columns (one row per continuation that started): step, traj, turn (the
checkpoint state x_t), target (its Monte-Carlo return).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from factor_cli.credit import CreditAssignment, top_quartile_mass
from factor_cli.credit.segments import segment_mean

from .continuations import ContinuationResult
from .packing import RolloutBatch
from .runner import Episode

ACTION_COLUMNS = (
    "step", "traj", "group", "instance", "turn", "turns", "action", "length", "valid", "outcome",
    "success", "a_seq", "v0", "credit", "value", "wbar", "top_mass", "strength",
)  # fmt: skip
CONTINUATION_COLUMNS = ("step", "traj", "turn", "target")


def action_rows(
    step: int, roots: Sequence[Episode], rb: RolloutBatch, credit: CreditAssignment
) -> list[dict[str, Any]]:
    """One row per packed action (columns :data:`ACTION_COLUMNS`, module docstring)."""
    b = rb.batch
    n = b.num_actions
    wbar = segment_mean(credit.weight.double(), b.action_index.long(), n).tolist()
    top = top_quartile_mass(credit.weight.double(), b.action_index, n).tolist()
    lengths, turns = b.lengths.tolist(), b.num_actions_per_traj.tolist()
    values = None if b.values is None else b.values.tolist()
    rows = []
    for a, (ep_i, t) in enumerate(rb.turn_of_action):
        i = int(b.traj_index[a])
        ep = roots[ep_i]
        rows.append(
            {
                "step": step,
                "traj": i,
                "group": int(b.group_index[i]),
                "instance": ep.start.instance_id,
                "turn": t,
                "turns": int(turns[i]),
                "action": ep.turns[t].action,
                "length": int(lengths[a]),
                "valid": int(ep.turns[t].valid),
                "outcome": float(b.outcome[i]),
                "success": int(bool(ep.outcome and ep.outcome.success)),
                "a_seq": float(credit.a_seq[i]),
                "v0": float(credit.v0[i]),
                "credit": float(credit.credit[a]),
                "value": None if values is None else float(values[a]),
                "wbar": float(wbar[a]),
                "top_mass": float(top[a]),
                "strength": credit.strength,
            }
        )
    return rows


def continuation_rows(step: int, result: ContinuationResult | None) -> list[dict[str, Any]]:
    """One row per continuation that started (columns :data:`CONTINUATION_COLUMNS`)."""
    if result is None:
        return []
    rows = []
    for c, ep, target in zip(result.checkpoint_of, result.episodes, result.targets):
        if ep.start_failed:
            continue
        cp = result.checkpoints[c]
        rows.append({"step": step, "traj": cp.episode, "turn": cp.turn, "target": float(target)})
    return rows
