"""The metrics one training step logs, built from what its phases returned."""

from __future__ import annotations

import numpy as np

from factor_cli.credit import (
    CreditAssignment,
    coefficient_deviation,
    group_signal,
    zero_credit_share,
)
from factor_cli.rollout.continuations import ContinuationResult
from factor_cli.rollout.packing import RolloutBatch

from .step import Rollout, ValueFit, nonfinite_dropped
from .update import UpdateStats


def rollout_metrics(rollout: Rollout) -> dict[str, float]:
    """Returns, success, length and validity of the usable roots."""
    roots = rollout.roots
    outcomes = [e.outcome.outcome for e in roots if e.outcome]
    return {
        "return_mean": float(np.mean(outcomes)) if outcomes else 0.0,
        "success_rate": float(np.mean([e.outcome.success for e in roots if e.outcome])),
        "turns_mean": float(np.mean([len(e.turns) for e in roots])),
        "invalid_rate": float(np.mean([not t.valid for e in roots for t in e.turns])),
        "episodes_lost": float(rollout.lost),
    }


def work_metrics(
    rollout: Rollout, rb: RolloutBatch, cont: ContinuationResult | None
) -> dict[str, float]:
    """The batch's size and the environment interactions the step spent."""
    return {
        "actions": float(rb.batch.num_actions),
        "action_tokens": float(rb.batch.num_tokens),
        "root_interactions": float(sum(len(e.turns) for e in rollout.roots)),
        "continuation_interactions": float(cont.interactions if cont else 0),
        "replay_steps": float(cont.replay_steps if cont else 0),
    }


def credit_metrics(rb: RolloutBatch, credit: CreditAssignment) -> dict[str, float]:
    """The schedules' values at this step, |w-bar_t - 1|, and the signal the credit carries."""
    dev = coefficient_deviation(credit.weight, rb.batch.action_index, rb.batch.num_actions)
    return {
        "strength": credit.strength,
        "kl_coef": credit.kl_coef,
        "warmup": float(credit.warmup),
        "coef_deviation_mean": float(dev.mean()),
        "coef_deviation_median": float(dev.median()),
        "group_signal": group_signal(credit.a_seq, rb.batch.group_index),
        "zero_credit_share": zero_credit_share(credit.credit),
    }


def update_metrics(stats: UpdateStats, critic: bool) -> dict[str, float]:
    out = {
        "loss": stats.loss,
        "loss_action": stats.action_loss,
        "loss_non_action": stats.non_action_loss,
        "kl": stats.kl,
        "grad_norm": stats.grad_norm,
        "clip_fraction": stats.clip_fraction,
        "approx_kl": stats.approx_kl,
    }
    if critic:
        out["critic_loss"] = stats.critic_loss
        out["critic_grad_norm"] = stats.critic_grad_norm
    return out


def step_metrics(
    rollout: Rollout,
    rb: RolloutBatch,
    cont: ContinuationResult | None,
    value: ValueFit,
    credit: CreditAssignment,
    stats: UpdateStats,
    times: dict[str, float],
    critic: bool,
    logprob_gap: float | None,
) -> dict[str, float]:
    """Every metric of the step (NaNs left out); ``times`` are the phases' ``time_*``, of
    which ``time_critic`` only for a method with a critic, and ``vllm_logprob_gap`` only when
    vLLM's log-probs were re-scored by the trainer model."""
    metrics = {
        **rollout_metrics(rollout),
        **work_metrics(rollout, rb, cont),
        **credit_metrics(rb, credit),
        **update_metrics(stats, critic),
        **value.metrics,
        **{k: v for k, v in times.items() if critic or k != "time_critic"},
    }
    if logprob_gap is not None:
        metrics["vllm_logprob_gap"] = float(logprob_gap)
    return nonfinite_dropped(metrics)
