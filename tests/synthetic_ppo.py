"""PPO's inputs on the fixed synthetic batch (``synthetic.synthetic_batch``): a critic model
with a non-zero head, the batch carrying that critic's values, and the ppo credit. Shared by
the critic's update tests and the data-parallel worker; no environment needed."""

from __future__ import annotations

import dataclasses

import torch
from synthetic import synthetic_batch

from factor_cli.credit import CreditAssignment, assign_credit
from factor_cli.policy.model import Policy
from factor_cli.rollout.packing import RolloutBatch
from factor_cli.train.config import TrainConfig
from factor_cli.train.critic import Critic, build_critic, reply_values


def ppo_inputs(
    cfg: TrainConfig, policy: Policy, **batch: int
) -> tuple[Critic, RolloutBatch, CreditAssignment]:
    """(critic model, batch with ``token_values``, ppo credit at step 1); ``batch``: the
    ``synthetic_batch`` sizes. Call before the policy and the critic go into their engines."""
    critic = build_critic(cfg, policy)
    # The built head is zero (V = 0, and no gradient reaches the backbone): give it weights.
    torch.nn.init.normal_(critic.head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
    rb = synthetic_batch(policy.model, **batch)
    values = [
        v[torch.tensor(m)]
        for v, m in zip(reply_values(critic, rb.prompts, rb.replies, 0), rb.action_masks)
    ]
    rb.batch = dataclasses.replace(
        rb.batch, token_values=torch.cat(values).to(rb.batch.logp_old)
    ).validate()
    credit = assign_credit(rb.batch, "ppo", 1, cfg.credit, cfg.reduction)
    return critic, rb, credit
