"""Value head for TAC (docs/design.md section 5.1): V(x_t) from the backbone's features.

Features: h_t = the backbone's last-layer hidden state at the last token of x_t (the boundary
before action t), shape [N, H]. The head never trains the backbone: features enter detached.

    V_phi(x_t)  = w_2 . GELU(W_1 h_t + b_1) + b_2           (hidden size D = 1024 at paper scale)
    loss(phi)   = (1/N) sum_n (V_phi(x_n) - G_n)^2           (MSE on Monte-Carlo targets G_n)
    phi_target <- tau * phi_target + (1 - tau) * phi,  tau = 0.995, after every update step

Credit uses the target head. Targets G_n are continuation outcomes on the same scale as
r_{T-1}; the replay buffer pools those of the current and previous 9 training steps. Features
are stored as computed at collection time (under the weights of that step), not recomputed
under later weights (measured at CPU scale: a buffer of mixed steps costs the prompt-reading
head nothing against recomputed features; docs/benchmarks.md, Value fitting). Defaults come
from :mod:`.value_defaults`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .value_defaults import (
    VALUE_BATCH_SIZE,
    VALUE_EPOCHS,
    VALUE_HIDDEN,
    VALUE_LR,
    VALUE_REPLAY_STEPS,
    VALUE_TAU,
)


class ValueHead(nn.Module):
    """2-layer MLP with GELU: [N, H] features -> [N] values (module docstring for V_phi).

    Parameters are float32 whatever the backbone's dtype; features are detached and cast.
    With ``standardize`` the features enter as z_t = (h_t - mu) / sigma, mu and sigma [H] the
    per-dimension mean and standard deviation of the replay buffer's features, refreshed by
    every :func:`fit_value_head` (buffers, so the target head's Polyak average carries them).
    A small backbone's boundary states differ from state to state by a few hundredths in each
    dimension around offsets of order 1, which an MLP on raw features barely resolves.
    """

    def __init__(
        self, input_size: int, hidden_size: int = VALUE_HIDDEN, standardize: bool = False
    ) -> None:
        super().__init__()
        if input_size < 1 or hidden_size < 1:
            raise ValueError(
                f"ValueHead sizes must be >= 1, got input_size={input_size}, "
                f"hidden_size={hidden_size}"
            )
        self.input_size, self.hidden_size = input_size, hidden_size
        self.standardize = standardize
        if standardize:  # identity until the first fit sets them
            self.register_buffer("shift", torch.zeros(input_size))
            self.register_buffer("scale", torch.ones(input_size))
        self.net = nn.Sequential(
            nn.Linear(input_size, hidden_size), nn.GELU(), nn.Linear(hidden_size, 1)
        )

    @torch.no_grad()
    def set_statistics(self, features: torch.Tensor) -> None:
        """mu, sigma <- the per-dimension mean and standard deviation of ``features`` [N, H]
        (sigma floored at 1e-6); a no-op without ``standardize``."""
        if self.standardize and features.shape[0] > 1:
            f = features.to(self.shift.device, torch.float32)
            self.shift.copy_(f.mean(0))
            self.scale.copy_(f.std(0).clamp_min(1e-6))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, H] (any float dtype) -> values [N] float32; no gradient reaches the
        producer of ``features``."""
        if features.dim() != 2 or features.shape[1] != self.input_size:
            raise ValueError(
                f"ValueHead expects features [N, {self.input_size}], got {tuple(features.shape)}"
            )
        x = features.detach().to(torch.float32)
        if self.standardize:
            x = (x - self.shift) / self.scale
        return self.net(x).squeeze(-1)  # [N, 1] -> [N]


def features_at(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """h_t of each row: ``hidden[b, positions[b]]``, detached.

    hidden [B, S, H] (the backbone's last layer), positions [B] (each row's boundary column:
    the last token of x_t) -> [B, H]. The padded scoring forward and hf's cached one gather
    their boundary states through it (the prefix tree's forward returns each state by key).
    """
    if hidden.dim() != 3 or positions.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be [B, S, H] and positions [B]; got {tuple(hidden.shape)} and "
            f"{tuple(positions.shape)}"
        )
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, positions.to(hidden.device)].detach()


def last_token_features(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """h_t: the hidden state at each row's last real token, detached.

    hidden [B, S, H] (the backbone's last layer), attention_mask [B, S] (1 = token, 0 = pad;
    left or right padding) -> [B, H]. A row without tokens raises ValueError.
    """
    if hidden.dim() != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be [B, S, H] and attention_mask [B, S]; got {tuple(hidden.shape)} and "
            f"{tuple(attention_mask.shape)}"
        )
    mask = attention_mask.bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError("every row needs at least one attended token")
    seq = hidden.shape[1]
    positions = torch.arange(seq, device=hidden.device).expand_as(mask)  # [B, S]
    return features_at(hidden, torch.where(mask, positions, -1).amax(dim=1))  # last 1 per row


def make_target_head(head: ValueHead) -> ValueHead:
    """A frozen copy of ``head`` (phi_target = phi at creation; no gradients)."""
    target = copy.deepcopy(head)
    target.requires_grad_(False)
    return target.eval()


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float = VALUE_TAU) -> None:
    """In place, for every parameter and floating buffer: p_target <- tau p_target + (1-tau) p.

    Called once per training step, after the online head's update.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau}")
    t_state, o_state = target.state_dict(), online.state_dict()
    if t_state.keys() != o_state.keys():
        raise ValueError("target and online heads have different parameter sets")
    for name, t in t_state.items():
        o = o_state[name]
        if t.shape != o.shape:
            raise ValueError(f"{name}: target {tuple(t.shape)} vs online {tuple(o.shape)}")
        if t.is_floating_point():
            t.mul_(tau).add_(o, alpha=1.0 - tau)
        else:
            t.copy_(o)


class TargetValueHead:
    """The online head, its Polyak target, and the target's update (module docstring)."""

    def __init__(self, online: ValueHead, tau: float = VALUE_TAU) -> None:
        self.online, self.tau = online, tau
        self.target = make_target_head(online)

    def update(self) -> None:
        """phi_target <- tau phi_target + (1 - tau) phi."""
        polyak_update(self.target, self.online, self.tau)

    @torch.no_grad()
    def values(self, features: torch.Tensor) -> torch.Tensor:
        """V_target(x_t) for features [N, H] -> [N] (what credit uses)."""
        return self.target(features)

    def state_dict(self) -> dict[str, Any]:
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "tau": self.tau,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.tau = float(state["tau"])


