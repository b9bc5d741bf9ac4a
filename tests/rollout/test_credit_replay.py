"""``factor diagnose compare``'s replay of recorded actions through every estimator, on a
hand-made step whose credit can be computed by hand, and its agreement table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from factor_cli.rollout.credit_replay import history_keys, replay_credit
from factor_cli.stats.diagnose import credit_agreement

# (traj, group, instance, actions, outcome): two groups of two; A^seq = outcome - 0.5, V~(x_0)
# = 0.5 (leave-one-out with a partner of the other outcome), V(x_t) = 0.3 + 0.1 t.
EPISODES = [
    (0, 0, "a", ["go", "take"], 1.0),
    (1, 0, "a", ["go", "look", "take"], 0.0),
    (2, 1, "b", ["x"], 1.0),
    (3, 1, "b", ["y", "x"], 0.0),
]


def _step(values: bool = True) -> pd.DataFrame:
    rows = []
    for traj, group, inst, acts, out in EPISODES:
        for t, a in enumerate(acts):
            rows.append({
                "run_id": "r", "method": "factor", "env": "twx", "seed": 1, "step": 1,
                "traj": traj, "group": group, "instance": inst, "turn": t, "turns": len(acts),
                "action": a, "length": 3, "outcome": out, "a_seq": out - 0.5, "v0": 0.5,
                "credit": 0.0, "value": 0.3 + 0.1 * t if values else None,
            })  # fmt: skip
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # any row order


def test_history_keys_name_the_state_by_instance_and_earlier_actions() -> None:
    step = _step().sort_values(["traj", "turn"])
    keys = history_keys(step)
    assert keys[0] == keys[2] == "a"  # both episodes of group 0 start in the same state
    assert keys[1] == keys[3] == "a\x1fgo"  # and are in the same state after "go"
    assert keys[4] == "a\x1fgo\x1flook"
    assert keys[5] == keys[6] == "b" and keys[7] == "b\x1fy"


def test_replay_gives_each_estimator_s_credit_by_hand() -> None:
    got = replay_credit(_step()).set_index(["traj", "turn"])
    # broadcast: A^seq on every action
    assert got["broadcast"].tolist() == [0.5, 0.5, -0.5, -0.5, -0.5, 0.5, -0.5, -0.5]
    # TD: A_t = r_t + V(x_{t+1}) - V(x_t), V(x_0) = V~(x_0) = 0.5, r_{T-1} = A^seq + V~(x_0)
    td = [0.4 - 0.5, 1.0 - 0.4, 0.4 - 0.5, 0.5 - 0.4, 0.0 - 0.5, 1.0 - 0.5, 0.4 - 0.5, 0.0 - 0.4]
    np.testing.assert_allclose(got["td"].to_numpy(), td, atol=1e-12)
    sums = got["td"].groupby(level="traj").sum().to_numpy()
    np.testing.assert_allclose(sums, [0.5, -0.5, 0.5, -0.5], atol=1e-12)  # TD conserves A^seq
    # GiGPO: actions 0 and 2 (state "a"), 1 and 3 (state "a|go") share anchors with opposite
    # returns, so their step advantage adds to the episode's; the single-state ones do not.
    g = got["gigpo"]
    assert g.loc[(0, 0)] > 0.5 and g.loc[(1, 0)] < -0.5 and g.loc[(1, 2)] == pytest.approx(-0.5)


def test_value_estimators_give_nan_without_values() -> None:
    got = replay_credit(_step(values=False))
    assert got["td"].isna().all() and got["gae-0.95"].isna().all()
    assert got["broadcast"].notna().all() and got["gigpo"].notna().all()


def test_unknown_estimator_fails_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown credit estimator 'nonsense'; valid: td"):
        replay_credit(_step(), ["nonsense"])


def test_agreement_by_hand() -> None:
    frame = pd.DataFrame({
        "method": ["m"] * 4,
        "a": [1.0, -1.0, 2.0, 0.0],
        "b": [3.0, 1.0, 1.0, 5.0],
        "c": [np.nan] * 4,
    })  # fmt: skip
    table = credit_agreement(frame, ["a", "b", "c"])
    assert len(table) == 1  # c has no credit here: left out
    row = table.iloc[0]
    assert row["both_credited"] == 3 and row["sign_agree"] == pytest.approx(2 / 3)
    # average ranks: a [3, 1, 4, 2]; b [3, 1.5, 1.5, 4] (the tied 1s share ranks 1 and 2)
    ra, rb = np.array([3, 1, 4, 2.0]), np.array([3, 1.5, 1.5, 4])
    assert row["spearman"] == pytest.approx(np.corrcoef(ra, rb)[0, 1])
