"""Value-head features of root states, and Monte-Carlo targets from continuations.

The feature of state x_t is the backbone's last hidden state at the last token of the prompt
of action t (the boundary before the action), computed without gradient. V_target(x_t) for every
root action feeds TAC; each continuation from checkpoint x_t contributes one (feature of x_t,
Monte-Carlo target) pair to the value head's replay buffer. Methods without a value head whose
values are Monte-Carlo means (VinePPO's) read the mean target at each state instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from factor_cli.credit import CONVENTIONS, monte_carlo_values
from factor_cli.policy.generation.scoring import Scorer

from .continuations import ContinuationResult, outcome_of
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


def continuation_rows(
    episodes: Sequence[Episode], result: ContinuationResult
) -> tuple[list[int], list[float]]:
    """(packed row of its checkpoint's state, Monte-Carlo target) of every continuation that
    ran (one whose start failed has no outcome and is left out); a root action's row is its
    index in packing order, so row r is the state x_t before action r."""
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
    return rows, targets


def value_training_pairs(
    root_features: torch.Tensor, episodes: Sequence[Episode], result: ContinuationResult
) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [N_c, H], targets [N_c]) of every continuation that ran.

    ``root_features``: :func:`boundary_features` of every root turn's prompt, in packing order.
    """
    rows, targets = continuation_rows(episodes, result)
    idx = torch.tensor(rows, dtype=torch.long)
    return root_features.index_select(0, idx), torch.tensor(targets, dtype=torch.float32)


def monte_carlo_state_values(
    episodes: Sequence[Episode], result: ContinuationResult, convention: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(V-hat(x_t) [N_act], K_t [N_act]) of every root action in packing order: the mean
    Monte-Carlo target of the continuations from each state, V~(x_0) of the ``convention`` at a
    trajectory's first action (``credit.monte_carlo_values``, VinePPO's values on FACTOR's
    boundary conventions)."""
    rows, targets = continuation_rows(episodes, result)
    groups = {g: i for i, g in enumerate(sorted({ep.start.group for ep in episodes}))}
    outcome = torch.tensor([outcome_of(ep) for ep in episodes], dtype=torch.float64)
    v0 = CONVENTIONS.get(convention)(
        outcome, torch.tensor([groups[ep.start.group] for ep in episodes])
    ).v0
    traj_index = torch.repeat_interleave(
        torch.arange(len(episodes)), torch.tensor([len(ep.turns) for ep in episodes])
    )
    return monte_carlo_values(
        torch.tensor(targets, dtype=torch.float64),
        torch.tensor(rows, dtype=torch.long),
        traj_index,
        v0,
    )
