"""The value head's kinds (``value.head``) and how each is fitted on the replay buffer.

Every kind maps features h_t [N, H] to V(x_t) [N] and is fitted by a :class:`ValueFitter` on
the buffer's (features, Monte-Carlo target) pairs; the trainer keeps a Polyak target of the
head whatever its kind (its state is floating parameters and buffers).

- ``mlp`` (the paper's): :class:`~.value_head.ValueHead`, passes of Adam on the MSE.
- ``ridge``: V(x_t) = w . z_t + c on z-scored features z_t = (h_t - mu) / sigma, solved in
  closed form on the whole buffer (and stored folded onto h_t, so its Polyak target is the
  same average of predictions),

      (w, c) = argmin sum_n (w . z_n + c - G_n)^2 + lambda |w|^2,

  lambda chosen from :data:`RIDGE_PENALTIES` by 5-fold cross-validation on the buffer (folds by
  position, so a trajectory's states mostly share a fold). A linear probe: at CPU scale it
  ranks held-out states better than the MLP on the same features (docs/benchmarks.md, Value
  fitting).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from factor_cli.registry import Registry

from .value_head import ValueHead, ValueReplayBuffer, fit_value_head, make_value_optimizer

RIDGE_PENALTIES = (1e-1, 1.0, 10.0, 1e2, 1e3, 1e4)
RIDGE_FOLDS = 5
RIDGE_MAX_FEATURES = 16384
"""The widest feature a ridge head takes: its solve holds an H x H float64 matrix (2 GiB here)."""


@dataclass(frozen=True)
class HeadSettings:
    """The ``value.*`` fields a head kind reads."""

    hidden: int
    lr: float
    epochs: int
    batch_size: int
    standardize: bool


class ValueFitter(Protocol):
    """Fits one head on a replay buffer; its own state (an optimizer's) goes in checkpoints."""

    head: nn.Module

    def fit(
        self, buffer: ValueReplayBuffer, generator: torch.Generator, epochs: int | None = None
    ) -> float:
        """Fit the head on the whole buffer; returns its training MSE."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class MlpFitter:
    """Adam on the MSE, ``epochs`` shuffled passes (:func:`~.value_head.fit_value_head`)."""

    def __init__(self, head: ValueHead, settings: HeadSettings) -> None:
        self.head, self.settings = head, settings
        self.optimizer = make_value_optimizer(head, settings.lr)

    def fit(
        self, buffer: ValueReplayBuffer, generator: torch.Generator, epochs: int | None = None
    ) -> float:
        s = self.settings
        return fit_value_head(self.head, buffer, self.optimizer, epochs or s.epochs,
                              s.batch_size, generator)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


class RidgeHead(nn.Module):
    """V = w . (h - mu) / sigma + c, every number a float64 buffer (fitted in closed form, no
    gradient). :class:`RidgeFitter` folds the z-scoring into the weights (mu = 0, sigma = 1,
    w and c on the raw features), so V is linear in the buffers and the Polyak target of a
    ridge head predicts exactly tau V_target + (1 - tau) V_online: averaging z-scored weights
    and their scales apart would not (w / sigma is not linear in them)."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        if not 1 <= input_size <= RIDGE_MAX_FEATURES:
            raise ValueError(
                f"RidgeHead input_size must be in [1, {RIDGE_MAX_FEATURES}], got {input_size}"
            )
        self.input_size = input_size
        f64 = torch.float64  # folded weights are large where a feature barely varies
        self.register_buffer("shift", torch.zeros(input_size, dtype=f64))
        self.register_buffer("scale", torch.ones(input_size, dtype=f64))
        self.register_buffer("weight", torch.zeros(input_size, dtype=f64))
        self.register_buffer("bias", torch.zeros((), dtype=f64))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [N, H] -> values [N] float32."""
        if features.dim() != 2 or features.shape[1] != self.input_size:
            raise ValueError(
                f"RidgeHead expects features [N, {self.input_size}], got {tuple(features.shape)}"
            )
        z = (features.detach().to(torch.float64) - self.shift) / self.scale
        return (z @ self.weight + self.bias).to(torch.float32)


def _solve(z: torch.Tensor, y: torch.Tensor, penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, c) of the ridge problem on centred data (float64): c is the mean of y."""
    zc, yc = z - z.mean(0), y - y.mean()
    eye = torch.eye(z.shape[1], dtype=z.dtype)
    w = torch.linalg.solve(zc.T @ zc + penalty * eye, zc.T @ yc)
    return w, y.mean() - z.mean(0) @ w


def _cv_penalty(z: torch.Tensor, y: torch.Tensor) -> float:
    """The penalty of :data:`RIDGE_PENALTIES` with the least 5-fold held-out squared error."""
    fold = torch.arange(len(y)) % RIDGE_FOLDS
    if len(y) < 2 * RIDGE_FOLDS:
        return RIDGE_PENALTIES[len(RIDGE_PENALTIES) // 2]

    def error(penalty: float) -> float:
        total = 0.0
        for f in range(RIDGE_FOLDS):
            w, c = _solve(z[fold != f], y[fold != f], penalty)
            total += float(((z[fold == f] @ w + c - y[fold == f]) ** 2).sum())
        return total

    return min(RIDGE_PENALTIES, key=error)


class RidgeFitter:
    """The closed-form ridge fit of a :class:`RidgeHead` (module docstring); no optimizer state."""

    def __init__(self, head: RidgeHead, settings: HeadSettings) -> None:
        self.head = head

    @torch.no_grad()
    def fit(
        self, buffer: ValueReplayBuffer, generator: torch.Generator, epochs: int | None = None
    ) -> float:
        features, targets = buffer.tensors()
        if targets.numel() == 0:
            raise ValueError("the value replay buffer is empty; add Monte-Carlo targets first")
        h, y = features.double(), targets.double()
        shift = h.mean(0)
        scale = h.std(0).clamp_min(1e-6) if len(y) > 1 else torch.ones_like(shift)
        z = (h - shift) / scale
        w, c = _solve(z, y, _cv_penalty(z, y))
        head = self.head  # folded: w . (h - mu) / sigma + c == (w / sigma) . h + c'
        head.shift.zero_()
        head.scale.fill_(1.0)
        head.weight.copy_(w / scale)
        head.bias.copy_(c - shift @ (w / scale))
        return float(((head(features) - targets) ** 2).mean())

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


HeadKind = Callable[[int, HeadSettings], ValueFitter]
"""(feature size H, settings) -> the fitter, holding a new head as ``.head``."""
VALUE_HEADS: Registry[HeadKind] = Registry("value head")
VALUE_HEADS.add("mlp", lambda h, s: MlpFitter(ValueHead(h, s.hidden, s.standardize), s))
VALUE_HEADS.add("ridge", lambda h, s: RidgeFitter(RidgeHead(h), s))
