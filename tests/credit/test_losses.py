"""Policy loss against a loop oracle; properties 3 and 4; split invariance of the normaliser."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import kl_oracle, loss_oracle, random_batch

from factor_cli.credit import (
    REDUCTIONS,
    ActionTokens,
    DistillTokens,
    NonActionTokens,
    Normalizers,
    action_kl,
    action_surrogate_weight,
    action_surrogates,
    allocation,
    non_action_loss,
    objective,
    policy_loss,
)
from factor_cli.credit.segments import segment_count, segment_sum


@pytest.mark.parametrize("reduction", REDUCTIONS.names())
@pytest.mark.parametrize("eps", [0.2, 0.05])
@pytest.mark.parametrize("seed", range(4))
def test_policy_loss_matches_loop_oracle(seed: int, reduction: str, eps: float) -> None:
    b = random_batch(seed)
    coef = b.credit[b.action_index] * allocation(b.gap, b.action_index, b.credit, 0.7)
    got = policy_loss(b.logp, b.logp_old, coef, b.action_index, reduction, eps)
    want = loss_oracle(b.logp, b.logp_old, coef, b.action_index, reduction, eps)
    assert float(got) == pytest.approx(want, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), eta=st.floats(0.0, 1.0), tau=st.floats(0.05, 20.0))
def test_property_action_surrogate_equals_credit(seed: int, eta: float, tau: float) -> None:
    """Property 3: at q = 1, before clipping, 1/L_t sum_j C_{t,j} = A*_t whatever L_t."""
    b = random_batch(seed, max_l=30, dtype=torch.float32)
    coef = b.credit[b.action_index] * allocation(b.gap, b.action_index, b.credit, eta, tau)
    surr = action_surrogates(b.logp_old, b.logp_old, coef, b.action_index)
    torch.testing.assert_close(
        surr, b.credit, atol=1e-6 * max(1.0, float(b.credit.abs().max())), rtol=0
    )


def _per_action_grad(reduction: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = random_batch(seed, max_l=25)
    coef = b.credit[b.action_index] * allocation(b.gap, b.action_index, b.credit, 0.7)
    logp = b.logp_old.clone().requires_grad_(True)
    policy_loss(logp, b.logp_old, coef, b.action_index, reduction).backward()
    n_act = b.credit.numel()
    # Gradient reaching each action at q = 1, per unit of its credit.
    g = segment_sum(-logp.grad, b.action_index, n_act)
    keep = b.credit.abs() > 1e-3
    lengths = segment_count(b.action_index, n_act)
    return (g[keep] / b.credit[keep]), lengths[keep], torch.tensor([coef.numel(), n_act])


def test_property_token_mean_weight_grows_with_length() -> None:
    """Property 4 (token-mean): an action's weight is L_t / N_tok, growing with its length."""
    weight, lengths, (n_tok, _) = _per_action_grad("token-mean", 2)
    torch.testing.assert_close(weight, lengths.double() / float(n_tok))
    assert weight[lengths == lengths.max()].min() > weight[lengths == lengths.min()].max()


def test_property_action_mean_weight_independent_of_length() -> None:
    """Property 4 (action-mean): every action weighs 1 / N_act whatever L_t."""
    weight, lengths, (_, n_act) = _per_action_grad("action-mean", 2)
    assert lengths.unique().numel() > 3
    torch.testing.assert_close(weight, torch.full_like(weight, 1.0 / float(n_act)))


def test_surrogate_weight_diagnostic_matches_property_4() -> None:
    b = random_batch(6, max_l=25)
    omega = allocation(b.gap, b.action_index, b.credit, 0.7)
    n_act = b.credit.numel()
    lengths = segment_count(b.action_index, n_act).double()
    am = action_surrogate_weight(omega, b.action_index, n_act, "action-mean")
    tm = action_surrogate_weight(omega, b.action_index, n_act, "token-mean")
    torch.testing.assert_close(am, torch.ones(n_act, dtype=torch.float64))
    torch.testing.assert_close(tm, lengths / lengths.mean())


