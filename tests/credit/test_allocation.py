"""HTA + APM allocation and its ablation variants against loop oracles; property 2."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import allocation_oracle, batch_global_oracle, random_batch, segments, serl_oracle

from factor_cli.credit import ALLOCATIONS, CreditConfig, allocation
from factor_cli.credit.segments import segment_count, segment_mean


@pytest.mark.parametrize("eta", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize(("tau", "d"), [(1.0, 3.0), (0.1, 1.0), (5.0, math.inf)])
@pytest.mark.parametrize("seed", range(3))
def test_allocation_matches_loop_oracle(seed: int, eta: float, tau: float, d: float) -> None:
    b = random_batch(seed)
    got = allocation(b.gap, b.action_index, b.credit, eta, tau, d)
    want = torch.tensor(
        allocation_oracle(b.gap, b.action_index, b.credit, eta, tau, d), dtype=torch.float64
    )
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    eta=st.floats(0.0, 1.0),
    tau=st.floats(1e-2, 1e2),
    d=st.one_of(st.floats(1e-2, 50.0), st.just(math.inf)),
    gap_scale=st.floats(1e-3, 1e3),
    single=st.booleans(),
)
def test_property_mean_one_nonnegative(
    seed: int, eta: float, tau: float, d: float, gap_scale: float, single: bool
) -> None:
    """Property 2: mean_j omega_{t,j} = 1 and omega >= 0 for every action, any eta, tau.

    Exact to 1e-6 in float64; float32 only adds its own rounding (~L ulps for an L-token action).
    """
    dtype, atol = (torch.float32, 5e-6) if single else (torch.float64, 1e-6)
    b = random_batch(seed, max_l=40, dtype=dtype)
    omega = allocation(b.gap * gap_scale, b.action_index, b.credit, eta, tau, d)
    n_act = b.credit.numel()
    assert bool((omega >= 0).all())
    means = segment_mean(omega, b.action_index, n_act)
    torch.testing.assert_close(means, torch.ones(n_act, dtype=dtype), atol=atol, rtol=0)


def test_zero_credit_gets_uniform_allocation() -> None:
    b = random_batch(5, zero_credit_frac=0.5)
    omega = allocation(b.gap, b.action_index, b.credit, eta=1.0)
    zero_tokens = b.credit[b.action_index] == 0
    assert zero_tokens.any()
    torch.testing.assert_close(
        omega[zero_tokens], torch.ones(int(zero_tokens.sum()), dtype=torch.float64)
    )


def test_sign_orients_concentration() -> None:
    # Positive credit concentrates on the largest gap, negative credit on the smallest.
    gap = torch.tensor([0.0, 2.0, -2.0, 0.0, 2.0, -2.0])
    idx = torch.tensor([0, 0, 0, 1, 1, 1])
    omega = allocation(gap, idx, torch.tensor([1.0, -1.0]), eta=1.0)
    assert int(omega[:3].argmax()) == 1
    assert int(omega[3:].argmax()) == 2


def test_single_token_action_is_one() -> None:
    omega = allocation(torch.tensor([4.0]), torch.tensor([0]), torch.tensor([2.0]), eta=0.9)
    torch.testing.assert_close(omega, torch.tensor([1.0]))


def test_extreme_gaps_stay_finite() -> None:
    gap = torch.tensor([1e30, -1e30, 0.0])
    omega = allocation(
        gap, torch.zeros(3, dtype=torch.long), torch.tensor([1.0]), eta=1.0, tau=1e-3, d=math.inf
    )
    assert torch.isfinite(omega).all()
    torch.testing.assert_close(omega.mean(), torch.tensor(1.0))


def test_batch_global_oracle_and_broken_mean() -> None:
    b = random_batch(7)
    cfg = CreditConfig()
    eta = 0.7
    got = ALLOCATIONS.get("batch-global")(b.gap, b.action_index, b.credit, eta, cfg, None)
    s = [
        ((c > 0) - (c < 0)) * min(max(float(g), -cfg.d), cfg.d) / cfg.tau
        for g, c in zip(b.gap.tolist(), b.credit[b.action_index].tolist())
    ]
    m = max(s)
    z = sum(math.exp(x - m) for x in s)
    length = segment_count(b.action_index, b.credit.numel())
    want = [
        (1 - eta) + eta * int(length[a]) * math.exp(x - m) / z
        for x, a in zip(s, b.action_index.tolist())
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    means = segment_mean(got, b.action_index, b.credit.numel())
    assert (means - 1).abs().max() > 1e-3


def test_token_shuffled_permutes_within_actions() -> None:
    b = random_batch(9, max_l=12)
    cfg = CreditConfig()
    g = torch.Generator().manual_seed(0)
    shuffled = ALLOCATIONS.get("token-shuffled")(b.gap, b.action_index, b.credit, 0.7, cfg, g)
    plain = allocation(b.gap, b.action_index, b.credit, 0.7, cfg.tau, cfg.d)
    for toks in segments(b.action_index.tolist()).values():
        assert sorted(shuffled[toks].tolist()) == pytest.approx(sorted(plain[toks].tolist()))
    assert not torch.allclose(shuffled, plain)
    # Seeded: the same generator seed gives the same permutation.
    again = ALLOCATIONS.get("token-shuffled")(
        b.gap, b.action_index, b.credit, 0.7, cfg, torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(shuffled, again)


def test_uniform_allocation_is_ones() -> None:
    b = random_batch(1)
    w = ALLOCATIONS.get("uniform")(b.gap, b.action_index, b.credit, 0.0, CreditConfig(), None)
    torch.testing.assert_close(w, torch.ones_like(b.gap))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eta": 1.5}, "eta must lie in"),
        ({"eta": -0.1}, "eta must lie in"),
        ({"tau": 0.0}, "tau must be > 0"),
        ({"tau": -1.0}, "tau must be > 0"),
        ({"d": 0.0}, "d must be > 0"),
        ({"gap": torch.tensor([0.0, float("nan"), 0.0])}, "gap contains NaN"),
        ({"gap": torch.tensor([0.0, 1.0])}, "action_index has length 3, expected 2"),
        ({"action_index": torch.tensor([0, 0, 0])}, "leaves action 1 without any entry"),
        ({"credit": torch.tensor([])}, "credit is empty"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, message: str) -> None:
    args = {
        "gap": torch.tensor([0.1, 0.2, 0.3]),
        "action_index": torch.tensor([0, 0, 1]),
        "credit": torch.tensor([1.0, -1.0]),
        "eta": 0.5,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        allocation(**args)


def _psi_oracle(gap, action_index, credit, strength, cfg):
    lo, hi = cfg.psi_bounds
    return serl_oracle(gap, action_index, credit, strength, lo, hi)


# Loop oracle of every allocation; "token-shuffled" is checked as a within-action permutation.
ALLOCATION_ORACLES = {
    "per-action": lambda g, a, c, s, cfg: allocation_oracle(g, a, c, s, cfg.tau, cfg.d),
    "uniform": lambda g, a, c, s, cfg: [1.0] * len(g),
    "batch-global": lambda g, a, c, s, cfg: batch_global_oracle(g, a, c, s, cfg.tau, cfg.d),
    "token-shuffled": lambda g, a, c, s, cfg: allocation_oracle(g, a, c, s, cfg.tau, cfg.d),
    "serl-psi": _psi_oracle,
}
PERMUTED = {"token-shuffled"}


def test_every_allocation_has_an_oracle() -> None:
    assert set(ALLOCATION_ORACLES) == set(ALLOCATIONS.names())


@pytest.mark.parametrize("name", ALLOCATIONS.names())
@pytest.mark.parametrize("strength", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("seed", range(2))
def test_every_allocation_matches_its_oracle(name: str, strength: float, seed: int) -> None:
    b = random_batch(seed, max_l=12)
    cfg = CreditConfig(tau=0.5, d=2.0)
    gen = torch.Generator().manual_seed(seed)
    got = ALLOCATIONS.get(name)(b.gap, b.action_index, b.credit, strength, cfg, gen)
    want = torch.tensor(
        ALLOCATION_ORACLES[name](b.gap, b.action_index, b.credit, strength, cfg),
        dtype=torch.float64,
    )
    assert bool((got >= 0).all())
    if name in PERMUTED:  # the oracle's weights, permuted within each action
        for toks in segments(b.action_index.tolist()).values():
            assert sorted(got[toks].tolist()) == pytest.approx(sorted(want[toks].tolist()))
    else:
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
