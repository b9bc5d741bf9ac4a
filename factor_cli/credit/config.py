"""Credit hyperparameters: the one home of their defaults (paper Section 4.1 and Appendix D).

The trainer's typed configuration embeds this dataclass unchanged, so each default is written
exactly once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class CreditConfig:
    """Hyperparameters of credit, allocation, schedules and SERL's multiplier."""

    d: float = 3.0
    """HTA clip bound: s_{t,j} = sign(A*_t) clip(Delta_{t,j}, -d, d); math.inf disables clipping."""
    tau: float = 1.0
    """APM softmax temperature (> 0)."""
    eta_0: float = 0.7
    """Initial teacher concentration eta_0 in [0, 1]; eta_k = eta_0 max(1 - k/anneal_steps, 0)."""
    warmup_steps: int = 10
    """Value-head warm-up W: for k <= W credit is uniform A^seq/T and eta_k = 0."""
    anneal_steps: int = 50
    """Horizon of the linear eta_k / alpha_k annealing (teacher active for W < k < anneal_steps)."""
    alpha_0: float = 0.5
    """SERL multiplier strength alpha_0; alpha_k = alpha_0 max(1 - k/anneal_steps, 0) = lambda_k.
    The KL weight follows SERL's mixing schedule, as the paper's text says (lambda_k = alpha_k).
    The authors' public code uses lambda_k = max(1 - k/50, 0) instead: set credit.kl_0 = 1.0."""
    kl_0: float | None = None
    """SERL's action-KL weight lambda_0: lambda_k = kl_0 max(1 - k/anneal_steps, 0); None (the
    default) ties it to the mixing strength (lambda_k = alpha_k); 1.0 reproduces the authors'
    code."""
    psi_clip: float = 0.2
    """SERL's c: psi is clipped to [1 - c, 1 + c] unless psi_min / psi_max are set."""
    psi_min: float | None = None
    """Lower bound of psi (default 1 - psi_clip)."""
    psi_max: float | None = None
    """Upper bound of psi (default 1 + psi_clip)."""
    gigpo_gamma: float = 0.95
    """GiGPO step-return discount."""
    gigpo_omega: float = 1.0
    """GiGPO weight of the step-level term."""
    gigpo_norm: str = "std"
    """GiGPO anchor-group normalisation: "std" or "mean"."""
    hgpo_depth: int = 2
    """HGPO's H: deepest history level (groups agree on the last 0..H earlier states)."""
    hgpo_gamma: float = 0.95
    """HGPO step-return discount (the public HGPO scripts' gamma)."""
    hgpo_alpha: float = 1.0
    """HGPO weight power: level k weighs (k + 2)^alpha; 0 weighs every level equally."""
    hgpo_norm: str = "std"
    """HGPO per-level normalisation: "std" (population std) or "mean"."""
    hgpo_base_group: bool = False
    """HGPO: also average in the episode advantage A^seq as the lightest (L = 1) item."""
    ppo_gamma: float = 1.0
    """PPO (critic) discount along the token chain of the policy's action tokens."""
    ppo_lambda: float = 0.95
    """PPO (critic) GAE lambda along the token chain."""
    ppo_whiten: bool = True
    """PPO (critic): whiten the token advantages over each PPO mini-batch (verl's default)."""
    ppo_value_clip: float = 0.5
    """PPO critic loss: V is clipped to V_old +- this (verl's cliprange_value); > 0."""

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(
                f"credit.{name} = {getattr(self, name)!r} is invalid: must be {allowed}"
            )

        if not (self.d > 0):
            raise bad("d", "> 0 (math.inf for no clipping)")
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise bad("tau", "a finite number > 0")
        for name in ("eta_0", "alpha_0", "gigpo_gamma", "hgpo_gamma", "ppo_gamma", "ppo_lambda"):
            if not (0.0 <= getattr(self, name) <= 1.0):
                raise bad(name, "in [0, 1]")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise bad("warmup_steps", "an integer >= 0")
        if not (isinstance(self.anneal_steps, int) and self.anneal_steps >= 1):
            raise bad("anneal_steps", "an integer >= 1")
        if not (0.0 <= self.psi_clip < 1.0):
            raise bad("psi_clip", "in [0, 1)")
        if self.kl_0 is not None and not (math.isfinite(self.kl_0) and self.kl_0 >= 0.0):
            raise bad("kl_0", "a finite number >= 0, or null (lambda_k = alpha_k)")
        lo, hi = self.psi_bounds
        if not (0.0 <= lo <= hi):
            raise bad("psi_min", "<= psi_max and >= 0")
        if self.gigpo_norm not in ("std", "mean"):
            raise bad("gigpo_norm", "'std' or 'mean'")
        self._check_hgpo(bad)
        if not isinstance(self.ppo_whiten, bool):
            raise bad("ppo_whiten", "true or false")
        clip = self.ppo_value_clip
        if not (isinstance(clip, (int, float)) and clip > 0):
            raise bad("ppo_value_clip", "> 0 (inf for no clipping)")

    def _check_hgpo(self, bad: Callable[[str, str], ValueError]) -> None:
        depth = self.hgpo_depth
        if not (isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0):
            raise bad("hgpo_depth", "an integer >= 0")
        alpha = self.hgpo_alpha
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
            raise bad("hgpo_alpha", "a finite number >= 0")
        if self.hgpo_norm not in ("std", "mean"):
            raise bad("hgpo_norm", "'std' or 'mean'")
        if not isinstance(self.hgpo_base_group, bool):
            raise bad("hgpo_base_group", "true or false")

    @property
    def psi_bounds(self) -> tuple[float, float]:
        lo = 1.0 - self.psi_clip if self.psi_min is None else self.psi_min
        hi = 1.0 + self.psi_clip if self.psi_max is None else self.psi_max
        return lo, hi

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Field name -> its one-line documentation (feeds --help and the YAML reference)."""
        import ast
        import inspect
        import textwrap

        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        docs: dict[str, str] = {}
        for node, nxt in itertools.pairwise(body):
            is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            if is_field and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = str(nxt.value.value)
        return {f.name: docs.get(f.name, "") for f in fields(cls)}


DEFAULTS = CreditConfig()
"""The defaults, for the keyword defaults of the credit functions (``allocation(tau=...)``), so
each value is written once, in the field above."""

PPO_CLIP_EPS = 0.2
"""PPO's eps (docs/design.md section 4.7): q is clipped to [1 - eps, 1 + eps]. Here, torch-free,
so the training config (``optim.clip_eps``) and the losses read the one value."""