@pytest.mark.parametrize("reduction", ["token-mean", "action-mean"])
def test_global_normalizer_makes_split_invariant(reduction: str) -> None:
    # Two micro-batches (split at an action boundary) with the global count sum to the full loss.
    b = random_batch(8)
    coef = b.credit[b.action_index]
    full = policy_loss(b.logp, b.logp_old, coef, b.action_index, reduction)
    cut_action = b.credit.numel() // 2
    cut = int((b.action_index < cut_action).sum())
    count = b.action_index.numel() if reduction == "token-mean" else b.credit.numel()
    parts = [
        policy_loss(
            b.logp[s],
            b.logp_old[s],
            coef[s],
            b.action_index[s] - b.action_index[s][0],
            reduction,
            normalizer=count,
        )
        for s in (slice(0, cut), slice(cut, None))
    ]
    assert float(sum(parts)) == pytest.approx(float(full), abs=1e-12)


def test_clipping_cuts_gradient_outside_trust_region() -> None:
    logp_old = torch.zeros(2, dtype=torch.float64)
    logp = torch.log(torch.tensor([1.5, 0.5], dtype=torch.float64)).requires_grad_(True)
    coef = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss = policy_loss(logp, logp_old, coef, torch.tensor([0, 1]), "token-mean")
    loss.backward()
    # q = 1.5 > 1 + eps with C > 0, and q = 0.5 < 1 - eps with C < 0: both clipped, zero gradient.
    torch.testing.assert_close(logp.grad, torch.zeros(2, dtype=torch.float64))
    assert float(loss.detach()) == pytest.approx(-(1.2 * 1 + 0.8 * -1) / 2)


def _objective_inputs(seed: int) -> tuple[ActionTokens, NonActionTokens, DistillTokens]:
    """A random batch's action branch, a non-action branch over the same trajectories, and
    teacher / student logits at the action tokens."""
    b = random_batch(seed)
    g = torch.Generator().manual_seed(seed)
    coef = b.credit[b.action_index] * allocation(b.gap, b.action_index, b.credit, 0.7)
    action = ActionTokens(b.logp, b.logp_old, coef, b.action_index)
    n_na = 2 * len(b.lengths_T)
    na_old = -torch.rand(n_na, generator=g, dtype=torch.float64) * 3
    non_action = NonActionTokens(
        na_old + torch.randn(n_na, generator=g, dtype=torch.float64) * 0.3,
        na_old,
        torch.arange(n_na) // 2,
        torch.randn(len(b.lengths_T), generator=g, dtype=torch.float64),
    )
    n_tok = b.action_index.numel()
    distill = DistillTokens(
        torch.randn(n_tok, 6, generator=g, dtype=torch.float64),
        torch.randn(n_tok, 6, generator=g, dtype=torch.float64),
    )
    return action, non_action, distill


@pytest.mark.parametrize("reduction", REDUCTIONS.names())
def test_objective_terms_match_oracles_and_sum(reduction: str) -> None:
    """L = L_act + L_non-act + lambda_k L^SERL_act, each term against its loop oracle."""
    action, na, distill = _objective_inputs(11)
    obj = objective(action, reduction, 0.2, na, distill, kl_coef=0.25)
    want_act = loss_oracle(
        action.logp, action.logp_old, action.coef, action.action_index, reduction, 0.2
    )
    na_coef = na.a_seq[na.traj_index]
    want_na = loss_oracle(na.logp, na.logp_old, na_coef, na.traj_index, "token-mean", 0.2)
    want_kl = kl_oracle(distill.teacher_logits, distill.student_logits)
    assert float(obj.action) == pytest.approx(want_act, abs=1e-12)
    assert float(obj.non_action) == pytest.approx(want_na, abs=1e-12)
    assert float(obj.kl) == pytest.approx(want_kl, rel=1e-6)  # action_kl works in float32
    total = float(obj.action) + float(obj.non_action) + 0.25 * float(obj.kl)
    assert float(obj.total) == pytest.approx(total, abs=1e-12)
    # Absent branches count as 0: the action branch alone is the policy loss.
    alone = objective(action, reduction)
    assert float(alone.total) == float(
        policy_loss(action.logp, action.logp_old, action.coef, action.action_index, reduction)
    )
    assert float(alone.non_action) == 0.0 and float(alone.kl) == 0.0


