"""Segment reductions over a packed ragged batch.

A segment is the set of entries sharing one value of an index tensor: the tokens of an action
(``action_index[N_tok]``) or the actions of a trajectory (``traj_index[N_act]``). Everything here
is a scatter/gather kernel; no Python loop ever runs over actions or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def segment_count(index: Tensor, num_segments: int) -> Tensor:
    """n_s = |{e : index[e] = s}|, shape [num_segments], int64."""
    return torch.bincount(index, minlength=num_segments)


def segment_sum(x: Tensor, index: Tensor, num_segments: int) -> Tensor:
    """sum_{e : index[e] = s} x[e], shape [num_segments]."""
    return x.new_zeros(num_segments).index_add_(0, index, x)


def segment_mean(x: Tensor, index: Tensor, num_segments: int) -> Tensor:
    """Mean of x over each segment; empty segments give 0."""
    count = segment_count(index, num_segments).clamp_min(1).to(x.dtype)
    return segment_sum(x, index, num_segments) / count


def segment_max(x: Tensor, index: Tensor, num_segments: int) -> Tensor:
    """max_{e : index[e] = s} x[e]; empty segments give -inf."""
    out = x.new_full((num_segments,), float("-inf"))
    return out.scatter_reduce(0, index, x, reduce="amax", include_self=True)


SAFE_EXP = 60.0  # exp(+-60) is comfortably inside float32's range


def segment_softmax(
    x: Tensor, index: Tensor, num_segments: int, max_abs: float | None = None
) -> Tensor:
    """softmax_j(x) within each segment, shape like x; each segment sums to 1.

    The per-segment max is subtracted first so large logits cannot overflow, unless the caller
    guarantees |x| <= max_abs <= 60 (e.g. scores clipped to [-d/tau, d/tau]), where the shift
    cannot change the result and is skipped.
    """
    if max_abs is None or max_abs > SAFE_EXP:
        x = x - segment_max(x, index, num_segments).detach().index_select(0, index)
    e = x.exp()
    return e / segment_sum(e, index, num_segments).index_select(0, index)


@dataclass(frozen=True)
class Ragged:
    """Layout of contiguous segments: where each starts, its length, each entry's position.

    For actions grouped by trajectory: ``start[N_traj]``, ``length[N_traj]`` (= T_i),
    ``position[N_act]`` (= t, the turn within its trajectory), ``max_length`` (= max_i T_i).
    """

    start: Tensor
    length: Tensor
    position: Tensor
    max_length: int

    @staticmethod
    def of(index: Tensor, num_segments: int) -> Ragged:
        """Layout of a contiguous segment index (checked by the caller)."""
        n = index.numel()
        arange = torch.arange(n, device=index.device)
        start = torch.full((num_segments,), n, dtype=torch.long, device=index.device)
        start = start.scatter_reduce(0, index, arange, reduce="amin", include_self=True)
        length = segment_count(index, num_segments)
        position = arange - start[index]
        max_length = int(length.max()) if num_segments else 0
        return Ragged(start=start, length=length, position=position, max_length=max_length)

    def pad(self, x: Tensor, index: Tensor, fill: float = 0.0) -> Tensor:
        """Scatter x[N] into a dense [num_segments, max_length] tensor, ``fill`` past the end."""
        out = x.new_full((self.length.numel(), self.max_length), fill)
        out[index, self.position] = x
        return out

    def unpad(self, dense: Tensor, index: Tensor) -> Tensor:
        """Gather the entries of a dense [num_segments, max_length] tensor back to x[N]."""
        return dense[index, self.position]


def run_ids(index: Tensor) -> Tensor:
    """Id of the contiguous run each entry belongs to (0, 0, 1, 1, 1, 2, ...)."""
    if index.numel() == 0:
        return index.clone()
    change = torch.ones_like(index)
    change[1:] = (index[1:] != index[:-1]).long()
    change[0] = 0
    return torch.cumsum(change, 0)


def permute_within_segments(index: Tensor, generator: torch.Generator | None) -> Tensor:
    """A uniformly random permutation ``perm`` that maps each contiguous segment onto itself.

    ``x[perm]`` shuffles x within each segment; segments stay where they are.
    """
    runs = run_ids(index).to(torch.float64)
    keys = torch.rand(index.numel(), generator=generator, dtype=torch.float64, device=index.device)
    # run id + key in [0, 1): sorting keeps runs in order and shuffles inside each run.
    return torch.argsort(runs + keys)


# -- group standardisation -------------------------------------------------------------------

STANDARDIZE_RULES = ("min-std", "singleton", "no-contrast")
"""When a member's standardised value is set to 0 (:func:`segment_standardize`)."""


def segment_standardize(
    x: Tensor,
    index: Tensor,
    num_segments: int,
    rule: str,
    eps: float,
    ddof: int = 0,
    divide: bool = True,
    min_std: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """z_e = (x_e - mean_s x) / (std_s x + eps) within each segment s, or x_e - mean_s x with
    ``divide=False``; std_s = sqrt(sum_s (x - mean_s)^2 / (n_s - ddof)) (ddof 0: population,
    1: sample; the denominator is clamped to >= 1). Returns (z, live): z is 0 where ``live``
    is False, by the ``rule`` of the method that standardises:

    - ``min-std`` (A^seq of the group-standardize convention, :mod:`.advantage`): live iff
      std_s >= ``min_std``. A group whose members all scored alike teaches nothing, and its
      0 / eps would otherwise be 0 anyway; the threshold also zeroes float noise in std.
    - ``singleton`` (GiGPO's step term, :mod:`.gigpo`): live iff n_s > 1. An anchor group of
      one has nothing to be compared with; a group of equal returns gives 0 / (0 + eps) = 0
      without a rule.
    - ``no-contrast`` (HGPO's levels, :mod:`.hgpo`): live iff n_s > 1, the segment's values
      are not all equal, and |x_e - mean_s| > 8 float-eps x max_s |x|: a level counts for an
      action only where it says something about that action, and HGPO's adaptive weights
      renormalise over the levels that count, so a 0 must be told apart from a dropped level.
    """
    if rule not in STANDARDIZE_RULES:
        raise ValueError(f"rule must be one of {', '.join(STANDARDIZE_RULES)}, got {rule!r}")
    size = segment_count(index, num_segments)
    centred = x - segment_mean(x, index, num_segments)[index]
    dof = (size - ddof).clamp_min(1).to(x.dtype)
    std = (segment_sum(centred**2, index, num_segments) / dof).sqrt()[index]
    if rule == "min-std":
        live = std >= min_std
    elif rule == "singleton":
        live = size[index] > 1
    else:
        hi, lo = segment_max(x, index, num_segments), -segment_max(-x, index, num_segments)
        scale = torch.maximum(hi.abs(), lo.abs())[index]
        tiny = 8 * torch.finfo(x.dtype).eps
        live = (size[index] > 1) & (hi > lo)[index] & (centred.abs() > tiny * scale)
    z = centred / (std + eps) if divide else centred
    return torch.where(live, z, torch.zeros_like(z)), live
