"""FACTOR's credit math: pure functions over a packed ragged batch (no I/O, no package imports).

Public entry points (shapes use N_tok tokens, N_act actions, N_traj trajectories):

    td_action_credit(rewards, values, traj_index, v0) -> A*[N_act]
    allocation(gap, action_index, credit, eta, tau=1.0, d=3.0) -> omega[N_tok]
    serl_weights(gap, action_index, advantage, alpha, clip=0.2) -> w[N_tok]
    policy_loss(logp, logp_old, coef, action_index, reduction, clip_eps=0.2) -> scalar
    monte_carlo_values(returns, state_index, traj_index, v0) -> (V-hat[N_act], K_t[N_act])
    assign_credit(batch, method, step, cfg) -> CreditAssignment   (any method by name)

Names are re-exported lazily (PEP 562): importing one submodule, e.g. ``credit.config`` for
config validation, does not import torch through the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from factor_cli.registry import Registry

if TYPE_CHECKING:
    from .advantage import (
        CONVENTIONS,
        Convention,
        TrajectoryAdvantage,
        group_standardize,
        leave_one_out,
        raw_outcome,
        terminal_rewards,
        terminal_targets,
    )
    from .allocations import ALLOCATIONS, allocation, hta_scores
    from .batch import PackedBatch
    from .config import CreditConfig
    from .diagnostics import (
        action_surrogate_weight,
        coefficient_deviation,
        conservation_drift,
        group_signal,
        length_bias_table,
        sign_agreement,
        top_quartile_mass,
        zero_credit_share,
    )
    from .estimators import ESTIMATORS, CreditInputs, broadcast_credit, uniform_credit
    from .gigpo import gigpo_advantage
    from .hgpo import hgpo_advantage
    from .losses import (
        REDUCTIONS,
        ActionTokens,
        DistillTokens,
        NonActionTokens,
        Normalizers,
        Objective,
        action_surrogates,
        clipped_surrogate,
        non_action_loss,
        objective,
        policy_loss,
    )
    from .mc_values import monte_carlo_values
    from .methods import METHODS, CreditAssignment, MethodSpec, assign_credit
    from .ppo import TOKEN_ESTIMATORS, TokenGAE, token_gae, value_loss, whiten
    from .schedules import alpha_schedule, eta_schedule, in_warmup
    from .serl import action_kl, serl_weights
    from .states import anchor_state_keys, context_groups
    from .tac import gae_credit, reverse_discounted_sum, td_action_credit, td_n_step_credit

_EXPORTS = {
    "CONVENTIONS": "advantage",
    "Convention": "advantage",
    "TrajectoryAdvantage": "advantage",
    "group_standardize": "advantage",
    "leave_one_out": "advantage",
    "raw_outcome": "advantage",
    "terminal_rewards": "advantage",
    "terminal_targets": "advantage",
    "ALLOCATIONS": "allocations",
    "allocation": "allocations",
    "hta_scores": "allocations",
    "PackedBatch": "batch",
    "CreditConfig": "config",
    "action_surrogate_weight": "diagnostics",
    "coefficient_deviation": "diagnostics",
    "conservation_drift": "diagnostics",
    "group_signal": "diagnostics",
    "length_bias_table": "diagnostics",
    "sign_agreement": "diagnostics",
    "top_quartile_mass": "diagnostics",
    "zero_credit_share": "diagnostics",
    "CreditInputs": "estimators",
    "ESTIMATORS": "estimators",
    "broadcast_credit": "estimators",
    "uniform_credit": "estimators",
    "gigpo_advantage": "gigpo",
    "hgpo_advantage": "hgpo",
    "ActionTokens": "losses",
    "DistillTokens": "losses",
    "NonActionTokens": "losses",
    "Normalizers": "losses",
    "Objective": "losses",
    "REDUCTIONS": "losses",
    "action_surrogates": "losses",
    "clipped_surrogate": "losses",
    "non_action_loss": "losses",
    "objective": "losses",
    "policy_loss": "losses",
    "monte_carlo_values": "mc_values",
    "CreditAssignment": "methods",
    "METHODS": "methods",
    "MethodSpec": "methods",
    "assign_credit": "methods",
    "TOKEN_ESTIMATORS": "ppo",
    "TokenGAE": "ppo",
    "token_gae": "ppo",
    "value_loss": "ppo",
    "whiten": "ppo",
    "alpha_schedule": "schedules",
    "eta_schedule": "schedules",
    "in_warmup": "schedules",
    "action_kl": "serl",
    "serl_weights": "serl",
    "anchor_state_keys": "states",
    "context_groups": "states",
    "gae_credit": "tac",
    "reverse_discounted_sum": "tac",
    "td_action_credit": "tac",
    "td_n_step_credit": "tac",
}

__all__ = [
    "ALLOCATIONS",
    "CONVENTIONS",
    "ESTIMATORS",
    "METHODS",
    "REDUCTIONS",
    "TOKEN_ESTIMATORS",
    "ActionTokens",
    "Convention",
    "CreditAssignment",
    "CreditConfig",
    "CreditInputs",
    "DistillTokens",
    "MethodSpec",
    "NonActionTokens",
    "Normalizers",
    "Objective",
    "PackedBatch",
    "Registry",
    "TokenGAE",
    "TrajectoryAdvantage",
    "action_kl",
    "action_surrogate_weight",
    "action_surrogates",
    "allocation",
    "alpha_schedule",
    "anchor_state_keys",
    "assign_credit",
    "broadcast_credit",
    "clipped_surrogate",
    "coefficient_deviation",
    "conservation_drift",
    "context_groups",
    "eta_schedule",
    "gae_credit",
    "gigpo_advantage",
    "group_signal",
    "group_standardize",
    "hgpo_advantage",
    "hta_scores",
    "in_warmup",
    "leave_one_out",
    "length_bias_table",
    "monte_carlo_values",
    "non_action_loss",
    "objective",
    "policy_loss",
    "raw_outcome",
    "reverse_discounted_sum",
    "serl_weights",
    "sign_agreement",
    "td_action_credit",
    "td_n_step_credit",
    "terminal_rewards",
    "terminal_targets",
    "token_gae",
    "top_quartile_mass",
    "uniform_credit",
    "value_loss",
    "whiten",
    "zero_credit_share",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
