"""One group standardisation, three zero rules (``segments.segment_standardize``), against a
slow per-group loop on random inputs; the three methods that standardise use it."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from factor_cli.credit.segments import segment_standardize


def oracle(x: list[float], index: list[int], rule: str, eps: float, ddof: int, divide: bool,
           min_std: float) -> tuple[list[float], list[bool]]:  # fmt: skip
    z, live = [0.0] * len(x), [False] * len(x)
    for s in set(index):
        members = [e for e, i in enumerate(index) if i == s]
        vals = [x[e] for e in members]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / max(len(vals) - ddof, 1))
        for e in members:
            c = x[e] - mean
            if rule == "min-std":
                ok = std >= min_std
            elif rule == "singleton":
                ok = len(vals) > 1
            else:
                scale = max(abs(v) for v in vals)
                tiny = 8 * torch.finfo(torch.float64).eps
                ok = len(vals) > 1 and max(vals) > min(vals) and abs(c) > tiny * scale
            live[e] = ok
            z[e] = (c / (std + eps) if divide else c) if ok else 0.0
    return z, live


@settings(max_examples=150, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.5]), min_size=1, max_size=5),
        min_size=1, max_size=6,
    ),
    rule=st.sampled_from(["min-std", "singleton", "no-contrast"]),
    ddof=st.sampled_from([0, 1]),
    divide=st.booleans(),
)  # fmt: skip
def test_matches_the_per_group_loop(groups, rule, ddof, divide) -> None:
    x = [v for g in groups for v in g]
    index = [s for s, g in enumerate(groups) for _ in g]
    z, live = segment_standardize(
        torch.tensor(x, dtype=torch.float64), torch.tensor(index), len(groups), rule, 1e-6,
        ddof=ddof, divide=divide, min_std=1e-6,
    )  # fmt: skip
    want_z, want_live = oracle(x, index, rule, 1e-6, ddof, divide, 1e-6)
    assert live.tolist() == want_live
    assert torch.allclose(z, torch.tensor(want_z, dtype=torch.float64), atol=1e-12)


def test_the_rules_differ_where_the_methods_do() -> None:
    """A group of one equal value and a group of two equal values: min-std zeroes both (no
    spread); singleton keeps the pair live (0 / eps = 0 anyway); no-contrast drops both."""
    x, index = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64), torch.tensor([0, 1, 1])
    lives = {
        rule: segment_standardize(x, index, 2, rule, 1e-6, min_std=1e-6)[1].tolist()
        for rule in ("min-std", "singleton", "no-contrast")
    }
    assert lives == {
        "min-std": [False, False, False],
        "singleton": [False, True, True],
        "no-contrast": [False, False, False],
    }
