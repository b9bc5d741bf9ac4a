"""Training-step schedules (k = training step, 1-based).

    eta_k   = 0                                   for k <= W (value-head warm-up)
            = eta_0 * max(1 - k / K_a, 0)         otherwise
    alpha_k = alpha_0 * max(1 - k / K_a, 0)       (SERL's multiplier; lambda_k = alpha_k)

with K_a = ``anneal_steps`` (50 in the paper), so the teacher is active for W < k < K_a.
"""

from __future__ import annotations

from .config import CreditConfig


def _step(k: int) -> int:
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"step must be an integer >= 1 (training steps are 1-based), got {k!r}")
    return k


def linear_anneal(k: int, start: float, horizon: int) -> float:
    """start * max(1 - k / horizon, 0)."""
    return start * max(1.0 - _step(k) / horizon, 0.0)


def in_warmup(k: int, cfg: CreditConfig) -> bool:
    """True while the value head is warming up (k <= W): TD credit is not trusted yet."""
    return _step(k) <= cfg.warmup_steps


def eta_schedule(k: int, cfg: CreditConfig) -> float:
    """eta_k: APM teacher concentration at step k (0 during warm-up)."""
    return 0.0 if in_warmup(k, cfg) else linear_anneal(k, cfg.eta_0, cfg.anneal_steps)


def alpha_schedule(k: int, cfg: CreditConfig) -> float:
    """alpha_k: SERL multiplier strength at step k (the KL weight too, unless ``kl_0`` is set)."""
    return linear_anneal(k, cfg.alpha_0, cfg.anneal_steps)


def kl_schedule(k: int, cfg: CreditConfig) -> float:
    """lambda_k: SERL's action-KL weight, kl_0 max(1 - k/anneal_steps, 0); alpha_k by default.

    The paper's text ties it to SERL's mixing schedule (lambda_k = alpha_k = 0.5 max(1 - k/50, 0)
    at the defaults); the authors' public code uses max(1 - k/50, 0), i.e. ``kl_0 = 1.0``.
    """
    start = cfg.alpha_0 if cfg.kl_0 is None else cfg.kl_0
    return linear_anneal(k, start, cfg.anneal_steps)
