"""The two packers agree: a recorded group (``factor credit explain``) and the same play as
rollout episodes (training) give one packed batch and, for every method, identical credit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from factor_cli.credit import METHODS, PackedBatch, assign_credit
from factor_cli.envs.base import Outcome
from factor_cli.rollout.packing import pack_episodes
from factor_cli.rollout.records import GroupRecord, pack
from factor_cli.rollout.runner import Episode, Start, Turn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coin_group.json"


def recorded_group() -> GroupRecord:
    """The example group, with the observations of two trajectories re-wrapped (same text,
    other whitespace), as pages from a real environment often are."""
    raw = json.loads(EXAMPLE.read_text())
    for tr in raw["trajectories"][1::2]:
        for act in tr["actions"]:
            act["observation"] = "  " + act["observation"].replace(" ", "\n", 2) + " "
    return GroupRecord.model_validate(raw)


def as_episodes(group: GroupRecord) -> list[Episode]:
    """The recorded play as rollout episodes: every reply token is an action token."""
    episodes = []
    for tr in group.trajectories:
        turns = [
            Turn(
                prompt_ids=[1],
                reply_ids=list(range(2, 2 + len(a.tokens))),
                logprobs=list(a.logp_old),
                action_mask=[True] * len(a.tokens),
                reply_text=a.text,
                action=a.text,
                observation=a.observation or "",
                feedback=a.feedback,
                reward=0.0,
                done=False,
                valid=True,
                tagged=True,
            )
            for a in tr.actions
        ]
        outcome = Outcome(tr.outcome, tr.outcome > 0, tr.outcome, 0, len(turns))
        episodes.append(
            Episode(Start(group.instance, group=tr.group), turns=turns, outcome=outcome)
        )
    return episodes


def both_batches() -> tuple[PackedBatch, PackedBatch, int]:
    """(recorded group packed by records.pack, the same play packed by pack_episodes, step)."""
    group = recorded_group()
    actions = [a for tr in group.trajectories for a in tr.actions]
    trained = pack_episodes(
        as_episodes(group),
        group.convention,
        values=torch.tensor([a.value for a in actions], dtype=torch.float64),
        logp_teacher=[a.logp_teacher for a in actions],
        dtype=torch.float64,
    ).batch
    return pack(group), trained, group.step or 20


def test_both_packers_build_the_same_batch() -> None:
    recorded, trained, _ = both_batches()
    for name in ("action_index", "logp_old", "traj_index", "group_index", "outcome", "values"):
        torch.testing.assert_close(getattr(trained, name), getattr(recorded, name), msg=name)
    torch.testing.assert_close(trained.logp_teacher, recorded.logp_teacher)
    # Anchor states: re-wrapped observations are the same states in both packers.
    assert trained.state_key.tolist() == recorded.state_key.tolist()
    assert len(set(recorded.state_key.tolist())) == 2  # kitchen and pantry


@pytest.mark.parametrize("method", METHODS.names())
def test_both_packers_give_identical_credit(method: str) -> None:
    recorded, trained, step = both_batches()
    # PPO's critic values come from the trainer, not a packer: give both the same ones.
    v = torch.linspace(-1, 1, recorded.num_tokens)
    recorded = replace(recorded, token_values=v.to(recorded.logp_old.dtype))
    trained = replace(trained, token_values=v.to(trained.logp_old.dtype))
    a = assign_credit(recorded, method, step, generator=torch.Generator().manual_seed(0))
    b = assign_credit(trained, method, step, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(b.credit, a.credit)
    torch.testing.assert_close(b.coef, a.coef)
