"""'How much, then where' for one recorded group: credit and allocation side by side per method."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from factor_cli.credit import (
    METHODS,
    CreditAssignment,
    CreditConfig,
    assign_credit,
    conservation_drift,
)

from .records import GroupRecord, pack


@dataclass(frozen=True)
class ActionView:
    turn: int
    text: str
    tokens: list[str]
    feedback: str
    credit: dict[str, float]
    weights: dict[str, list[float]]
    mean_weight: dict[str, float]


@dataclass(frozen=True)
class TrajectoryView:
    id: str
    outcome: float
    a_seq: float
    credit_sum: dict[str, float]
    drift: dict[str, float]
    actions: list[ActionView]


@dataclass(frozen=True)
class Explanation:
    step: int
    methods: list[str]
    strength: dict[str, float]
    reduction: dict[str, str]
    warmup: dict[str, bool]
    trajectories: list[TrajectoryView]

    def to_json(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def explain(
    group: GroupRecord,
    methods: list[str],
    step: int | None = None,
    cfg: CreditConfig | None = None,
    reduction: str = "action-mean",
    seed: int = 0,
) -> Explanation:
    """Credit A_t, allocation weights and the telescoping check for each method.

    ``step`` defaults to the group's recorded step, else the first teacher-active step W + 1.
    """
    cfg = cfg or CreditConfig()
    for m in methods:
        METHODS.get(m)
    k = step or group.step or cfg.warmup_steps + 1
    batch = pack(group)
    out: dict[str, CreditAssignment] = {
        m: assign_credit(batch, m, k, cfg, reduction, torch.Generator().manual_seed(seed))
        for m in methods
    }
    drift = {m: conservation_drift(o.credit, batch.traj_index, o.a_seq) for m, o in out.items()}
    first = methods[0]
    trajectories: list[TrajectoryView] = []
    a = tok = 0
    for i, tr in enumerate(group.trajectories):
        views = []
        for t, act in enumerate(tr.actions):
            sl = slice(tok, tok + len(act.tokens))
            views.append(
                ActionView(
                    turn=t,
                    text=act.text,
                    tokens=act.tokens,
                    feedback=act.feedback,
                    credit={m: float(o.credit[a]) for m, o in out.items()},
                    weights={m: o.weight[sl].tolist() for m, o in out.items()},
                    mean_weight={m: float(o.weight[sl].mean()) for m, o in out.items()},
                )
            )
            a += 1
            tok += len(act.tokens)
        trajectories.append(
            TrajectoryView(
                id=tr.id,
                outcome=tr.outcome,
                a_seq=float(out[first].a_seq[i]),
                credit_sum={m: float(d[i] + out[m].a_seq[i]) for m, d in drift.items()},
                drift={m: float(d[i]) for m, d in drift.items()},
                actions=views,
            )
        )
    return Explanation(
        step=k,
        methods=list(methods),
        strength={m: o.strength for m, o in out.items()},
        reduction={m: o.reduction for m, o in out.items()},
        warmup={m: o.warmup for m, o in out.items()},
        trajectories=trajectories,
    )
