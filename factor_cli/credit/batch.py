"""The packed ragged batch every credit computation consumes (docs/design.md section 3).

Tokens of all executable actions of all trajectories are concatenated; each level points to the
level above with an index tensor:

    per token  [N_tok]:  action_index, logp_old, logp_teacher (optional), token_values (optional)
    per action [N_act]:  traj_index, values (optional), state_key (optional)
    per traj  [N_traj]:  group_index, outcome

Actions of a trajectory are contiguous and in turn order; tokens of an action are contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from . import checks
from .advantage import CONVENTIONS
from .segments import Ragged, segment_count


@dataclass(frozen=True)
class PackedBatch:
    action_index: Tensor
    """[N_tok] action of each executable-action token."""
    logp_old: Tensor
    """[N_tok] behaviour log-prob log pi_old(y_{t,j} | x_t, y_{t,<j})."""
    traj_index: Tensor
    """[N_act] trajectory of each action."""
    group_index: Tensor
    """[N_traj] group (task instance, K rollouts) of each trajectory."""
    outcome: Tensor
    """[N_traj] terminal outcome G_i (WebShop: the penalised score G~_i)."""
    convention: str = "leave-one-out"
    """Outcome convention (``CONVENTIONS``): leave-one-out, group-standardize or raw."""
    logp_teacher: Tensor | None = None
    """[N_tok] hindsight teacher log-prob log pi_T(y_{t,j} | x_t, Phi_t, y_{t,<j})."""
    values: Tensor | None = None
    """[N_act] target value head V_target(x_t) at the boundary before each action."""
    state_key: Tensor | None = None
    """[N_act] id of the observation before each action (GiGPO anchor states)."""
    token_values: Tensor | None = None
    """[N_tok] the PPO critic's V before each action token (``credit.ppo``'s token chain)."""

    @property
    def num_tokens(self) -> int:
        return self.action_index.numel()

    @property
    def num_actions(self) -> int:
        return self.traj_index.numel()

    @property
    def num_trajectories(self) -> int:
        return self.outcome.numel()

    @property
    def lengths(self) -> Tensor:
        """L_t, [N_act]."""
        return segment_count(self.action_index.long(), self.num_actions)

    @property
    def num_actions_per_traj(self) -> Tensor:
        """T_i, [N_traj]."""
        return segment_count(self.traj_index.long(), self.num_trajectories)

    @property
    def turn(self) -> Tensor:
        """t, the position of each action within its trajectory, [N_act]."""
        return Ragged.of(self.traj_index.long(), self.num_trajectories).position

    @property
    def gap(self) -> Tensor:
        """Delta_{t,j} = log pi_T - log pi_old, [N_tok]."""
        if self.logp_teacher is None:
            raise ValueError(
                "logp_teacher is missing: the hindsight gap needs the teacher's log-probs"
            )
        return self.logp_teacher - self.logp_old

    def validate(self) -> PackedBatch:
        """Check shapes, index ranges, contiguity, finiteness; ValueError names the field."""
        checks.vector("outcome", self.outcome)
        checks.non_empty("outcome", self.outcome)
        n_traj, n_act = self.num_trajectories, self.num_actions
        checks.non_empty("traj_index", self.traj_index)
        checks.non_empty("action_index", self.action_index)
        n_groups = int(self.group_index.max()) + 1 if self.group_index.numel() else 0
        checks.index("group_index", self.group_index, n_groups, length=n_traj)
        traj = checks.index("traj_index", self.traj_index, n_traj)
        checks.every_segment_present("traj_index", segment_count(traj, n_traj), "trajectory")
        checks.contiguous("traj_index", traj, n_traj)
        act = checks.index("action_index", self.action_index, n_act)
        checks.every_segment_present("action_index", segment_count(act, n_act), "action")
        checks.contiguous("action_index", act, n_act)
        if bool((act[1:] < act[:-1]).any()):
            raise ValueError("action_index must be non-decreasing: pack tokens in action order")
        checks.vector("logp_old", self.logp_old)
        checks.same_length("logp_old", self.logp_old, self.num_tokens, "token")
        if self.logp_teacher is not None:
            checks.vector("logp_teacher", self.logp_teacher)
            checks.same_length("logp_teacher", self.logp_teacher, self.num_tokens, "token")
        if self.values is not None:
            checks.vector("values", self.values)
            checks.same_length("values", self.values, n_act, "action")
        if self.token_values is not None:
            checks.vector("token_values", self.token_values)
            checks.same_length("token_values", self.token_values, self.num_tokens, "token")
        if self.state_key is not None:
            checks.index("state_key", self.state_key, 2**62, length=n_act)
        CONVENTIONS.get(self.convention)
        return self
