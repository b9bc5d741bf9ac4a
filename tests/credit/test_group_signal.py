"""The signal RL gets from a batch: groups with any non-zero A^seq, actions with zero credit."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from factor_cli.credit import CONVENTIONS, group_signal, zero_credit_share


def test_group_signal_worked_case() -> None:
    # Three groups of outcomes: all success, mixed, all failure -> leave-one-out A^seq is zero
    # in the first and last, so one group in three carries signal.
    outcome = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    group = torch.tensor([7, 7, 3, 3, 9, 9])
    a_seq = CONVENTIONS.get("leave-one-out")(outcome, group).a_seq
    assert group_signal(a_seq, group) == 1 / 3
    assert group_signal(torch.zeros(4), torch.tensor([0, 0, 1, 1])) == 0.0
    assert math.isnan(group_signal(torch.zeros(0), torch.zeros(0, dtype=torch.long)))


def test_zero_credit_share_worked_case() -> None:
    assert zero_credit_share(torch.tensor([0.0, 0.5, -1e-9, -0.2])) == 0.5
    assert math.isnan(zero_credit_share(torch.zeros(0)))


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.0, 1.0, 0.25])),
        min_size=1,
        max_size=30,
    )
)
def test_group_signal_matches_a_loop(rows: list[tuple[int, float]]) -> None:
    # Every group has at least two members (the leave-one-out baseline needs K >= 2).
    rows = rows + [(g, 1.0 - o) if i == 0 else (g, o) for i, (g, o) in enumerate(rows)]
    group = torch.tensor([g for g, _ in rows])
    outcome = torch.tensor([o for _, o in rows])
    a_seq = CONVENTIONS.get("leave-one-out")(outcome, group).a_seq
    by_group: dict[int, list[float]] = {}
    for g, a in zip(group.tolist(), a_seq.tolist()):
        by_group.setdefault(g, []).append(a)
    expected = sum(any(abs(a) >= 1e-6 for a in v) for v in by_group.values()) / len(by_group)
    assert group_signal(a_seq, group) == expected


def test_top_quartile_mass_worked_case_and_loop_oracle() -> None:
    from factor_cli.credit import top_quartile_mass

    # Action 0: 4 tokens, top 1 weighs 2 of 5. Action 1: 5 tokens uniform -> top 2 of 5.
    weight = torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])
    assert torch.allclose(top_quartile_mass(weight, index, 2), torch.tensor([0.4, 0.4]))
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 12, (30,), generator=gen)
    index = torch.repeat_interleave(torch.arange(30), lengths)
    weight = torch.rand(index.numel(), generator=gen)
    got = top_quartile_mass(weight, index, 30)
    for a in range(30):
        w = weight[index == a]
        k = -(-w.numel() // 4)
        assert torch.isclose(got[a], w.sort(descending=True).values[:k].sum() / w.sum())
