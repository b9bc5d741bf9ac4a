"""Trajectory-advantage conventions and GiGPO against loop oracles."""

from __future__ import annotations

import pytest
import torch
from oracles import (
    gigpo_oracle,
    loo_oracle,
    random_batch,
    standardize_oracle,
    terminal_target_oracle,
)

from factor_cli.credit import (
    CONVENTIONS,
    anchor_state_keys,
    gigpo_advantage,
    terminal_rewards,
    terminal_targets,
)


def _loo(outcome, group):
    a_seq, base = loo_oracle(outcome, group)
    return a_seq, [float(x) for x in outcome], base


def _standardized(outcome, group):
    a_seq = standardize_oracle(outcome, group)
    return a_seq, a_seq, [0.0] * len(a_seq)


def _raw(outcome, group):
    g = [float(x) for x in outcome]
    return g, g, [0.0] * len(g)


# (A^seq, r_{T-1}, V~(x_0)) of every convention, from the loop oracles.
CONVENTION_ORACLES = {"leave-one-out": _loo, "group-standardize": _standardized, "raw": _raw}


def test_every_convention_has_an_oracle() -> None:
    assert set(CONVENTION_ORACLES) == set(CONVENTIONS.names())


def _scores(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcomes in [0, 1] for 3 groups of 4, the first group constant (std 0)."""
    b = random_batch(seed)
    score = torch.rand(
        b.outcome.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    score[:4] = 0.5
    return score, b.group_index


@pytest.mark.parametrize("name", CONVENTIONS.names())
@pytest.mark.parametrize("seed", range(3))
def test_every_convention_matches_its_oracle(name: str, seed: int) -> None:
    outcome, group = _scores(seed)
    adv = CONVENTIONS.get(name)(outcome, group)
    for got, want in zip(
        (adv.a_seq, adv.terminal, adv.v0), CONVENTION_ORACLES[name](outcome, group)
    ):
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    # r_{T-1} - V~(x_0) = A^seq: one-step TD credit telescopes to A^seq under every convention.
    torch.testing.assert_close(adv.terminal - adv.v0, adv.a_seq)


@pytest.mark.parametrize("name", CONVENTIONS.names())
@pytest.mark.parametrize("seed", range(3))
def test_terminal_targets_match_oracle(name: str, seed: int) -> None:
    root, root_group = _scores(seed)
    g = torch.Generator().manual_seed(100 + seed)
    outcome = torch.rand(10, generator=g, dtype=torch.float64)
    group = torch.randint(0, 3, (10,), generator=g)
    got = terminal_targets(name, outcome, group, root, root_group)
    want = terminal_target_oracle(name, outcome, group, root, root_group)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("name", CONVENTIONS.names())
def test_a_continuation_repeating_a_root_outcome_targets_its_terminal_reward(name: str) -> None:
    """The value head's target and TAC's r_{T-1} are on one scale: a continuation that ends
    exactly as root trajectory i did gets target r_{T-1} of trajectory i."""
    root, root_group = _scores(4)
    adv = CONVENTIONS.get(name)(root, root_group)
    got = terminal_targets(name, root, root_group, root, root_group)
    torch.testing.assert_close(got, adv.terminal)


def test_terminal_targets_pinned() -> None:
    f64 = torch.float64
    root, group = torch.tensor([0.4, 0.6], dtype=f64), torch.tensor([0, 0])  # mean .5, std .1
    one = torch.tensor([0.8], dtype=f64)
    got = terminal_targets("group-standardize", one, torch.tensor([0]), root, group)
    assert float(got) == pytest.approx(3.0)
    flat = torch.tensor([0.5, 0.5], dtype=f64)  # std 0 < 1e-6: A^seq = 0, so is the target
    assert float(terminal_targets("group-standardize", one, torch.tensor([0]), flat, group)) == 0.0
    assert float(terminal_targets("leave-one-out", one, torch.tensor([0]), root, group)) == 0.8
    with pytest.raises(ValueError, match="group_index values must lie in"):
        terminal_targets("raw", one, torch.tensor([1]), root, group)
    with pytest.raises(ValueError, match="unknown outcome convention 'loo'"):
        terminal_targets("loo", one, torch.tensor([0]), root, group)


def test_anchor_state_keys_normalise_whitespace() -> None:
    obs = ["You are in the kitchen.", "You  are in\nthe kitchen. ", "A pantry.", None, None, ""]
    keys = anchor_state_keys(obs).tolist()
    assert keys[0] == keys[1] and keys[2] != keys[0]
    # Unknown observations are states of their own, distinct from each other and from any text.
    assert len({keys[3], keys[4], keys[5], keys[0], keys[2]}) == 5
    assert keys == [0, 0, 1, 2, 3, 4]  # dense, in order of first appearance
    assert anchor_state_keys([]).numel() == 0


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
