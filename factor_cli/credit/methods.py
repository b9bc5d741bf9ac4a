"""The method registry: every method and ablation the paper compares, as data.

A method is (credit estimator, token allocation, strength schedule, reduction, KL term, budget).
:func:`assign_credit` turns a packed batch into token coefficients for any of them, so the
trainer never branches on a method's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from factor_cli.registry import Registry

from .advantage import CONVENTIONS, terminal_rewards
from .allocations import ALLOCATIONS
from .batch import PackedBatch
from .config import CreditConfig
from .estimators import ESTIMATORS, CreditInputs, uniform_credit
from .losses import REDUCTIONS
from .ppo import TOKEN_ESTIMATORS
from .schedules import alpha_schedule, eta_schedule, in_warmup, kl_schedule
from .segments import segment_mean

SCHEDULES = ("eta", "alpha", "none")
VALUE_SOURCES = ("head", "mc")
"""Where V~(x_t), 0 < t < T, comes from (``MethodSpec.values``)."""


@dataclass(frozen=True)
class MethodSpec:
    name: str
    estimator: str
    """Credit estimator name (``ESTIMATORS``)."""
    allocation: str
    """Token allocation name (``ALLOCATIONS``)."""
    schedule: str
    """Allocation strength: "eta" (eta_k), "alpha" (alpha_k) or "none" (0)."""
    kl: bool
    """Adds SERL's action-only KL with lambda_k = alpha_k."""
    continuations: bool
    """Runs continuations: FACTOR's budget (B checkpoints x M per root) feeding the value head,
    or, with ``values="mc"``, K continuations from every interior state."""
    summary: str
    reduction: str | None = None
    """Forced reduction; None follows the protocol's configured reduction."""
    warmup: bool = False
    """Value-based credit is replaced by A^seq/T during the value-head warm-up."""
    steps_scale: float | None = None
    """Train ceil(steps_scale x steps) steps (SERL-Extended: 1.25, so 188 of the paper's 150:
    the compute FACTOR's continuations cost; 5 of the smoke preset's 4)."""
    critic: bool = False
    """Trains a learned critic and takes token-level credit from it: ``estimator`` then names a
    ``TOKEN_ESTIMATORS`` entry (PPO's token GAE), not an ``ESTIMATORS`` one."""
    values: str = "head"
    """Where V~(x_t), 0 < t < T, comes from (``VALUE_SOURCES``): "head", the target value head
    (trained on continuation targets when the method has continuations), or "mc", the mean
    return of the K continuations from x_t (VinePPO; ``monte_carlo_values``; no value head)."""

    @property
    def uses_teacher(self) -> bool:
        """Whether the hindsight teacher must score the batch."""
        return self.kl or (self.allocation != "uniform" and self.schedule != "none")

    @property
    def uses_value_head(self) -> bool:
        """FACTOR's value head (continuation targets); a critic method has its own critic."""
        if self.critic:
            return self.continuations
        if self.values == "mc":
            return False
        return self.continuations or ESTIMATORS.get(self.estimator).uses_values

    @property
    def continuation_use(self) -> str:
        """What continuations feed: "head" (value-head targets), "mc" (the values) or "-"."""
        return self.values if self.continuations else "-"


METHODS: Registry[MethodSpec] = Registry("method")


def _add(spec: MethodSpec) -> None:
    (TOKEN_ESTIMATORS if spec.critic else ESTIMATORS).get(spec.estimator)
    if spec.critic and (spec.allocation != "uniform" or spec.schedule != "none" or spec.kl):
        raise ValueError(f"critic method {spec.name!r}: token credit takes no allocation or KL")
    ALLOCATIONS.get(spec.allocation)
    if spec.schedule not in SCHEDULES:
        raise ValueError(f"schedule {spec.schedule!r} not in {SCHEDULES}")
    if spec.reduction is not None:
        REDUCTIONS.get(spec.reduction)
    if spec.values not in VALUE_SOURCES:
        raise ValueError(f"values {spec.values!r} not in {VALUE_SOURCES}")
    if spec.values == "mc" and not (
        spec.continuations and not spec.critic and ESTIMATORS.get(spec.estimator).uses_values
    ):
        raise ValueError(
            f"method {spec.name!r}: Monte-Carlo values need continuations and an estimator "
            "that reads values"
        )
    METHODS.add(spec.name, spec)


