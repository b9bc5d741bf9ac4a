"""Continuation targets come from the credit core's convention (credit.terminal_targets), with
each continuation standardised by its own root group: no second copy in rollout/."""

from __future__ import annotations

import pytest
import torch
from oracles import terminal_target_oracle

from factor_cli.credit import CONVENTIONS
from factor_cli.envs.base import Outcome
from factor_cli.rollout.continuations import continuation_targets
from factor_cli.rollout.runner import Episode, Start


def episode(group: int, outcome: float | None) -> Episode:
    done = None if outcome is None else Outcome(outcome, outcome > 0.5, outcome, 0, 1)
    return Episode(Start("coin/1", group=group), outcome=done)


# Sparse group ids (as sample_groups may give them); group 7's roots are all equal.
ROOTS = [episode(3, 0.2), episode(3, 0.9), episode(3, 0.4), episode(7, 0.5), episode(7, 0.5)]
CONTS = [episode(7, 1.0), episode(3, 0.9), episode(3, None), episode(3, 0.0)]


@pytest.mark.parametrize("convention", CONVENTIONS.names())
def test_targets_use_the_root_group_of_each_continuation(convention: str) -> None:
    roots, conts = ROOTS, CONTS
    got = continuation_targets(roots, conts, convention)
    dense = {3: 0, 7: 1}
    want = terminal_target_oracle(
        convention,
        torch.tensor([1.0, 0.9, 0.0, 0.0], dtype=torch.float64),  # an unfinished one counts 0
        torch.tensor([dense[c.start.group] for c in conts]),
        torch.tensor([0.2, 0.9, 0.4, 0.5, 0.5], dtype=torch.float64),
        torch.tensor([dense[r.start.group] for r in roots]),
    )
    assert got == pytest.approx(want, abs=1e-12)
    assert continuation_targets(roots, [], convention) == []


def test_group_standardized_targets_pinned() -> None:
    """Group 7's roots are equal (std 0): target 0; group 3 (mean 0.5, std 0.2944) scales its
    own continuations; an unfinished continuation counts as outcome 0."""
    got = continuation_targets(ROOTS, CONTS, "group-standardize")
    sd = (((0.2 - 0.5) ** 2 + (0.9 - 0.5) ** 2 + (0.4 - 0.5) ** 2) / 3) ** 0.5
    assert got == pytest.approx([0.0, 0.4 / sd, -0.5 / sd, -0.5 / sd], rel=1e-6)
