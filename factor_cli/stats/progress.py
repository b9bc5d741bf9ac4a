"""One run's progress at a glance: train return and eval success against the training step.

Drawn like :mod:`factor_cli.stats.plots` (matplotlib's object API on the Agg canvas, no pyplot),
so it works without a display and leaves a caller's backend alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .plots import _figure, _save


def run_progress(
    train_steps: Sequence[int],
    train_return: Sequence[float],
    eval_steps: Sequence[int],
    eval_success: Sequence[float],
    path: str | Path,
    title: str = "",
    train_success: Sequence[float] | None = None,
) -> Path:
    """PNG of the mean return of each step's rollouts and the macro success of each evaluation.

    Args:
        train_steps, train_return: step k (1-based) and mean G_i over the step's root episodes,
            shape [K] each.
        eval_steps, eval_success: the steps trained before each evaluation (0: the starting
            policy) and its macro success, shape [E] each (E may be 0).
        train_success: optional success rate of each step's rollouts, shape [K].
    """
    if len(train_steps) != len(train_return) or len(eval_steps) != len(eval_success):
        raise ValueError("each curve needs as many steps as values")
    fig, ax = _figure()
    if len(train_steps):
        ax.plot(train_steps, train_return, color="tab:blue", label="train return (mean G)")
    if train_success is not None and len(train_steps):
        ax.plot(
            train_steps, train_success, color="tab:blue", alpha=0.45, linestyle="--",
            label="train success rate",
        )  # fmt: skip
    if len(eval_steps):
        ax.plot(
            eval_steps, eval_success, color="tab:orange", marker="o", label="eval macro success"
        )
        for x, y in zip(eval_steps, eval_success, strict=True):
            ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize="small")  # fmt: skip
    steps = np.concatenate([np.asarray(train_steps, float), np.asarray(eval_steps, float)])
    if steps.size:
        ax.set_xlim(min(0.0, steps.min()) - 0.2, steps.max() + 0.2)
    values = np.concatenate([np.asarray(train_return, float), np.asarray(eval_success, float)])
    values = values[np.isfinite(values)]
    if values.size and values.min() >= 0.0 and values.max() <= 1.0:  # fractions: the whole range
        ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("training step (0: the starting policy)")
    ax.set_ylabel("return / success")
    ax.set_title(title or "train return and eval success by step")
    ax.grid(alpha=0.3)
    if len(train_steps) or len(eval_steps):
        ax.legend(fontsize="small")
    return _save(fig, path)
