"""HGPO (hierarchy-of-groups step advantages) against its loop oracle, its properties, the
anchor-state key it shares with GiGPO, its registry entry and its configuration errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import gigpo_oracle, hgpo_oracle, random_batch

from factor_cli.credit import (
    METHODS,
    CreditConfig,
    PackedBatch,
    anchor_state_keys,
    assign_credit,
    context_groups,
    gigpo_advantage,
    hgpo_advantage,
)
from factor_cli.credit import gigpo as gigpo_module
from factor_cli.credit import states as states_module
from factor_cli.train.config import ConfigError, load_config

EPS = 1e-6


def _hgpo(b, **kw) -> torch.Tensor:
    return hgpo_advantage(b.rewards, b.traj_index, b.group_index, b.state_key, b.v0, **kw)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm", ["std", "mean"])
@pytest.mark.parametrize(
    ("depth", "alpha", "base"), [(0, 1.0, False), (2, 1.0, False), (3, 0.0, True), (2, 2.5, True)]
)
def test_matches_loop_oracle(seed: int, norm: str, depth: int, alpha: float, base: bool) -> None:
    b = random_batch(seed, max_t=9)
    got = _hgpo(b, depth=depth, gamma=0.9, alpha=alpha, norm=norm, base_group=base)
    want = hgpo_oracle(
        b.rewards, b.traj_index, b.group_index, b.state_key, b.v0, depth, 0.9, alpha, norm, base
    )
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)


@st.composite
def sparse_batches(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    """Terminal 0/1 rewards and 2-3 states: many ties, equal-return groups and deep matches."""
    n_groups, k = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    lengths = draw(st.lists(st.integers(1, 6), min_size=n_groups * k, max_size=n_groups * k))
    n_states = draw(st.integers(1, 3))
    traj = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    states = draw(st.lists(st.integers(0, n_states - 1), min_size=len(traj), max_size=len(traj)))
    wins = draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
    rewards = torch.zeros(len(traj), dtype=torch.float64)
    last = torch.cumsum(torch.tensor(lengths), 0) - 1
    rewards[last] = torch.tensor(wins, dtype=torch.float64)
    group = torch.arange(len(lengths)) // k
    a_seq = torch.tensor(wins, dtype=torch.float64) - 0.5
    return rewards, traj, group, torch.tensor(states), a_seq


@settings(max_examples=60, deadline=None)
@given(
    sparse_batches(),
    st.integers(0, 3),
    st.sampled_from([0.0, 1.0, 2.0]),
    st.sampled_from(["std", "mean"]),
    st.booleans(),
)
def test_matches_loop_oracle_on_sparse_rewards(
    batch: tuple[torch.Tensor, ...], depth: int, alpha: float, norm: str, base: bool
) -> None:
    rewards, traj, group, states, a_seq = batch
    got = hgpo_advantage(rewards, traj, group, states, a_seq, depth, 0.95, alpha, norm, base)
    want = hgpo_oracle(rewards, traj, group, states, a_seq, depth, 0.95, alpha, norm, base)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0)


def test_hand_computed_case() -> None:
    """One group, three trajectories: states (A, B), (A, B), (C, B); returns 1, 0, 1 (gamma 1).

    Level 0: A -> {+1/2, -1/2}; C alone; B -> {1/3, -2/3, 1/3}. Level 1: (A, B) -> {+1/2, -1/2};
    (C, B) alone. With alpha = 1 the weights are 2 (level 0) and 3 (level 1)."""
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    traj = torch.tensor([0, 0, 1, 1, 2, 2])
    states = torch.tensor([0, 1, 0, 1, 2, 1])  # A B A B C B
    args = (rewards, traj, torch.tensor([0, 0, 0]), states, torch.zeros(3, dtype=torch.float64))
    got = hgpo_advantage(*args, depth=1, gamma=1.0, alpha=1.0, norm="mean", eps=1e-12)
    want = [0.5, (2 / 3 + 1.5) / 5, -0.5, (-4 / 3 - 1.5) / 5, 0.0, 1 / 3]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-9, rtol=0)
    equal = hgpo_advantage(*args, depth=1, gamma=1.0, alpha=0.0, norm="mean", eps=1e-12)
    assert float(equal[1]) == pytest.approx((1 / 3 + 0.5) / 2)


def test_level_zero_groups_are_gigpos_anchor_groups() -> None:
    """Row 0 of the shared context groups partitions actions as GiGPO's (group, state) pairs,
    and depth-0 HGPO with mean normalisation is GiGPO's step term (omega 1, no episode term)."""
    b = random_batch(3)
    groups = context_groups(b.group_index[b.traj_index], b.state_key, b.traj_index, 12, 0)[0]
    pairs = list(zip(b.group_index[b.traj_index].tolist(), b.state_key.tolist()))
    for a in range(len(pairs)):
        for c in range(len(pairs)):
            assert (groups[a] == groups[c]) == (pairs[a] == pairs[c])
    zero = torch.zeros_like(b.v0)
    hgpo = _hgpo(b, depth=0, gamma=0.95, alpha=1.0, norm="mean", eps=1e-12)
    gigpo = gigpo_oracle(
        b.rewards, b.traj_index, b.group_index, b.state_key, zero, 0.95, 1.0, "mean"
    )
    torch.testing.assert_close(hgpo, torch.tensor(gigpo, dtype=torch.float64), atol=1e-9, rtol=0)


