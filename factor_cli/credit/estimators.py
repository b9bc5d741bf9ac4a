"""Action-credit estimators ("how much"), selected by name from ``ESTIMATORS``.

Every estimator takes the same inputs (:class:`CreditInputs`) and returns per-action credit
A[N_act]. ``conserves`` says whether sum_t A_t = A^seq_i holds exactly for every trajectory;
``uses_values`` whether it reads the value head (and so is replaced by uniform credit during the
value-head warm-up).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from factor_cli.registry import Registry

from .config import CreditConfig
from .gigpo import gigpo_advantage
from .hgpo import hgpo_advantage
from .segments import permute_within_segments, segment_count
from .tac import gae_credit, td_action_credit, td_n_step_credit


@dataclass(frozen=True)
class CreditInputs:
    """The packed per-action / per-trajectory inputs of every estimator.

    rewards[N_act]      r_t (0 except r_{T-1} under all our conventions)
    values[N_act]       V_target(x_t) from the target value head (first action's entry unused)
    traj_index[N_act]   trajectory of each action, contiguous, in turn order
    v0[N_traj]          V~(x_0) by the environment convention
    a_seq[N_traj]       A^seq_i
    group_index[N_traj] group (task instance) of each trajectory
    state_key[N_act]    observation id before each action (GiGPO anchor states), optional
    """

    rewards: Tensor
    values: Tensor
    traj_index: Tensor
    v0: Tensor
    a_seq: Tensor
    group_index: Tensor
    state_key: Tensor | None = None
    validated: bool = False
    """True when built from a validated PackedBatch: estimators then skip re-checking."""

    @property
    def num_actions_per_traj(self) -> Tensor:
        """T_i, [N_traj]."""
        return segment_count(self.traj_index, self.a_seq.numel())


EstimatorFn = Callable[[CreditInputs, CreditConfig, "torch.Generator | None"], Tensor]


@dataclass(frozen=True)
class Estimator:
    fn: EstimatorFn
    uses_values: bool
    conserves: bool
    summary: str

    def __call__(
        self, inp: CreditInputs, cfg: CreditConfig, generator: torch.Generator | None = None
    ) -> Tensor:
        return self.fn(inp, cfg, generator)


ESTIMATORS: Registry[Estimator] = Registry("credit estimator")


def _td(inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None) -> Tensor:
    return td_action_credit(
        inp.rewards, inp.values, inp.traj_index, inp.v0, check=not inp.validated
    )


def _td_n(inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None, n: int) -> Tensor:
    return td_n_step_credit(inp.rewards, inp.values, inp.traj_index, inp.v0, n)


def _gae(inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None, lam: float) -> Tensor:
    return gae_credit(inp.rewards, inp.values, inp.traj_index, inp.v0, lam)


def broadcast_credit(
    inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None = None
) -> Tensor:
    """A_t = A^seq_i for every action of trajectory i (GRPO's broadcast; Monte-Carlo credit)."""
    return inp.a_seq[inp.traj_index]


def uniform_credit(
    inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None = None
) -> Tensor:
    """A_t = A^seq_i / T_i (w/o TAC, and every TAC method during the value-head warm-up)."""
    t = inp.num_actions_per_traj.clamp_min(1).to(inp.a_seq.dtype)
    return (inp.a_seq / t)[inp.traj_index]


def _td_shuffled(inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None) -> Tensor:
    credit = _td(inp, cfg, gen)
    return credit[permute_within_segments(inp.traj_index, gen)]


def _state_key(inp: CreditInputs, estimator: str) -> Tensor:
    if inp.state_key is None:
        raise ValueError(
            f"state_key is required by the {estimator} estimator (one observation id per action)"
        )
    return inp.state_key


def _gigpo(inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None) -> Tensor:
    _state_key(inp, "gigpo")
    return gigpo_advantage(
        inp.rewards,
        inp.traj_index,
        inp.group_index,
        inp.state_key,
        inp.a_seq,
        gamma=cfg.gigpo_gamma,
        omega=cfg.gigpo_omega,
        norm=cfg.gigpo_norm,
    )


def _hgpo(inp: CreditInputs, cfg: CreditConfig, gen: torch.Generator | None) -> Tensor:
    return hgpo_advantage(
        inp.rewards,
        inp.traj_index,
        inp.group_index,
        _state_key(inp, "hgpo"),
        inp.a_seq,
        depth=cfg.hgpo_depth,
        gamma=cfg.hgpo_gamma,
        alpha=cfg.hgpo_alpha,
        norm=cfg.hgpo_norm,
        base_group=cfg.hgpo_base_group,
    )


ESTIMATORS.add("td", Estimator(_td, True, True, "one-step TD residual on V~ (TAC)"))
for _n in (3, 5):
    ESTIMATORS.add(f"td-{_n}", Estimator(partial(_td_n, n=_n), True, False, f"{_n}-step TD on V~"))
for _lam in (0.9, 0.95):
    ESTIMATORS.add(
        f"gae-{_lam}",
        Estimator(
            partial(_gae, lam=_lam), True, False, f"GAE(lambda={_lam}), gamma=1, truncated at T"
        ),
    )
ESTIMATORS.add(
    "broadcast", Estimator(broadcast_credit, False, False, "A^seq on every action (GRPO / SERL)")
)
ESTIMATORS.add(
    "mc",
    Estimator(broadcast_credit, False, False, "Monte-Carlo: episode return minus baseline, A^seq"),
)
ESTIMATORS.add("uniform", Estimator(uniform_credit, False, True, "A^seq / T (w/o TAC)"))
ESTIMATORS.add(
    "td-shuffled",
    Estimator(_td_shuffled, True, True, "TAC permuted within each trajectory (CreditShuffled)"),
)
ESTIMATORS.add(
    "gigpo", Estimator(_gigpo, False, False, "GiGPO: A^seq + omega * anchor-state step advantage")
)
ESTIMATORS.add(
    "hgpo",
    Estimator(_hgpo, False, False, "HGPO: weighted step advantages of nested history groups"),
)
