"""Diagnostics the paper reports, as pure functions (logging happens in the trainer).

* coefficient deviation |w-bar_t - 1| per action (Figure 5A, Table 18);
* conservation drift sum_t A_t - A^seq_i per trajectory (0 for TAC, uniform, shuffled);
* pre-clipping surrogate weight per action and its length-stratified means (Table 24 / P.1);
* sign agreement of action credit with an independent reference (Figure 5B);
* the signal RL gets: groups with any non-zero A^seq, actions with zero credit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .segments import segment_count, segment_mean, segment_sum


def coefficient_deviation(weight: Tensor, action_index: Tensor, num_actions: int) -> Tensor:
    """|w-bar_t - 1| with w-bar_t = 1/L_t sum_j w_{t,j}; shape [N_act]."""
    return (segment_mean(weight, action_index.long(), num_actions) - 1.0).abs()


def conservation_drift(credit: Tensor, traj_index: Tensor, a_seq: Tensor) -> Tensor:
    """sum_t A_t - A^seq_i per trajectory, [N_traj] (exactly 0 up to rounding for TAC)."""
    return segment_sum(credit, traj_index.long(), a_seq.numel()) - a_seq


def action_surrogate_weight(
    weight: Tensor, action_index: Tensor, num_actions: int, reduction: str
) -> Tensor:
    """Weight of each action's credit in the pre-clipping surrogate at q = 1, normalised so that
    an action with mean multiplier 1 weighs 1 under action-mean:

        action-mean:  w-bar_t
        token-mean:   L_t w-bar_t / L-bar        (L-bar = N_tok / N_act, the mean action length)

    Shape [N_act]. Under token-mean the weight grows with L_t; under action-mean it does not.
    """
    idx = action_index.long()
    mean_w = segment_mean(weight, idx, num_actions)
    if reduction == "action-mean":
        return mean_w
    if reduction == "token-mean":
        length = segment_count(idx, num_actions).to(weight.dtype)
        return length * mean_w / (weight.numel() / num_actions)
    raise ValueError(f"reduction must be 'action-mean' or 'token-mean', got {reduction!r}")


LENGTH_BINS = (6, 10, 16)
"""Upper edges of the paper's token-count quartiles: Q1 <= 6, Q2 7-10, Q3 11-16, Q4 >= 17."""


def length_bias_table(
    surrogate_weight: Tensor, lengths: Tensor, edges: Sequence[int] = LENGTH_BINS
) -> list[tuple[str, int, float]]:
    """Mean surrogate weight per token-count bin: [(label, count, mean)], empty bins give NaN."""
    edges_t = torch.tensor(list(edges), dtype=lengths.dtype, device=lengths.device)
    bins = torch.bucketize(lengths, edges_t, right=False)
    n_bins = len(edges) + 1
    count = segment_count(bins, n_bins)
    mean = segment_sum(surrogate_weight.double(), bins, n_bins) / count.clamp_min(1)
    lo = [1, *[e + 1 for e in edges]]
    labels = [f"Q{b + 1} ({lo[b]}-{edges[b]})" for b in range(len(edges))] + [
        f"Q{n_bins} (>={lo[-1]})"
    ]
    return [
        (labels[b], int(count[b]), float(mean[b]) if count[b] > 0 else float("nan"))
        for b in range(n_bins)
    ]


def sign_agreement(credit: Tensor, reference: Tensor, min_abs: float = 1e-6) -> float:
    """Fraction of actions with sign(credit) = sign(reference), among those where both
    |credit|, |reference| >= min_abs.

    NaN when no action qualifies.
    """
    keep = (credit.abs() >= min_abs) & (reference.abs() >= min_abs)
    if not bool(keep.any()):
        return float("nan")
    return float((torch.sign(credit[keep]) == torch.sign(reference[keep])).double().mean())


def group_signal(a_seq: Tensor, group_index: Tensor, min_abs: float = 1e-6) -> float:
    """Share of groups whose outcome gives any member a signal: the fraction of groups g with
    max_{i in g} |A^seq_i| >= ``min_abs``.

    a_seq [N_traj] (A^seq_i), group_index [N_traj] (any integer ids; each distinct id is a
    group). Under the leave-one-out baseline an all-success or all-failure group has
    A^seq_i = 0 for every member, so it teaches nothing through the outcome. NaN when there is
    no trajectory.
    """
    if a_seq.numel() == 0:
        return float("nan")
    _, groups = torch.unique(group_index, return_inverse=True)
    n = int(groups.max()) + 1
    peak = torch.zeros(n, dtype=a_seq.dtype).scatter_reduce(
        0, groups, a_seq.abs(), reduce="amax", include_self=True
    )
    return float((peak >= min_abs).double().mean())


def zero_credit_share(credit: Tensor, min_abs: float = 1e-6) -> float:
    """Share of actions with |A_t| < ``min_abs``, credit [N_act]; NaN when there is none."""
    if credit.numel() == 0:
        return float("nan")
    return float((credit.abs() < min_abs).double().mean())


def top_quartile_mass(weight: Tensor, action_index: Tensor, num_actions: int) -> Tensor:
    """Share of each action's allocation on its top quarter of tokens, [N_act]:

        m_t = sum_{j in top ceil(L_t / 4) of rho_{t,.}} rho_{t,j}  /  sum_j rho_{t,j}

    with rho_{t,j} proportional to ``weight`` [N_tok] within action t (omega_{t,j} = L_t rho_{t,j},
    so the ratio is the same on omega). Uniform allocation gives ceil(L_t / 4) / L_t; a
    concentrated one approaches 1. An action whose weights sum to 0 gives NaN.
    """
    idx = action_index.long()
    by_weight = torch.sort(weight, descending=True, stable=True).indices
    order = by_weight[torch.sort(idx[by_weight], stable=True).indices]  # action, then weight desc
    length = segment_count(idx, num_actions)  # [N_act]
    start = torch.cumsum(length, 0) - length  # first token position of each action (sorted)
    rank = torch.arange(weight.numel(), device=weight.device) - start[idx[order]]
    top = (rank < torch.ceil(length[idx[order]] / 4)).to(weight.dtype)
    kept = segment_sum(weight[order] * top, idx[order], num_actions)
    total = segment_sum(weight, idx, num_actions)
    return torch.where(total != 0, kept / total, torch.full_like(total, float("nan")))
