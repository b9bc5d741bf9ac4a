"""The prompt format of a config: ``prompt.*`` over the environment's defaults over
:class:`~factor_cli.policy.prompting.PromptFormat`'s (each default has that one home)."""

from __future__ import annotations

from factor_cli.envs import ENVIRONMENTS
from factor_cli.policy.prompting import ROLE, PromptFormat, system_text

from .config import TrainConfig

_OPTIONAL = ("history_turns", "step_counter", "admissible_max", "admissible_max_tokens")


def prompt_format(cfg: TrainConfig) -> PromptFormat:
    """The :class:`PromptFormat` every phase of a run (SFT, rollouts, teacher, eval) uses."""
    p = cfg.prompt
    spec = ENVIRONMENTS.get(cfg.env.name).spec
    fields: dict[str, object] = {k: getattr(p, k) for k in _OPTIONAL if getattr(p, k) is not None}
    admissible = spec.shows_admissible if p.admissible is None else p.admissible
    system = p.system if p.system is not None else system_text(spec.role or ROLE, p.think)
    return PromptFormat(system=system, admissible=admissible, **fields)  # type: ignore[arg-type]
