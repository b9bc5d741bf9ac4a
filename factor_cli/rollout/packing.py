"""Episodes -> the credit core's packed batch (docs/design.md section 3), plus what the trainer
needs.

Each root episode is a trajectory; each turn an action; the reply tokens inside the executable
action span are the action's tokens (their behaviour log-probs are ``logp_old``). A reply whose
action span holds no token (an empty action) keeps all its reply tokens as action tokens, so
every action has at least one token and the credit still reaches the loss. The other reply
tokens (reasoning, tags, formatting) form the non-action branch.

Under valid-action decoding each action also carries the token ids that were allowed at each
reply position (``allowed_ids``), so the update re-scores pi_theta under the constraint its
``logp_old`` was sampled under (``policy.generation.constrained``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from factor_cli.credit import PackedBatch, anchor_state_keys

from .runner import Episode


@dataclass
class RolloutBatch:
    batch: PackedBatch
    prompts: list[list[int]]
    """Prompt (x_t) token ids of each action, [N_act] lists."""
    replies: list[list[int]]
    """Reply token ids of each action."""
    action_masks: list[list[bool]]
    """Per action, which reply tokens are action tokens (the packed tokens, in order)."""
    na_logp_old: torch.Tensor
    """Behaviour log-probs of the non-action reply tokens, [N_na]."""
    na_traj_index: torch.Tensor
    """Trajectory of each non-action token, [N_na]."""
    feedback: list[str]
    """Phi_t of each action."""
    turn_of_action: list[tuple[int, int]]
    """(episode index, turn) of each action."""
    allowed_ids: list[list[list[int]] | None] | None = None
    """Per action, the allowed token ids of each reply position under valid-action decoding
    (None for a freely decoded reply); None when no reply of the batch was constrained."""


def effective_mask(mask: Sequence[bool]) -> list[bool]:
    return list(mask) if any(mask) else [True] * len(mask)


def pack_episodes(
    episodes: Sequence[Episode],
    convention: str,
    values: torch.Tensor | None = None,
    logp_teacher: Sequence[Sequence[float]] | None = None,
    dtype: torch.dtype = torch.float32,
) -> RolloutBatch:
    """Pack root episodes (every one must have at least one turn).

    Args:
        values: V_target(x_t) per action, [N_act], in packing order (optional).
        logp_teacher: per action, the teacher log-prob of every reply token (optional); the
            action tokens' entries become ``logp_teacher``.
    """
    action_index, logp_old, teacher, traj_index = [], [], [], []
    na_logp, na_traj = [], []
    prompts, replies, masks, feedback, where = [], [], [], [], []
    observations, allowed = [], []
    groups = {g: i for i, g in enumerate(sorted({ep.start.group for ep in episodes}))}
    a = 0
    for e, ep in enumerate(episodes):
        if not ep.turns:
            raise ValueError(
                f"episode {e} ({ep.start.instance_id}) has no turns: {ep.error or 'empty'}"
            )
        for t, turn in enumerate(ep.turns):
            mask = effective_mask(turn.action_mask)
            lp_t = logp_teacher[a] if logp_teacher is not None else None
            for j, (tok_lp, is_act) in enumerate(zip(turn.logprobs, mask)):
                if is_act:
                    action_index.append(a)
                    logp_old.append(tok_lp)
                    if lp_t is not None:
                        teacher.append(lp_t[j])
                else:
                    na_logp.append(tok_lp)
                    na_traj.append(e)
            traj_index.append(e)
            observations.append(turn.observation)
            prompts.append(turn.prompt_ids)
            replies.append(turn.reply_ids)
            allowed.append(turn.allowed_ids)
            masks.append(mask)
            feedback.append(turn.feedback)
            where.append((e, t))
            a += 1
    batch = PackedBatch(
        action_index=torch.tensor(action_index),
        logp_old=torch.tensor(logp_old, dtype=dtype),
        traj_index=torch.tensor(traj_index),
        group_index=torch.tensor([groups[ep.start.group] for ep in episodes]),
        outcome=torch.tensor(
            [ep.outcome.outcome if ep.outcome else 0.0 for ep in episodes], dtype=dtype
        ),
        convention=convention,
        logp_teacher=torch.tensor(teacher, dtype=dtype) if logp_teacher is not None else None,
        values=values.to(dtype) if values is not None else None,
        state_key=anchor_state_keys(observations),
    )
    return RolloutBatch(
        batch=batch.validate(),
        prompts=prompts,
        replies=replies,
        action_masks=masks,
        na_logp_old=torch.tensor(na_logp, dtype=dtype),
        na_traj_index=torch.tensor(na_traj, dtype=torch.long),
        feedback=feedback,
        turn_of_action=where,
        allowed_ids=allowed if any(a is not None for a in allowed) else None,
    )
