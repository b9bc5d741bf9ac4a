"""Value-head features of root states, and Monte-Carlo targets from continuations.

The feature of state x_t is the backbone's last hidden state at the last token of the prompt
of action t (the boundary before the action), computed without gradient. V_target(x_t) for every
root action feeds TAC; each continuation from checkpoint x_t contributes one (feature of x_t,
Monte-Carlo target) pair to the value head's replay buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from factor_cli.policy.generation.scoring import Scorer

from .continuations import ContinuationResult
from .runner import Episode


def boundary_features(
    score: Scorer, prompts: Sequence[Sequence[int]], batch_size: int = 64
) -> torch.Tensor:
    """Last-layer hidden state at the last prompt token of each prompt, [N, H] (detached);
    ``score``: the scoring pass (a model's, or the backend's cached one)."""
    feats = []
    for lo in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[lo : lo + batch_size]]
        # An empty reply scores nothing; only the boundary hidden state is wanted.
        sc = score(chunk, [[] for _ in chunk], return_hidden=True)
        feats.append(sc.boundary_hidden.float().cpu())  # type: ignore[union-attr]
    return torch.cat(feats) if feats else torch.zeros(0)


def value_training_pairs(
    root_features: torch.Tensor, episodes: Sequence[Episode], result: ContinuationResult
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N_c, H], targets [N_c]) of every continuation that ran.

    ``root_features``: :func:`boundary_features` of every root turn's prompt, in packing order.
    """
    offsets, k = [], 0
    for ep in episodes:
        offsets.append(k)
        k += len(ep.turns)
    rows, targets = [], []
    for c, cont, target in zip(result.checkpoint_of, result.episodes, result.targets):
        if cont.start_failed:
            continue
        cp = result.checkpoints[c]
        rows.append(offsets[cp.episode] + cp.turn)
        targets.append(target)
    idx = torch.tensor(rows, dtype=torch.long)
    return root_features.index_select(0, idx), torch.tensor(targets, dtype=torch.float32)