def test_groups_nest_and_need_k_earlier_turns() -> None:
    b = random_batch(5, max_t=9)
    groups = context_groups(b.group_index[b.traj_index], b.state_key, b.traj_index, 12, 3)
    turn = PackedBatch(b.action_index, b.logp_old, b.traj_index, b.group_index, b.outcome).turn
    for k in range(4):
        assert bool(((groups[k] >= 0) == (turn >= k)).all())
    for k in range(1, 4):
        same_k = groups[k][:, None] == groups[k][None, :]
        same_prev = groups[k - 1][:, None] == groups[k - 1][None, :]
        live = (groups[k] >= 0)[:, None] & (groups[k] >= 0)[None, :]
        assert bool((~(same_k & live) | same_prev).all())  # G_k within G_{k-1}


def test_step_alone_in_every_group() -> None:
    """Unique states: no group has a sibling. Without the base group the advantage is 0; with
    it, the episode advantage A^seq_i (its weight 1 / (1 + eps))."""
    b = random_batch(1)
    alone = torch.arange(b.traj_index.numel())
    args = (b.rewards, b.traj_index, b.group_index, alone, b.v0)
    assert bool((hgpo_advantage(*args) == 0).all())
    with_base = hgpo_advantage(*args, base_group=True)
    torch.testing.assert_close(with_base, b.v0[b.traj_index] / (1 + EPS))


@pytest.mark.parametrize("seed", range(3))
def test_permuting_trajectories_permutes_advantages(seed: int) -> None:
    b = random_batch(seed, max_t=9)
    n_traj = b.v0.numel()
    perm = torch.randperm(n_traj, generator=torch.Generator().manual_seed(seed))
    order = torch.cat([(b.traj_index == i).nonzero().squeeze(1) for i in perm.tolist()])
    inv = torch.argsort(perm)  # new trajectory id of each old one
    got = hgpo_advantage(
        b.rewards[order],
        inv[b.traj_index[order]],
        b.group_index[perm],
        b.state_key[order],
        b.v0[perm],
        depth=2,
        base_group=True,
    )
    torch.testing.assert_close(got, _hgpo(b, depth=2, base_group=True)[order])


