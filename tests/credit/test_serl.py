"""SERL's psi multipliers and action-only KL against loop oracles."""

from __future__ import annotations

import math

import pytest
import torch
from oracles import random_batch, serl_oracle

from factor_cli.credit import action_kl, coefficient_deviation, serl_weights


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize(("clip", "bounds"), [(0.2, None), (0.5, None), (0.2, (0.0, 5.0))])
@pytest.mark.parametrize("seed", range(3))
def test_serl_weights_match_oracle(seed: int, alpha: float, clip: float, bounds) -> None:
    b = random_batch(seed)
    lo, hi = bounds if bounds else (1 - clip, 1 + clip)
    kw = {"psi_min": lo, "psi_max": hi} if bounds else {}
    got = serl_weights(b.gap, b.action_index, b.credit, alpha, clip, **kw)
    want = torch.tensor(
        serl_oracle(b.gap, b.action_index, b.credit, alpha, lo, hi), dtype=torch.float64
    )
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_serl_mean_drifts_from_one() -> None:
    # Nothing normalises psi within an action, so w-bar_t != 1 in general (the paper's 6.7% median).
    b = random_batch(4, max_l=20)
    w = serl_weights(b.gap, b.action_index, b.credit, 0.5)
    dev = coefficient_deviation(w, b.action_index, b.credit.numel())
    assert float(dev.max()) > 0.01


def test_serl_extreme_gap_is_clipped() -> None:
    w = serl_weights(torch.tensor([1e6, -1e6]), torch.tensor([0, 0]), torch.tensor([1.0]), 1.0)
    torch.testing.assert_close(w, torch.tensor([1.2, 0.8]))


def test_serl_bad_bounds() -> None:
    with pytest.raises(ValueError, match="psi bounds"):
        serl_weights(
            torch.tensor([0.0]),
            torch.tensor([0]),
            torch.tensor([1.0]),
            0.5,
            psi_min=2.0,
            psi_max=1.0,
        )
    with pytest.raises(ValueError, match="alpha must lie in"):
        serl_weights(torch.tensor([0.0]), torch.tensor([0]), torch.tensor([1.0]), 1.5)


def test_action_kl_matches_loop_oracle_and_gradient_flows_to_student_only() -> None:
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    student = torch.randn(7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    got = action_kl(teacher, student)
    want = 0.0
    for i in range(7):
        pt = torch.softmax(teacher[i].detach(), -1).tolist()
        ps = torch.softmax(student[i].detach(), -1).tolist()
        want += sum(a * (math.log(a) - math.log(b)) for a, b in zip(pt, ps))
    assert float(got.detach()) == pytest.approx(want / 7, rel=1e-5)
    got.backward()
    assert teacher.grad is None
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert float(action_kl(teacher, teacher.detach().clone()).detach()) == pytest.approx(
        0.0, abs=1e-6
    )
    with pytest.raises(ValueError, match="teacher_logits and student_logits"):
        action_kl(teacher, student[:, :5])