_FACTOR = MethodSpec(
    "factor",
    "td",
    "per-action",
    "eta",
    kl=True,
    continuations=True,
    warmup=True,
    summary="TAC credit + HTA/APM allocation + action-mean (+ SERL's action KL)",
)
_SERL = MethodSpec(
    "serl-repro",
    "broadcast",
    "serl-psi",
    "alpha",
    kl=True,
    continuations=False,
    summary="SERL: A^seq x psi multipliers + action KL",
)
for _spec in (
    MethodSpec(
        "grpo",
        "broadcast",
        "uniform",
        "none",
        kl=False,
        continuations=False,
        summary="A^seq broadcast to every action and token",
    ),
    _SERL,
    replace(
        _SERL,
        name="serl-uniform",
        allocation="uniform",
        schedule="none",
        summary="SERL with alpha == 0 (KL term only)",
    ),
    replace(
        _SERL,
        name="serl-extended",
        steps_scale=1.25,
        summary="SERL-Repro for 1.25x the steps (188 of 150: compute-matched)",
    ),
    replace(
        _SERL,
        name="serl-actionnorm",
        reduction="action-mean",
        summary="SERL with the action-mean reduction forced",
    ),
    _FACTOR,
    replace(
        _FACTOR, name="wo-tac", estimator="uniform", summary="FACTOR with uniform credit A^seq/T"
    ),
    replace(
        _FACTOR,
        name="wo-hta",
        allocation="uniform",
        schedule="none",
        summary="FACTOR with eta == 0 (uniform allocation)",
    ),
    replace(
        _FACTOR,
        name="batch-global-norm",
        allocation="batch-global",
        summary="FACTOR with one softmax over the whole batch",
    ),
    replace(
        _FACTOR,
        name="token-shuffled",
        allocation="token-shuffled",
        summary="FACTOR with gaps permuted within each action",
    ),
    replace(
        _FACTOR,
        name="credit-shuffled",
        estimator="td-shuffled",
        summary="FACTOR with TAC permuted within each trajectory",
    ),
    replace(
        _FACTOR,
        name="tac-serl-psi",
        allocation="serl-psi",
        schedule="alpha",
        reduction="token-mean",
        summary="TAC credit x SERL psi, token-mean, no APM",
    ),
    MethodSpec(
        "gigpo",
        "gigpo",
        "uniform",
        "none",
        kl=False,
        continuations=False,
        summary="GiGPO: episode + anchor-state step advantage",
    ),
    MethodSpec(
        "hgpo",
        "hgpo",
        "uniform",
        "none",
        kl=False,
        continuations=False,
        summary="HGPO: adaptive-weighted advantages of history-consistent step groups",
    ),
    MethodSpec(
        "ppo",
        "critic-gae",
        "uniform",
        "none",
        kl=False,
        continuations=False,
        critic=True,
        summary="PPO: learned critic, token GAE across turns, value clipping",
    ),
    replace(_FACTOR, name="td-3", estimator="td-3", summary="FACTOR with 3-step TD credit"),
    replace(_FACTOR, name="td-5", estimator="td-5", summary="FACTOR with 5-step TD credit"),
    replace(_FACTOR, name="gae-0.9", estimator="gae-0.9", summary="FACTOR with GAE(0.9) credit"),
    replace(_FACTOR, name="gae-0.95", estimator="gae-0.95", summary="FACTOR with GAE(0.95) credit"),
    replace(
        _FACTOR,
        name="mc",
        estimator="mc",
        continuations=False,
        summary="FACTOR with Monte-Carlo credit (no value head)",
    ),
    MethodSpec(
        "vineppo",
        "td",
        "uniform",
        "none",
        kl=False,
        continuations=True,
        values="mc",
        reduction="action-mean",
        summary="VinePPO: TD credit on Monte-Carlo values (K continuations per state), action-mean",
    ),
    replace(
        _FACTOR,
        name="factor-mc",
        values="mc",
        warmup=False,
        summary="FACTOR with TAC reading VinePPO's Monte-Carlo values (no value head)",
    ),
):
    _add(_spec)