def test_gigpo_and_hgpo_share_one_state_key() -> None:
    """One definition: the key packers call, GiGPO's anchor groups and HGPO's levels all come
    from credit.states."""
    assert anchor_state_keys is states_module.anchor_state_keys
    assert gigpo_module.anchor_state_keys is states_module.anchor_state_keys
    assert gigpo_module.context_groups is states_module.context_groups
    from factor_cli.credit import hgpo as hgpo_module

    assert hgpo_module.context_groups is states_module.context_groups
    keys = anchor_state_keys(["a  room", "a room", None, "hall", None])
    assert keys.tolist() == [0, 0, 1, 2, 3]


def test_gigpo_unchanged_by_the_shared_key() -> None:
    for seed in range(3):
        b = random_batch(seed)
        got = gigpo_advantage(b.rewards, b.traj_index, b.group_index, b.state_key, b.v0)
        want = gigpo_oracle(
            b.rewards, b.traj_index, b.group_index, b.state_key, b.v0, 0.95, 1.0, "std"
        )
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_registry_entry_needs_no_value_head_nor_teacher() -> None:
    spec = METHODS.get("hgpo")
    assert (spec.estimator, spec.uses_value_head, spec.uses_teacher) == ("hgpo", False, False)
    b = random_batch(2)
    batch = PackedBatch(
        b.action_index, b.logp_old, b.traj_index, b.group_index, b.outcome, state_key=b.state_key
    )
    cfg = CreditConfig(hgpo_depth=1, hgpo_alpha=0.5)
    out = assign_credit(batch, "hgpo", 3, cfg)
    want = hgpo_oracle(
        out.rewards, b.traj_index, b.group_index, b.state_key, out.a_seq, 1, 0.95, 0.5, "std"
    )
    torch.testing.assert_close(
        out.credit, torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(out.coef, out.credit[b.action_index])
    no_keys = PackedBatch(b.action_index, b.logp_old, b.traj_index, b.group_index, b.outcome)
    with pytest.raises(ValueError, match="state_key is required by the hgpo estimator"):
        assign_credit(no_keys, "hgpo", 3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hgpo_depth", -1),
        ("hgpo_depth", 1.5),
        ("hgpo_depth", True),
        ("hgpo_alpha", -0.5),
        ("hgpo_alpha", float("inf")),
        ("hgpo_norm", "max"),
        ("hgpo_gamma", 1.5),
        ("hgpo_base_group", "yes"),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"credit.{field} = ") as err:
        CreditConfig(**{field: value})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("credit.hgpo_depth=-1", "credit.hgpo_depth = -1 is invalid"),
        ("credit.hgpo_norm=max", "credit.hgpo_norm = 'max' is invalid"),
    ],
)
def test_bad_train_override_is_one_line_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config("smoke", ["method=hgpo", override])
    assert "\n" not in str(err.value)


def test_bad_function_arguments() -> None:
    b = random_batch(0)
    with pytest.raises(ValueError, match="depth must be an integer >= 0"):
        _hgpo(b, depth=-1)
    with pytest.raises(ValueError, match="norm must be 'std' or 'mean'"):
        _hgpo(b, norm="max")
    with pytest.raises(ValueError, match="state_key must be a 1-D integer tensor"):
        hgpo_advantage(b.rewards, b.traj_index, b.group_index, b.rewards, b.v0)


def test_function_defaults_are_credit_config() -> None:
    """Every default has one home: the keyword defaults read CreditConfig's fields."""
    import inspect

    cfg = CreditConfig()
    params = inspect.signature(hgpo_advantage).parameters
    got = {name: params[name].default for name in ("depth", "gamma", "alpha", "norm")}
    assert got == {"depth": 2, "gamma": 0.95, "alpha": 1.0, "norm": "std"}
    assert (got["depth"], got["gamma"], got["alpha"], got["norm"]) == (
        cfg.hgpo_depth,
        cfg.hgpo_gamma,
        cfg.hgpo_alpha,
        cfg.hgpo_norm,
    )
    assert params["base_group"].default is cfg.hgpo_base_group is False
