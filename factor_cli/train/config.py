"""Typed training configuration: pydantic models loaded from YAML, overridable with --set.

Every field is documented once (its ``description``) and that text feeds both `factor train
--help-config` and the YAML reference. Unknown keys and bad values are one-line errors naming
the field, the value and what is allowed. Presets live in ``experiments/`` (``smoke``,
``paper``); a preset name or a YAML path is accepted wherever a config is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from factor_cli.credit import METHODS, REDUCTIONS, CreditConfig
from factor_cli.policy import value_defaults
from factor_cli.rollout import continuations

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "experiments"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message is one line naming field and fix."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Strict):
    path: str = Field("runs/tiny-1m", description="Local path or hub id of the policy model.")
    init_tiny: str | None = Field(
        "1m", description="If set and `path` does not exist, build this tiny preset there first."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype."
    )
    device: str = Field("cpu", description="Device: cpu, cuda, cuda:N.")


class EnvConfig(Strict):
    name: str = Field("twx", description="Environment adapter (see `factor envs list`).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Adapter options, e.g. TWX {params: {coin: ...}}."
    )
    games: list[str] = Field(
        default_factory=list,
        description="Restrict instances to these categories (TWX games, ALFWorld task types...).",
    )
    splits_dir: str = Field("splits", description="Folder of the split manifests.")
    max_turns: int | None = Field(None, ge=1, description="Turn limit (default: the adapter's).")


class RolloutConfig(Strict):
    groups: int = Field(16, ge=1, description="Task instances per step (B_traj = groups x k).")
    k: int = Field(8, ge=2, description="Trajectories per instance (group size K).")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature.")
    max_new_tokens: int = Field(512, ge=1, description="Generation limit per reply.")
    max_context: int = Field(4096, ge=16, description="Context limit (prompt + reply).")
    history_turns: int = Field(2, ge=0, description="Past turns shown in each prompt.")
    backend: str = Field("hf", description="Generation backend: hf or vllm.")


class ContinuationConfig(Strict):
    """Defaults from :mod:`factor_cli.rollout.continuations`, their one home."""

    budget: int = Field(
        continuations.BUDGET, ge=1, description="B: checkpoints per root trajectory."
    )
    per_checkpoint: int = Field(
        continuations.PER_CHECKPOINT, ge=1, description="M: continuations per checkpoint."
    )
    horizon: int = Field(continuations.HORIZON, ge=1, description="Maximum continuation turns.")
    temperature: float = Field(
        continuations.TEMPERATURE, gt=0, description="Continuation sampling temperature."
    )


class ValueConfig(Strict):
    """Defaults from :mod:`factor_cli.policy.value_defaults`, their one home."""

    hidden: int = Field(
        value_defaults.VALUE_HIDDEN, ge=1, description="Value-head MLP hidden size."
    )
    lr: float = Field(value_defaults.VALUE_LR, gt=0, description="Value-head Adam learning rate.")
    tau: float = Field(
        value_defaults.VALUE_TAU, gt=0, lt=1, description="Polyak coefficient of the target head."
    )
    replay_steps: int = Field(
        value_defaults.VALUE_REPLAY_STEPS, ge=1, description="Steps of Monte-Carlo targets kept."
    )
    epochs: int = Field(
        value_defaults.VALUE_EPOCHS, ge=1, description="Passes over the replay buffer per step."
    )
    batch_size: int = Field(
        value_defaults.VALUE_BATCH_SIZE, ge=1, description="Value-head minibatch size."
    )


class OptimConfig(Strict):
    lr: float = Field(5e-7, gt=0, description="Policy Adam learning rate.")
    ppo_epochs: int = Field(1, ge=1, description="PPO epochs per step.")
    minibatches: int = Field(1, ge=1, description="PPO mini-batches per epoch.")
    micro_batch_actions: int = Field(64, ge=1, description="Actions per forward pass.")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip epsilon.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip.")


class EngineConfig(Strict):
    kind: Literal["deepspeed"] = Field("deepspeed", description="Training engine (DeepSpeed).")
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="ZeRO stage (3 is for GPUs).")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Training precision.")
    offload_optimizer: bool = Field(False, description="ZeRO-Offload the optimizer to CPU.")


class EvalConfig(Strict):
    every: int = Field(0, ge=0, description="Evaluate every N steps (0: only at the end).")
    max_items: int | None = Field(None, ge=1, description="Cap on eval instances (None: all).")


class SFTConfig(Strict):
    enabled: bool = Field(False, description="Supervised warm start on gold plays before RL.")
    games: int = Field(200, ge=1, description="Gold plays used.")
    epochs: int = Field(1, ge=1, description="Passes over the gold data.")
    lr: float = Field(3e-3, gt=0, description="Learning rate.")
    batch_size: int = Field(16, ge=1, description="Sequences per step.")


class TrainConfig(Strict):
    study: str = Field("default", description="Study name (ledger tag).")
    method: str = Field("factor", description="Method / ablation name (`factor credit methods`).")
    reduction: str = Field("action-mean", description="Loss reduction of the protocol.")
    steps: int = Field(150, ge=1, description="Training steps (a method may override: 188).")
    seed: int = Field(42, description="Seed of everything stochastic.")
    output_dir: str = Field("runs", description="Where checkpoints and results go.")
    checkpoint_every: int = Field(1, ge=1, description="Write a checkpoint every N steps.")
    tracking_uri: str | None = Field(None, description="MLflow URI (default: ./ledger sqlite).")
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    continuations: ContinuationConfig = Field(default_factory=ContinuationConfig)
    value: ValueConfig = Field(default_factory=ValueConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    credit: CreditConfig = Field(default_factory=CreditConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        METHODS.get(v)
        return v

    @field_validator("reduction")
    @classmethod
    def _reduction(cls, v: str) -> str:
        REDUCTIONS.get(v)
        return v

    @property
    def total_steps(self) -> int:
        return METHODS.get(self.method).steps or self.steps

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the resolved configuration."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a nested dict."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set rollout.k=4")
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {p} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return data


def resolve_source(source: str) -> Path:
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"{path}: no such config file")
        return path
    preset = EXPERIMENTS_DIR / f"{source}.yaml"
    if not preset.exists():
        names = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml"))
        raise ConfigError(
            f"unknown preset {source!r}; presets: {', '.join(names)} (or a YAML path)"
        )
    return preset


def load_config(source: str = "smoke", overrides: list[str] | None = None) -> TrainConfig:
    """A preset name or YAML path, plus --set overrides, validated into a TrainConfig."""
    path = resolve_source(source)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config sections")
    data = apply_overrides(data, overrides or [])
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        raise ConfigError(f"{path}: field {where}: {msg}{shown}") from None


def field_reference() -> list[tuple[str, str, str]]:
    """(dotted field, default, description) for every field: the YAML reference."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            elif name == "credit":
                for cname, doc in CreditConfig.field_docs().items():
                    rows.append(
                        (f"{prefix}credit.{cname}", repr(getattr(CreditConfig(), cname)), doc)
                    )
            else:
                default = f.default_factory() if f.default_factory else f.default  # type: ignore[call-arg]
                rows.append((f"{prefix}{name}", repr(default), f.description or ""))

    walk(TrainConfig, "")
    return rows
