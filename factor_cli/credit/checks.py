"""Argument validation for the credit core.

Every check raises ``ValueError`` naming the offending argument, so a bad packed batch fails at
the boundary with a message a researcher can act on instead of deep inside a scatter kernel.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def vector(name: str, x: Tensor, *, floating: bool = True) -> Tensor:
    """A 1-D tensor with finite floating values (or integer values when ``floating`` is False)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(x.shape)}")
    if floating:
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {x.dtype}")
        # One reduction is far cheaper than an elementwise mask; the sum is finite whenever every
        # entry is, except on overflow of huge finite values, where the exact check decides.
        if not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
    return x


def index(name: str, idx: Tensor, size: int, *, length: int | None = None) -> Tensor:
    """A 1-D integer index tensor with values in ``[0, size)``; returned as int64."""
    if not isinstance(idx, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(idx).__name__}")
    if idx.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(idx.shape)}")
    if idx.is_floating_point() or idx.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {idx.dtype}")
    if length is not None and idx.numel() != length:
        raise ValueError(f"{name} has length {idx.numel()}, expected {length}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
        raise ValueError(
            f"{name} values must lie in [0, {size}), got [{int(idx.min())}, {int(idx.max())}]"
        )
    return idx.long()


def same_length(name: str, x: Tensor, expected: int, what: str) -> None:
    if x.numel() != expected:
        raise ValueError(f"{name} has length {x.numel()}, expected {expected} (one per {what})")


def non_empty(name: str, x: Tensor) -> None:
    if x.numel() == 0:
        raise ValueError(f"{name} is empty: the batch has no {name.split('[')[0]} entries")


def unit_interval(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return float(value)


def positive(name: str, value: float, *, allow_inf: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not math.isnan(value) and value > 0
    if ok and math.isinf(value) and not allow_inf:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be > 0{'' if allow_inf else ' and finite'}, got {value!r}")
    return float(value)


def every_segment_present(name: str, counts: Tensor, what: str) -> None:
    """Each of the ``counts.numel()`` segments must own at least one element."""
    if not bool((counts == 0).any()):
        return
    empty = (counts == 0).nonzero().flatten()
    if empty.numel():
        raise ValueError(
            f"{name} leaves {what} {int(empty[0])} without any entry "
            f"({empty.numel()} {what}(s) empty); every {what} needs at least one"
        )


def contiguous(name: str, idx: Tensor, num_segments: int) -> None:
    """Each segment's entries form one contiguous run (e.g. a trajectory's actions, in order)."""
    if idx.numel() == 0:
        return
    runs = 1 + int((idx[1:] != idx[:-1]).sum())
    if runs != num_segments:
        raise ValueError(
            f"{name} is not contiguous: {runs} runs for {num_segments} segments; "
            "pack each trajectory's actions (and each action's tokens) next to each other"
        )


def tokens(gap: Tensor, action_index: Tensor, credit: Tensor) -> tuple[Tensor, Tensor]:
    """Check a token-level tensor gap[N_tok] against its actions (action_index[N_tok] into
    credit[N_act], every action owning a token); returns (action_index as int64, L[N_act])."""
    vector("gap", gap)
    non_empty("gap", gap)
    vector("credit", credit)
    non_empty("credit", credit)
    action_index = index("action_index", action_index, credit.numel(), length=gap.numel())
    length = torch.bincount(action_index, minlength=credit.numel())
    every_segment_present("action_index", length, "action")
    return action_index, length