class ValueReplayBuffer:
    """(features [N, H], targets [N]) per training step, for the last ``max_steps`` steps.

    Adding step k keeps the steps k - max_steps + 1 .. k (the current and previous 9 by
    default), by step number: a step without data still counts. Adding step k again appends to
    its data; adding a step older than the newest one is an error. Tensors are stored detached,
    float32, on the CPU, as computed at collection time.
    """

    def __init__(self, max_steps: int = VALUE_REPLAY_STEPS) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self._steps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(self, step: int, features: torch.Tensor, targets: torch.Tensor) -> None:
        """Store step ``step``'s features [N, H] and Monte-Carlo targets [N]."""
        if features.dim() != 2 or targets.dim() != 1 or features.shape[0] != targets.shape[0]:
            raise ValueError(
                f"expected features [N, H] and targets [N]; got {tuple(features.shape)} and "
                f"{tuple(targets.shape)}"
            )
        width = self.feature_size
        if width is not None and features.shape[1] != width:
            raise ValueError(f"features have H={features.shape[1]}, the buffer holds H={width}")
        newest = max(self._steps, default=None)
        if newest is not None and step < newest:
            raise ValueError(f"step {step} is older than the newest stored step {newest}")
        f = features.detach().to("cpu", torch.float32).clone()
        y = targets.detach().to("cpu", torch.float32).clone()
        if step in self._steps:
            f0, y0 = self._steps[step]
            f, y = torch.cat([f0, f]), torch.cat([y0, y])
        self._steps[step] = (f, y)
        for old in [s for s in self._steps if s <= step - self.max_steps]:
            del self._steps[old]

    @property
    def feature_size(self) -> int | None:
        """H of the stored features, None while empty."""
        for f, _ in self._steps.values():
            return int(f.shape[1])
        return None

    @property
    def steps(self) -> list[int]:
        """Stored step numbers, oldest first."""
        return sorted(self._steps)

    def __len__(self) -> int:
        """Number of stored (feature, target) pairs over all kept steps."""
        return sum(int(y.shape[0]) for _, y in self._steps.values())

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All pairs, oldest step first: features [N, H], targets [N] (N = len(self))."""
        if not self._steps:
            return torch.zeros(0, 0), torch.zeros(0)
        parts = [self._steps[s] for s in self.steps]
        return torch.cat([f for f, _ in parts]), torch.cat([y for _, y in parts])

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, ints and lists (``torch.load(weights_only=True)`` reads it)."""
        steps = self.steps
        return {
            "max_steps": self.max_steps,
            "steps": steps,
            "features": [self._steps[s][0] for s in steps],
            "targets": [self._steps[s][1] for s in steps],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents with a :meth:`state_dict`; ``max_steps`` comes from it too."""
        missing = {"max_steps", "steps", "features", "targets"} - set(state)
        if missing:
            raise ValueError(f"value buffer state lacks {', '.join(sorted(missing))}")
        max_steps = int(state["max_steps"])
        if max_steps < 1:
            raise ValueError(f"value buffer state has max_steps {max_steps}; must be >= 1")
        self.max_steps, self._steps = max_steps, {}
        for step, f, y in zip(state["steps"], state["features"], state["targets"]):
            self.add(int(step), f, y)


def make_value_optimizer(head: nn.Module, lr: float = VALUE_LR) -> torch.optim.Adam:
    """Adam over the head's parameters (lr 1e-4 at paper scale; other Adam defaults)."""
    return torch.optim.Adam(head.parameters(), lr=lr)


def _minibatches(
    n: int, batch_size: int, generator: torch.Generator | None
) -> Iterator[torch.Tensor]:
    order = torch.randperm(n, generator=generator)
    yield from order.split(batch_size)


def fit_value_head(
    head: ValueHead,
    buffer: ValueReplayBuffer,
    optimizer: torch.optim.Optimizer,
    epochs: int = VALUE_EPOCHS,
    batch_size: int = VALUE_BATCH_SIZE,
    generator: torch.Generator | None = None,
) -> float:
    """``epochs`` passes of shuffled mini-batch MSE regression of V_phi(x_n) on G_n over the
    whole buffer; no gradient clipping. Returns the mean loss over all samples of all passes,
    each batch's loss taken before its update step.

    ``generator`` draws the shuffles (None: torch's global generator). An empty buffer raises.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs ({epochs}) and batch_size ({batch_size}) must be >= 1")
    features, targets = buffer.tensors()
    n = int(targets.shape[0])
    if n == 0:
        raise ValueError("the value replay buffer is empty; add Monte-Carlo targets first")
    device = next(head.parameters()).device
    if isinstance(head, ValueHead):
        head.set_statistics(features)
    head.train()
    total = 0.0
    for _ in range(epochs):
        for idx in _minibatches(n, batch_size, generator):
            f, y = features[idx].to(device), targets[idx].to(device)  # [b, H], [b]
            loss = F.mse_loss(head(f), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * int(idx.shape[0])
    head.eval()
    return total / (n * epochs)