@dataclass(frozen=True)
class CreditAssignment:
    """Everything the loss and the diagnostics need from one batch."""

    a_seq: Tensor
    """A^seq_i, [N_traj]."""
    v0: Tensor
    """V~(x_0), [N_traj]."""
    rewards: Tensor
    """r_t, [N_act]."""
    credit: Tensor
    """Action credit A_t (A*_t for TAC), [N_act]."""
    weight: Tensor
    """Token allocation omega_{t,j} (or SERL's w_{t,j}), [N_tok]."""
    coef: Tensor
    """C_{t,j} = credit_t * weight_{t,j}, [N_tok]."""
    reduction: str
    strength: float
    """eta_k or alpha_k used for the allocation."""
    kl_coef: float
    """lambda_k of the action KL (0 when the method has none)."""
    warmup: bool
    """True if credit was uniform because the value head is warming up."""
    returns: Tensor | None = None
    """Critic methods: R_n = A_n + V_n per action token, the critic's target, [N_tok]."""
    token_values: Tensor | None = None
    """Critic methods: V^old_n the advantages came from, [N_tok] (for value clipping)."""
    whiten: bool = False
    """Critic methods: ``coef`` is to be whitened per PPO mini-batch (``credit.ppo.whiten``)."""


def assign_credit(
    batch: PackedBatch,
    method: str,
    step: int,
    cfg: CreditConfig | None = None,
    reduction: str = "action-mean",
    generator: torch.Generator | None = None,
) -> CreditAssignment:
    """Token coefficients C_{t,j} of ``method`` at training step ``step`` (1-based).

    ``reduction`` is the protocol's reduction, used unless the method forces its own.
    ``generator`` seeds the shuffled ablations.
    """
    cfg = cfg or CreditConfig()
    spec = METHODS.get(method)
    batch.validate()
    REDUCTIONS.get(reduction)
    traj = batch.traj_index.long()
    adv = CONVENTIONS.get(batch.convention)(batch.outcome, batch.group_index)
    rewards = terminal_rewards(adv.terminal, traj)
    if spec.critic:
        return _critic_assignment(batch, spec, adv.a_seq, adv.v0, rewards, cfg, reduction)
    estimator = ESTIMATORS.get(spec.estimator)
    warm = spec.warmup and estimator.uses_values and in_warmup(step, cfg)
    if estimator.uses_values and not warm and batch.values is None:
        raise ValueError(
            f"values is missing: method {method!r} ({spec.estimator} credit) needs "
            + ("the value head" if spec.values == "head" else "the Monte-Carlo values")
        )
    values = batch.values if batch.values is not None else torch.zeros_like(rewards)
    inp = CreditInputs(
        rewards,
        values,
        traj,
        adv.v0,
        adv.a_seq,
        batch.group_index.long(),
        batch.state_key,
        validated=True,
    )
    credit = uniform_credit(inp, cfg) if warm else estimator(inp, cfg, generator)

    strength = {"eta": eta_schedule, "alpha": alpha_schedule}.get(spec.schedule, lambda k, c: 0.0)(
        step, cfg
    )
    action_index = batch.action_index.long()
    if spec.uses_teacher and spec.allocation != "uniform":
        gap = batch.gap
    else:
        gap = torch.zeros_like(batch.logp_old)
    # The batch was validated above: the allocation need not check its inputs again.
    weight = ALLOCATIONS.get(spec.allocation)(
        gap, action_index, credit, strength, cfg, generator, check=False
    )
    return CreditAssignment(
        a_seq=adv.a_seq,
        v0=adv.v0,
        rewards=rewards,
        credit=credit,
        weight=weight,
        coef=credit.index_select(0, action_index) * weight,
        reduction=spec.reduction or reduction,
        strength=strength,
        kl_coef=kl_schedule(step, cfg) if spec.kl else 0.0,
        warmup=warm,
    )


def _critic_assignment(
    batch: PackedBatch,
    spec: MethodSpec,
    a_seq: Tensor,
    v0: Tensor,
    rewards: Tensor,
    cfg: CreditConfig,
    reduction: str,
) -> CreditAssignment:
    """Token credit from the critic: C_n = A_n (token GAE; whitened later, per mini-batch)."""
    gae = TOKEN_ESTIMATORS.get(spec.estimator)(batch, rewards, cfg)
    action_index = batch.action_index.long()
    # Per-action credit for the diagnostics: the mean token advantage of the action.
    credit = segment_mean(gae.advantages, action_index, batch.num_actions)
    return CreditAssignment(
        a_seq=a_seq,
        v0=v0,
        rewards=rewards,
        credit=credit,
        weight=torch.ones_like(gae.advantages),
        coef=gae.advantages,
        reduction=spec.reduction or reduction,
        strength=0.0,
        kl_coef=0.0,
        warmup=False,
        returns=gae.returns,
        token_values=batch.token_values,
        whiten=cfg.ppo_whiten,
    )
