"""Value-head features of root states, and Monte-Carlo targets from continuations.

The feature of state x_t (``value.features``, :data:`VALUE_FEATURES`) is, as in the paper, the
backbone's last hidden state at the last token of the prompt of action t (the boundary before
the action), or, a CPU-scale choice, the mean over the prompt's tokens of every layer's hidden
state; both computed without gradient. V_target(x_t) for every
root action feeds TAC; each continuation from checkpoint x_t contributes one (feature of x_t,
Monte-Carlo target) pair to the value head's replay buffer. Methods without a value head whose
values are Monte-Carlo means (VinePPO's) read the mean target at each state instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from factor_cli.credit import CONVENTIONS, monte_carlo_values
from factor_cli.policy.generation.scoring import Scorer
from factor_cli.registry import Registry

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


@torch.no_grad()
def prompt_mean_features(
    model: nn.Module, prompts: Sequence[Sequence[int]], pad_id: int = 0, batch_size: int = 16
) -> torch.Tensor:
    """h_t = [mean_s h^0_s ; mean_s h^1_s ; ... ; mean_s h^L_s] over the tokens s of x_t's
    prompt, h^l the hidden state after layer l (h^0 the embeddings), [N, (L + 1) H] (detached).

    ``model``: a causal LM or its backbone (hf's ``output_hidden_states``). Prompts are right
    padded, so each row's positions are those it has alone; pads are left out of the mean.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    feats = []
    try:
        for lo in range(0, len(prompts), batch_size):
            chunk = [list(p) for p in prompts[lo : lo + batch_size]]
            if any(not p for p in chunk):
                raise ValueError("every prompt needs at least one token")
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for r, p in enumerate(chunk):
                ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                        output_hidden_states=True, use_cache=False)  # fmt: skip
            m = mask.to(device)[:, :, None].float()
            means = [(h.float() * m).sum(1) / m.sum(1) for h in out.hidden_states]
            feats.append(torch.cat(means, dim=1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(feats) if feats else torch.zeros(0)


@dataclass(frozen=True)
class FeatureKind:
    """How ``value.features`` reads x_t: ``size(hidden, layers)`` is the width of one state's
    feature; ``compute(scorer, model, prompts, pad_id)`` the features [N, size]."""

    size: Callable[[int, int], int]
    compute: Callable[[Scorer, nn.Module, Sequence[Sequence[int]], int], torch.Tensor]


VALUE_FEATURES: Registry[FeatureKind] = Registry("value feature")
VALUE_FEATURES.add(
    "boundary",
    FeatureKind(
        size=lambda hidden, layers: hidden,
        compute=lambda score, model, prompts, pad_id: boundary_features(score, prompts),
    ),
)
VALUE_FEATURES.add(
    "prompt_mean",
    FeatureKind(
        size=lambda hidden, layers: (layers + 1) * hidden,
        compute=lambda score, model, prompts, pad_id: prompt_mean_features(model, prompts, pad_id),
    ),
)


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
