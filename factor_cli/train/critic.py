"""PPO's learned critic (methods with ``critic=True``; ``credit.ppo`` holds the math).

The critic is a transformer backbone with a linear value head, trained by its own Adam beside
the policy, as verl's critic worker is. Its backbone is either a copy of the policy's (the
default: the same weights the policy starts from, ``model.critic_path`` unset) or a separate
model loaded from ``model.critic_path``, which must share the policy's tokenizer (it reads the
policy's token ids).

V before each reply token: the value head on the backbone's last hidden state at the position
preceding the token, so the first reply token's value is the one at the last prompt token,
the action's boundary x_t (``credit.ppo``'s token chain).

Data parallel: every rank computes the loss on its share of a mini-batch, normalised by the
mini-batch's global count; :meth:`Critic.step` sums the gradients over ranks, then clips and
steps. The critic runs in plain torch on the policy's device (not ZeRO-partitioned).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from factor_cli.policy.model import Policy, load_policy

from .config import ConfigError, TrainConfig


class Critic(nn.Module):
    """backbone (a ``base_model``: hidden states, no LM head) + Linear(H, 1) value head."""

    def __init__(self, backbone: nn.Module, hidden: int, lr: float, grad_clip: float) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, 1)
        # A zero head: V = 0 at the start, so the first advantages are the Monte-Carlo returns.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.head.to(next(backbone.parameters()).device)
        self.grad_clip = grad_clip
        self.optimizer = torch.optim.Adam(self.parameters(), lr=lr)

    def reply_values(
        self,
        prompts: Sequence[Sequence[int]],
        replies: Sequence[Sequence[int]],
        pad_id: int,
        with_grad: bool = False,
    ) -> list[torch.Tensor]:
        """Per reply, V before each of its tokens, [len(reply)] float32 (one padded forward)."""
        seqs = [list(p) + list(r) for p, r in zip(prompts, replies)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        device = self.head.weight.device
        with torch.enable_grad() if with_grad else torch.no_grad():
            out = self.backbone(input_ids=ids.to(device), attention_mask=mask.to(device))
            values = self.head(out.last_hidden_state.float()).squeeze(-1)  # [B, W]
            # The value at position p - 1 is V before token p: reply token j sits at len(p) + j.
            return [
                values[i, len(p) - 1 : len(p) - 1 + len(r)]
                for i, (p, r) in enumerate(zip(prompts, replies))
            ]

    def step(self) -> float:
        """Sum gradients over ranks, clip, Adam step, zero; returns the pre-clip grad norm."""
        params = [p for p in self.parameters() if p.grad is not None]
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for p in params:
                dist.all_reduce(p.grad)
        norm = float(nn.utils.clip_grad_norm_(params, self.grad_clip)) if params else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def full_state(self) -> dict[str, Any]:
        return {"model": self.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_full_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def build_critic(cfg: TrainConfig, policy: Policy) -> Critic:
    """The critic of a critic method: a copy of the policy's backbone, or ``model.critic_path``.

    Call before the policy is handed to the engine (a copy of whole, unpartitioned weights).
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
        return Critic(backbone, hidden, cfg.critic.lr, cfg.critic.grad_clip).train()
