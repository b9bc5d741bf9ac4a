"""FACTOR's credit math: pure functions over a packed ragged batch (no I/O, no package imports).

Public entry points (shapes use N_tok tokens, N_act actions, N_traj trajectories):

    td_action_credit(rewards, values, traj_index, v0) -> A*[N_act]
    allocation(gap, action_index, credit, eta, tau=1.0, d=3.0) -> omega[N_tok]
    serl_weights(gap, action_index, advantage, alpha, clip=0.2) -> w[N_tok]
    policy_loss(logp, logp_old, coef, action_index, reduction, clip_eps=0.2) -> scalar
    assign_credit(batch, method, step, cfg) -> CreditAssignment   (any method by name)
"""

from factor_cli.registry import Registry

from .advantage import (
    CONVENTIONS,
    TrajectoryAdvantage,
    group_standardize,
    leave_one_out,
    raw_outcome,
    terminal_rewards,
)
from .allocation import ALLOCATIONS, allocation, hta_scores
from .batch import PackedBatch
from .config import CreditConfig
from .diagnostics import (
    action_surrogate_weight,
    coefficient_deviation,
    conservation_drift,
    length_bias_table,
    sign_agreement,
)
from .estimators import ESTIMATORS, CreditInputs, broadcast_credit, uniform_credit
from .gigpo import gigpo_advantage
from .losses import (
    REDUCTIONS,
    Objective,
    action_surrogates,
    clipped_surrogate,
    non_action_loss,
    objective,
    policy_loss,
)
from .methods import METHODS, CreditAssignment, MethodSpec, assign_credit
from .schedules import alpha_schedule, eta_schedule, in_warmup
from .serl import action_kl, serl_weights
from .tac import gae_credit, reverse_discounted_sum, td_action_credit, td_n_step_credit

__all__ = [
    "ALLOCATIONS",
    "CONVENTIONS",
    "ESTIMATORS",
    "METHODS",
    "REDUCTIONS",
    "CreditAssignment",
    "CreditConfig",
    "CreditInputs",
    "MethodSpec",
    "Objective",
    "PackedBatch",
    "Registry",
    "TrajectoryAdvantage",
    "action_kl",
    "action_surrogate_weight",
    "action_surrogates",
    "allocation",
    "alpha_schedule",
    "assign_credit",
    "broadcast_credit",
    "clipped_surrogate",
    "coefficient_deviation",
    "conservation_drift",
    "eta_schedule",
    "gae_credit",
    "gigpo_advantage",
    "group_standardize",
    "hta_scores",
    "in_warmup",
    "leave_one_out",
    "length_bias_table",
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
    "uniform_credit",
]
