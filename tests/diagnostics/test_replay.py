"""The Monte-Carlo replays' edge: a replayed step with no action to check plays nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from factor_cli.diagnostics.replay import MC_COLUMNS, McPlan, mc_advantages


def test_a_step_with_no_credited_action_plays_nothing_and_returns_no_rows() -> None:
    """Every group of the step had one outcome (all credit zero, as on easy tasks): td-sign
    draws no action, so there is no environment to open and no policy to load (only the turn
    limit of the config is read; the policy is None here)."""
    step = pd.DataFrame({"traj": [0, 0], "turn": [0, 1], "action": ["go east", "take coin"]})
    chosen = step.iloc[0:0].assign(instance=[], group=[], step=[], turns=[], success=[])
    cfg = SimpleNamespace(env=SimpleNamespace(max_turns=6))
    rows = mc_advantages(cfg, None, step, chosen, McPlan(4, 8, 0))  # type: ignore[arg-type]
    assert rows.empty and list(rows.columns) == list(MC_COLUMNS)


def test_feedback_and_token_perturb_skip_a_step_with_no_credited_action(tmp_path) -> None:
    """Both replay a step's drawn trajectories from its checkpoint; with no credited action
    nothing is drawn, so neither opens a checkpoint (there is none under ``tmp_path``) or an
    environment pool (of size 0: the crash this guards against)."""
    from factor_cli.diagnostics import feedback_probe, token_perturb

    step = pd.DataFrame({"step": [3, 3], "traj": [0, 0], "turn": [0, 1], "credit": [0.0, 0.0],
                         "action": ["go east", "take coin"]})  # fmt: skip
    assert feedback_probe.replay_step(tmp_path, step, McPlan(1, 16, 0)) is None
    for module, rows_of in ((feedback_probe, feedback_probe.feedback_rows),
                            (token_perturb, token_perturb.perturb_rows)):  # fmt: skip
        rows = rows_of(tmp_path, step, "factor", McPlan(4, 8, 0))
        assert rows.empty and list(rows.columns) == list(module.COLUMNS)
