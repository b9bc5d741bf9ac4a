"""The start -> final comparison: a paired bootstrap over items, checked against a slow loop."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from factor_cli.train.evaluate import metric, paired_comparison


def _items(success: list[int], category: list[str], prefix: str = "i") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "item_id": [f"{prefix}{k}" for k in range(len(success))],
            "category": category,
            "success": success,
        }
    )


def _oracle_interval(
    start: pd.DataFrame, final: pd.DataFrame, replicates: int, seed: int
) -> tuple[float, float]:
    """Obvious loop: per replicate, per category, draw n_c items with replacement, average their
    d_i = s^final_i - s^start_i, then average the categories; percentile interval."""
    rng = random.Random(seed)
    pairs = start.merge(final, on=["item_id", "category"], suffixes=("_start", "_final"))
    by_cat: dict[str, list[int]] = {}
    for _, row in pairs.iterrows():
        by_cat.setdefault(row["category"], []).append(row["success_final"] - row["success_start"])
    reps = []
    for _ in range(replicates):
        means = []
        for d in by_cat.values():
            draw = [d[rng.randrange(len(d))] for _ in range(len(d))]
            means.append(sum(draw) / len(draw))
        reps.append(sum(means) / len(means))
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return float(lo), float(hi)


def test_interval_matches_a_slow_loop_and_is_seeded() -> None:
    gen = np.random.default_rng(3)
    n = 40
    category = [("a", "b", "c")[k % 3] for k in range(n)]
    start = _items(list(gen.integers(0, 2, n)), category)
    # The final policy wins most items the start won, plus some: a paired, correlated change.
    final = start.assign(success=np.maximum(start["success"], gen.integers(0, 2, n)))
    final.loc[[0, 5], "success"] = 0
    cmp = paired_comparison(start, final, seed=11, replicates=20_000)
    assert cmp.delta == pytest.approx(metric(final) - metric(start), abs=1e-12)
    assert (cmp.start, cmp.final) == (pytest.approx(metric(start)), pytest.approx(metric(final)))
    lo, hi = _oracle_interval(start, final, 20_000, seed=5)
    # Two Monte-Carlo estimates of the same percentiles (SE ~ 0.004 each at R = 20,000).
    assert cmp.ci_low == pytest.approx(lo, abs=0.025)
    assert cmp.ci_high == pytest.approx(hi, abs=0.025)
    assert cmp.ci_low <= cmp.delta <= cmp.ci_high
    assert paired_comparison(start, final, seed=11, replicates=20_000) == cmp  # seeded
    assert (cmp.items, cmp.replicates, cmp.confidence) == (n, 20_000, 0.95)


def test_pairs_are_kept_not_resampled_independently() -> None:
    """Every item flips 0 -> 1: each d_i = 1, so every paired replicate is exactly 1 (an
    unpaired bootstrap of the two success rates would spread)."""
    start = _items([0] * 10, ["x"] * 5 + ["y"] * 5)
    final = start.assign(success=1)
    cmp = paired_comparison(start, final, seed=0, replicates=500)
    assert (cmp.delta, cmp.ci_low, cmp.ci_high) == (1.0, 1.0, 1.0)
    same = paired_comparison(start, start, seed=0, replicates=500)
    assert (same.delta, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)


def test_items_are_matched_by_id_and_only_shared_items_count() -> None:
    start = _items([1, 0, 1], ["a", "a", "b"])
    final = _items([0, 1, 1, 1], ["a", "a", "b", "b"]).iloc[::-1]  # another order, one extra
    cmp = paired_comparison(start, final, seed=0, replicates=200)
    assert cmp.items == 3
    assert cmp.delta == pytest.approx(0.0)  # a: (0-1 + 1-0)/2 = 0; b: 1-1 = 0
    with pytest.raises(ValueError, match="share no item"):
        paired_comparison(start, _items([1], ["a"], prefix="other"), seed=0)
