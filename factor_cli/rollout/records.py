"""Recorded trajectory groups: the JSON format, its validation, and packing.

One file holds one group of trajectories (the K rollouts of a task instance, or several groups
told apart by ``group``). The format is documented in docs/credit.md ("Trajectory JSON format");
every action lists its executable-action tokens with the behaviour log-probs and, when the
teacher scored it, the teacher's log-probs with the feedback Phi_t in context.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from factor_cli.credit import CONVENTIONS, PackedBatch, anchor_state_keys


class ActionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="Executed action text.")
    tokens: list[str] = Field(min_length=1, description="Decoded tokens of the executable action.")
    logp_old: list[float] = Field(description="Behaviour log-prob of each token.")
    logp_teacher: list[float] | None = Field(
        default=None, description="Teacher log-prob of each token, with Phi_t in context."
    )
    value: float | None = Field(default=None, description="V_target(x_t) before this action.")
    feedback: str = Field(default="", description="Phi_t: the environment's reply to the action.")
    observation: str | None = Field(default=None, description="Observation before the action.")

    @model_validator(mode="after")
    def _lengths(self) -> ActionRecord:
        n = len(self.tokens)
        if len(self.logp_old) != n:
            raise ValueError(f"logp_old has {len(self.logp_old)} entries for {n} tokens")
        if self.logp_teacher is not None and len(self.logp_teacher) != n:
            raise ValueError(f"logp_teacher has {len(self.logp_teacher)} entries for {n} tokens")
        return self


class TrajectoryRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    outcome: float = Field(description="Terminal outcome G_i (WebShop: penalised score).")
    group: int = Field(default=0, ge=0, description="Group (task instance) of the trajectory.")
    success: bool | None = None
    actions: list[ActionRecord] = Field(min_length=1)


class GroupRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: str = ""
    instance: str = ""
    convention: str = Field(default="leave-one-out", description="Outcome convention name.")
    step: int | None = Field(default=None, ge=1, description="Training step of the recording.")
    trajectories: list[TrajectoryRecord] = Field(min_length=1)

    @model_validator(mode="after")
    def _convention(self) -> GroupRecord:
        if self.convention not in CONVENTIONS:
            raise ValueError(
                f"unknown convention {self.convention!r}; valid: {', '.join(CONVENTIONS.names())}"
            )
        return self


class RecordError(ValueError):
    """A trajectory file that cannot be read; the message is one line naming file and field."""


def _where(loc: tuple[object, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_group(path: str | Path) -> GroupRecord:
    """Read and validate one trajectory-group JSON file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        return GroupRecord.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise RecordError(
            f"{path}: field {_where(tuple(err['loc']))}: {msg} "
            "(see 'Trajectory JSON format' in docs/credit.md)"
        ) from None


def pack(group: GroupRecord, dtype: torch.dtype = torch.float64) -> PackedBatch:
    """The packed batch of a recorded group (trajectories and actions in file order)."""
    trajs = group.trajectories
    actions = [a for tr in trajs for a in tr.actions]
    n_tok = [len(a.tokens) for a in actions]
    has_teacher = all(a.logp_teacher is not None for a in actions)
    has_values = all(a.value is not None for t in trajs for a in t.actions[1:])
    groups = sorted({t.group for t in trajs})
    dense_group = {g: i for i, g in enumerate(groups)}

    def f(xs: list[float]) -> torch.Tensor:
        return torch.tensor(xs, dtype=dtype)

    return PackedBatch(
        action_index=torch.repeat_interleave(torch.arange(len(actions)), torch.tensor(n_tok)),
        logp_old=f([x for a in actions for x in a.logp_old]),
        traj_index=torch.repeat_interleave(
            torch.arange(len(trajs)), torch.tensor([len(t.actions) for t in trajs])
        ),
        group_index=torch.tensor([dense_group[t.group] for t in trajs]),
        outcome=f([t.outcome for t in trajs]),
        convention=group.convention,
        logp_teacher=f([x for a in actions for x in a.logp_teacher or []]) if has_teacher else None,
        values=f([a.value if a.value is not None else 0.0 for a in actions])
        if has_values
        else None,
        # The packer of training batches keys anchor states the same way (one function).
        state_key=anchor_state_keys([a.observation for a in actions]),
    ).validate()
