"""Anchor states and their history contexts: the one definition GiGPO and HGPO share.

An anchor state is the observation before an action (``state_key[N_act]``, from
:func:`anchor_state_keys`; every packer calls it, so a recorded group and a training batch key
states the same way). HGPO's k-step context operator extends it backwards in time:

    C_k(s_t) = (s_{t-k}, ..., s_{t-1}, s_t)        k = 0, 1, ..., H

and the level-k group of an action is every action of the same task group g whose C_k is the
same tuple. C_0 is the anchor state alone, so level 0 is exactly GiGPO's anchor group; groups
nest, G_0 ⊇ G_1 ⊇ ... ⊇ G_H, because equal C_k implies equal C_{k-1}. An action with fewer than
k earlier turns (t < k) has no C_k and belongs to no level-k group (id -1). As in the public
HGPO code, the context is the sequence of observations only (the actions between them are not
part of the key).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .segments import Ragged

NO_GROUP = -1
"""Context-group id of an action that has no C_k (t < k)."""


def anchor_state_keys(observations: Sequence[str | None]) -> Tensor:
    """state_key[N_act]: one integer id per action for the observation before it.

    Two actions get the same id iff their observations are the same text once whitespace is
    normalised (runs of spaces, tabs and newlines count as one space; leading and trailing
    whitespace is ignored), so a re-wrapped or re-indented page is still the same state. An
    unknown observation (None, e.g. a recording without it) gets an id of its own: it is never
    an anchor state of another action. Ids are dense, in order of first appearance.
    """
    table: dict[str | tuple[int], int] = {}
    keys = []
    for i, text in enumerate(observations):
        # An unknown observation is keyed by its position, a tuple no text can equal.
        key = " ".join(text.split()) if text is not None else (i,)
        keys.append(table.setdefault(key, len(table)))
    return torch.tensor(keys, dtype=torch.long)


def _dense_pairs(a: Tensor, b: Tensor) -> Tensor:
    """Dense id of each (a, b) pair, in sorted pair order, [N]."""
    if a.numel() == 0:
        return a.clone()
    _, inverse = torch.unique(torch.stack([a, b], dim=1), dim=0, return_inverse=True)
    return inverse


def context_groups(
    group_of_action: Tensor, state_key: Tensor, traj_index: Tensor, num_traj: int, depth: int
) -> Tensor:
    """Dense ids of every action's level-k context group, k = 0..depth, shape [depth + 1, N_act].

    Row k holds the id of the group {actions a' of the same task group with C_k(a') = C_k(a)}
    (ids dense within the row, 0..n_k - 1), or ``NO_GROUP`` (-1) where t < k. Built recursively
    without loops over actions: C_k at t is the pair (C_{k-1} at t - 1, s_t), so

        id_0[t] = dense(g, s_t),    id_k[t] = dense(id_{k-1}[t-1], id_0[t])  for t >= k.

    Args:
        group_of_action: task group g of each action's trajectory, [N_act].
        state_key: anchor-state id before each action, [N_act].
        traj_index: trajectory of each action, [N_act], contiguous in turn order.
        num_traj: N_traj.
        depth: H >= 0, the deepest level.
    """
    n = state_key.numel()
    out = torch.full((depth + 1, n), NO_GROUP, dtype=torch.long, device=state_key.device)
    out[0] = _dense_pairs(group_of_action.long(), state_key.long())
    turn = Ragged.of(traj_index.long(), num_traj).position
    for k in range(1, depth + 1):  # a loop over levels (H is small), never over actions
        has = turn >= k
        idx = has.nonzero().squeeze(1)
        out[k, idx] = _dense_pairs(out[k - 1, idx - 1], out[0, idx])
    return out
