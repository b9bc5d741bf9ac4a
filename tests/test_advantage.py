"""Trajectory-advantage conventions and GiGPO against loop oracles."""

from __future__ import annotations

import pytest
import torch
from oracles import gigpo_oracle, loo_oracle, random_batch, standardize_oracle

from factor_cli.credit import CONVENTIONS, gigpo_advantage, terminal_rewards


@pytest.mark.parametrize("seed", range(5))
def test_leave_one_out(seed: int) -> None:
    b = random_batch(seed)
    adv = CONVENTIONS.get("leave-one-out")(b.outcome, b.group_index)
    a_seq, base = loo_oracle(b.outcome, b.group_index)
    torch.testing.assert_close(adv.a_seq, torch.tensor(a_seq, dtype=torch.float64))
    torch.testing.assert_close(adv.v0, torch.tensor(base, dtype=torch.float64))
    torch.testing.assert_close(adv.terminal, b.outcome)
    torch.testing.assert_close(adv.terminal - adv.v0, adv.a_seq)


@pytest.mark.parametrize("seed", range(5))
def test_group_standardize(seed: int) -> None:
    b = random_batch(seed)
    score = torch.rand(
        b.outcome.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    score[:4] = 0.5  # first group constant: std < 1e-6 -> A^seq = 0
    adv = CONVENTIONS.get("group-standardize")(score, b.group_index)
    torch.testing.assert_close(
        adv.a_seq, torch.tensor(standardize_oracle(score, b.group_index), dtype=torch.float64)
    )
    assert bool((adv.a_seq[:4] == 0).all())
    torch.testing.assert_close(adv.terminal, adv.a_seq)
    assert bool((adv.v0 == 0).all())


def test_raw_and_pinned_values() -> None:
    g = torch.tensor([1.0, 0.0, 0.0, 1.0])
    grp = torch.tensor([0, 0, 0, 0])
    raw = CONVENTIONS.get("raw")(g, grp)
    torch.testing.assert_close(raw.a_seq, g)
    assert bool((raw.v0 == 0).all())
    loo = CONVENTIONS.get("leave-one-out")(g, grp)
    torch.testing.assert_close(loo.v0, torch.tensor([1 / 3, 2 / 3, 2 / 3, 1 / 3]))


def test_leave_one_out_needs_two() -> None:
    with pytest.raises(ValueError, match="group of size 1"):
        CONVENTIONS.get("leave-one-out")(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))


def test_unknown_convention_lists_valid() -> None:
    with pytest.raises(ValueError, match="valid: leave-one-out, group-standardize, raw"):
        CONVENTIONS.get("loo")


def test_terminal_rewards_on_last_action() -> None:
    r = terminal_rewards(torch.tensor([1.0, 2.0]), torch.tensor([0, 0, 0, 1]))
    torch.testing.assert_close(r, torch.tensor([0.0, 0.0, 1.0, 2.0]))


@pytest.mark.parametrize("norm", ["std", "mean"])
@pytest.mark.parametrize("seed", range(4))
def test_gigpo_matches_oracle(seed: int, norm: str) -> None:
    b = random_batch(seed)
    got = gigpo_advantage(
        b.rewards, b.traj_index, b.group_index, b.state_key, b.v0, 0.95, 0.7, norm
    )
    want = gigpo_oracle(b.rewards, b.traj_index, b.group_index, b.state_key, b.v0, 0.95, 0.7, norm)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=0)


def test_gigpo_singletons_reduce_to_episode_advantage() -> None:
    b = random_batch(0)
    keys = torch.arange(b.traj_index.numel())  # every state unique: no anchor group has siblings
    got = gigpo_advantage(b.rewards, b.traj_index, b.group_index, keys, b.v0)
    torch.testing.assert_close(got, b.v0[b.traj_index])