@pytest.mark.parametrize("reduction", REDUCTIONS.names())
def test_objective_with_global_normalizers_is_split_invariant(reduction: str) -> None:
    """Micro-batches (split at action boundaries) normalised by the whole batch's counts sum to
    the whole batch's objective, every term included: what the trainer relies on."""
    action, na, distill = _objective_inputs(12)
    full = objective(action, reduction, 0.2, na, distill, kl_coef=0.3)
    n_act = int(action.action_index.max()) + 1
    norm = Normalizers(n_act, action.logp.numel(), na.logp.numel())
    # Cut at a trajectory boundary, so each trajectory's non-action tokens land in one part.
    traj_of_action = random_batch(12).traj_index
    n_traj = int(traj_of_action.max()) + 1
    cut = int((traj_of_action < n_traj // 3).sum())
    parts = []
    for lo, hi in ((0, cut), (cut, n_act)):
        tok = (action.action_index >= lo) & (action.action_index < hi)
        trajs = traj_of_action[lo:hi].unique()
        na_tok = torch.isin(na.traj_index, trajs)
        parts.append(
            objective(
                ActionTokens(
                    action.logp[tok],
                    action.logp_old[tok],
                    action.coef[tok],
                    action.action_index[tok] - lo,
                ),
                reduction,
                0.2,
                NonActionTokens(
                    na.logp[na_tok], na.logp_old[na_tok], na.traj_index[na_tok], na.a_seq
                ),
                DistillTokens(distill.teacher_logits[tok], distill.student_logits[tok]),
                kl_coef=0.3,
                normalizers=norm,
            )
        )
    # The KL (and so the total) is computed in float32: it agrees to float32 rounding.
    for term, tol in (("action", 1e-12), ("non_action", 1e-12), ("kl", 1e-6), ("total", 1e-6)):
        got = sum(float(getattr(p, term)) for p in parts)
        assert got == pytest.approx(float(getattr(full, term)), abs=tol), term


def test_objective_kl_term_is_action_kl() -> None:
    action, _, distill = _objective_inputs(13)
    obj = objective(action, distill=distill, kl_coef=0.5)
    assert float(obj.kl) == float(action_kl(distill.teacher_logits, distill.student_logits))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"reduction": "sequence-mean"},
            "unknown reduction 'sequence-mean'; valid: token-mean, action-mean",
        ),
        ({"clip_eps": 0.0}, "clip_eps must be > 0"),
        ({"coef": torch.tensor([1.0])}, "coef has length 1, expected 2"),
        ({"logp": torch.tensor([float("nan"), 0.0])}, "logp contains NaN"),
        ({"logp": torch.tensor([])}, "logp is empty"),
    ],
)
def test_bad_input(kwargs: dict, message: str) -> None:
    args = {
        "logp": torch.zeros(2),
        "logp_old": torch.zeros(2),
        "coef": torch.ones(2),
        "action_index": torch.tensor([0, 1]),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        policy_loss(**args)


def test_non_action_loss_is_token_mean_with_a_seq() -> None:
    b = random_batch(10)
    a_seq = torch.randn(len(b.lengths_T), dtype=torch.float64)
    traj_of_tok = b.traj_index[b.action_index]
    got = non_action_loss(b.logp, b.logp_old, traj_of_tok, a_seq)
    want = loss_oracle(b.logp, b.logp_old, a_seq[traj_of_tok], b.action_index, "token-mean", 0.2)
    assert float(got) == pytest.approx(want, abs=1e-12)
    with pytest.raises(ValueError, match="token_traj_index values must lie in"):
        non_action_loss(b.logp, b.logp_old, traj_of_tok + 100, a_seq)
