"""PPO's learned critic (methods with ``critic=True``; ``credit.ppo`` holds the math).

The critic is a transformer backbone with a linear value head, trained beside the policy as
verl's critic worker is. Its backbone is either a copy of the policy's (the default: the same
weights the policy starts from, ``model.critic_path`` unset) or a separate model loaded from
``model.critic_path``, which must share the policy's tokenizer (it reads the policy's token ids).

V before each reply token: the value head on the backbone's last hidden state at the position
preceding the token, so the first reply token's value is the one at the last prompt token,
the action's boundary x_t (``credit.ppo``'s token chain).

Training: :class:`CriticEngine` is a second DeepSpeed engine built by the policy's own code
(:class:`~factor_cli.train.engine.Engine`): the same ZeRO stage (ZeRO-3 partitions the critic
too), precision and optimizer offload from ``engine.*``, its own Adam with ``critic.lr`` and
gradient clip ``critic.grad_clip``, its own folder (``critic``) in every checkpoint. Forwards
that backpropagate go through the engine, as the policy's do (ZeRO-3 counts micro-batches
there). Data parallel: every rank's loss is normalised by the mini-batch's global count, and
the engine reduces the gradients over ranks exactly as it does the policy's (their sum).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from factor_cli.policy.generation.scoring import right_padded
from factor_cli.policy.model import Policy, load_policy

from .config import ConfigError, TrainConfig
from .engine import Engine

CRITIC_TAG = "critic"
"""The critic engine's folder inside a training checkpoint (the policy's is ``engine``)."""


class Critic(nn.Module):
    """backbone (a ``base_model``: hidden states, no LM head) + Linear(H, 1) value head."""

    def __init__(self, backbone: nn.Module, hidden: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, 1)
        # A zero head: V = 0 at the start, so the first advantages are the Monte-Carlo returns.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        first = next(backbone.parameters())
        self.head.to(device=first.device, dtype=first.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """V at every position, [B, W] float32 (the head reads the last hidden state)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
        return self.head(hidden.last_hidden_state).squeeze(-1).float()


def reply_values(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    pad_id: int,
    with_grad: bool = False,
) -> list[torch.Tensor]:
    """Per reply, V before each of its tokens, [len(reply)] float32 (one padded forward).

    ``model``: a :class:`Critic`, or the DeepSpeed engine around one (for a forward whose
    loss is backpropagated through the engine).
    """
    ids, mask = right_padded(prompts, replies, pad_id)
    device = next(model.parameters()).device
    with torch.enable_grad() if with_grad else torch.no_grad():
        values = model(input_ids=ids.to(device), attention_mask=mask.to(device))  # [B, W]
        # The value at position p - 1 is V before token p: reply token j sits at len(p) + j.
        return [
            values[i, len(p) - 1 : len(p) - 1 + len(r)]
            for i, (p, r) in enumerate(zip(prompts, replies))
        ]


class CriticEngine(Engine):
    """The critic in a DeepSpeed engine of its own (module docstring): ``backward``, ``step``,
    ``save`` and ``load`` are the policy engine's; this adds the critic's value reads."""

    def __init__(self, critic: Critic, cfg: TrainConfig) -> None:
        super().__init__(
            critic, cfg, lr=cfg.critic.lr, grad_clip=cfg.critic.grad_clip, tag=CRITIC_TAG
        )

    def values(
        self, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], pad_id: int
    ) -> list[torch.Tensor]:
        """V before every reply token, no gradient (the values GAE and value clipping use)."""
        return reply_values(self.module, prompts, replies, pad_id)

    def train_values(
        self, prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], pad_id: int
    ) -> list[torch.Tensor]:
        """V before every reply token with gradient, through the engine's forward."""
        return reply_values(self.wrapped_module, prompts, replies, pad_id, with_grad=True)


def build_critic(cfg: TrainConfig, policy: Policy) -> Critic:
    """The critic model of a critic method: a copy of the policy's backbone, or
    ``model.critic_path``'s, with a zero value head (built under a forked RNG seeded by
    ``seed + 2``, so building it leaves the global random stream as it was).

    Call before the policy is handed to its engine (a copy of whole, unpartitioned weights);
    :class:`CriticEngine` then trains it.
    """
    if cfg.model.critic_path is None:
        backbone = copy.deepcopy(policy.model.base_model)
    else:
        other = load_policy(cfg.model.critic_path, cfg.model.dtype, cfg.model.device)
        if other.tokenizer.get_vocab() != policy.tokenizer.get_vocab():
            raise ConfigError(
                f"model.critic_path = {cfg.model.critic_path!r}: its tokenizer differs from the "
                "policy's; the critic reads the policy's token ids, so use a model with the same "
                "tokenizer (or leave model.critic_path unset to copy the policy)"
            )
        backbone = other.model.base_model
    hidden = int(backbone.config.hidden_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 2)
        return Critic(backbone, hidden).train()
