"""Typed training configuration: pydantic models loaded from YAML, overridable with --set.

Every field is documented once (its ``description``) and that text feeds both `factor train
--help-config` and the YAML reference. Unknown keys and bad values are one-line errors naming
where the value came from (the YAML file and line, or the ``--set`` item), the field, the value
and what is allowed. Presets live in ``experiments/`` (``smoke``, ``paper``), shipped with the
package (:mod:`factor_cli.resources`); a preset name or a YAML path is accepted wherever a config
is.

Validation is complete when :func:`load_config` returns, before any model, engine or ledger run
exists, in two stages: the pydantic models check every field on its own and the relations inside
a section (names of environments, backends and devices, ``max_new_tokens < max_context``); then
:func:`check_config` checks what needs the registries or files (method and reduction names, the
environment's manifest and its categories for ``env.games``, the model path or tiny preset and
its position limit). Torch is only imported by that second stage's credit-name check, and only
once every other field is valid, so most mistakes answer in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from factor_cli.credit.config import PPO_CLIP_EPS, CreditConfig
from factor_cli.policy import value_defaults
from factor_cli.policy.generation import hf_options
from factor_cli.policy.generation.base import (
    DEFAULT_MAX_CONTEXT,
    DEFAULT_MAX_NEW_TOKENS,
    GenerationLimits,
)
from factor_cli.resources import presets_dir
from factor_cli.rollout import continuations

DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message is one line naming field and fix."""


class FieldError(ValueError):
    """A check on one dotted field failed; :func:`load_config` adds where the value came from."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


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
    critic_path: str | None = Field(
        None,
        description="PPO critic's backbone (same tokenizer as the policy); unset: a copy of the "
        "policy's.",
    )

    @field_validator("init_tiny")
    @classmethod
    def _init_tiny(cls, v: str | None) -> str | None:
        from factor_cli.policy.presets import TINY_PRESETS  # torch-free

        if v is not None and v not in TINY_PRESETS:
            raise ValueError(f"unknown tiny preset {v!r}; valid: {', '.join(TINY_PRESETS)}")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not DEVICE_PATTERN.match(v):
            raise ValueError("use cpu, cuda, cuda:N or mps")
        return v


class EnvConfig(Strict):
    name: str = Field("twx", description="Environment adapter (see `factor envs list`).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Adapter options, e.g. TWX {params: {coin: ...}}."
    )
    games: list[str] = Field(
        default_factory=list,
        description="Restrict instances to these categories (TWX games, ALFWorld task types...).",
    )
    splits_dir: str | None = Field(
        None, description="Folder of the split manifests (default: the shipped manifests)."
    )
    max_turns: int | None = Field(None, ge=1, description="Turn limit (default: the adapter's).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        from factor_cli.envs import ENVIRONMENTS  # light: engines load when an env starts

        ENVIRONMENTS.get(v)
        return v


class HFConfig(Strict):
    """The hf backend's optimisations (:mod:`factor_cli.policy.generation.hf_options`): each on
    by default, each giving the same replies and log-probs as off within float rounding."""

    prefix_cache_tokens: int | None = Field(
        None, ge=0, description="Bound of the prefix cache in tokens (None: what 1 GiB of KV "
        "holds, at most two full batches of contexts).",
    )  # fmt: skip
    shared_prefix_min: int | None = Field(
        hf_options.SHARED_PREFIX_MIN, ge=1, description="Cascade attention (CPU): attend once "
        "to a stored prefix shared by a whole batch when it has at least this many tokens "
        "(null: never).",
    )  # fmt: skip
    stem_min: int | None = Field(
        hf_options.STEM_MIN, ge=1, description="Shared stems: prefill once, first, what prompts "
        "of a batch share past the cache when it is at least this many tokens (null: never).",
    )  # fmt: skip
    merge_duplicates: bool = Field(
        hf_options.MERGE_DUPLICATES, description="Decode identical prompts of a seeded or "
        "greedy batch in one row while their replies agree.",
    )  # fmt: skip
    skip_forced: bool = Field(
        hf_options.SKIP_FORCED, description="Under valid-action decoding, skip the model for "
        "tokens the action trie forces where no logits are read.",
    )  # fmt: skip


class RolloutConfig(Strict):
    groups: int = Field(16, ge=1, description="Task instances per step (B_traj = groups x k).")
    k: int = Field(8, ge=2, description="Trajectories per instance (group size K).")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature.")
    max_new_tokens: int = Field(
        DEFAULT_MAX_NEW_TOKENS, ge=1, description="Generation limit per reply."
    )
    max_context: int = Field(
        DEFAULT_MAX_CONTEXT, ge=16, description="Context limit (prompt + reply)."
    )
    backend: str = Field("hf", description="Generation backend: hf or vllm.")
    valid_action_decoding: bool = Field(
        False,
        description="Constrain every reply to one of the current admissible actions (a token "
        "trie; log-probs under the constrained distribution). It changes the task: runs are "
        "tagged decoding=constrained.",
    )
    prefix_reuse: bool = Field(
        True,
        description="Reuse the KV of prompt prefixes already encoded (earlier turns, sibling "
        "trajectories, a continuation's root): hf keeps a bounded prefix cache, vllm turns on "
        "automatic prefix caching; the teacher's and the value head's scoring passes encode "
        "each shared prefix of a batch once. Same replies and log-probs (within float "
        "rounding) as off; off is for comparison.",
    )
    hf: HFConfig = Field(
        default_factory=HFConfig, description="The hf backend's optimisations (each a switch)."
    )

    def backend_options(self) -> dict[str, Any]:
        """The chosen backend's own options from this section (hf: ``rollout.hf``)."""
        return {"hf": self.hf.model_dump()}.get(self.backend, {})

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "history_turns" in data:
            raise FieldError(
                "history_turns", "moved: set prompt.history_turns (the prompt.* section)"
            )
        return data

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        from factor_cli.policy.generation.backends import BACKEND_NAMES

        if v not in BACKEND_NAMES:
            raise ValueError(f"unknown generation backend {v!r}; valid: {', '.join(BACKEND_NAMES)}")
        return v

    @model_validator(mode="after")
    def _limits(self) -> RolloutConfig:
        try:  # the backends' own check, so config and generation agree on what is allowed
            GenerationLimits(self.max_new_tokens, self.max_context)
        except ValueError as exc:
            raise FieldError(
                "max_new_tokens",
                f"{exc}; lower rollout.max_new_tokens or raise rollout.max_context",
            ) from None
        return self


class PromptConfig(Strict):
    """How turns are shown to the policy; unset fields take the environment's defaults
    (:class:`~factor_cli.envs.base.EnvSpec` ``role``, ``shows_admissible``), then
    :class:`~factor_cli.policy.prompting.PromptFormat`'s."""

    history_turns: int | None = Field(
        None, ge=0, description="Past (action, observation) pairs shown (default 2)."
    )
    step_counter: bool | None = Field(
        None, description="Show the step number and the actions taken so far (default on)."
    )
    admissible: bool | None = Field(
        None,
        description="List the admissible actions of the current state (default: the env's; "
        "on for twx, alfworld, webshop; off for scienceworld, whose list is thousands long).",
    )
    admissible_max: int | None = Field(
        None, ge=1, description="Admissible actions listed at most (default 50)."
    )
    admissible_max_tokens: int | None = Field(
        None, ge=1, description="Tokens the admissible list may take at most (default 384)."
    )
    think: bool = Field(
        False, description="Invite reasoning inside <think>...</think> before the <action>."
    )
    system: str | None = Field(
        None, description="The whole system text (default: the env's role + the reply rule)."
    )

    @field_validator("system")
    @classmethod
    def _system(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty system text; unset prompt.system for the default")
        return v


class TranscriptConfig(Strict):
    episodes_per_step: int = Field(
        4, ge=0, description="Root episodes of each step written to the run's transcripts."
    )
    eval: bool = Field(True, description="Also write every evaluation episode.")
    records: bool = Field(
        True,
        description="Write every step's per-action and per-continuation numbers (records/, "
        "what `factor diagnose` reads; a few KB per step).",
    )


class ContinuationConfig(Strict):
    """Defaults from :mod:`factor_cli.rollout.continuations`, their one home."""

    budget: int = Field(
        continuations.BUDGET, ge=1, description="B: checkpoints per root trajectory."
    )
    per_checkpoint: int = Field(
        continuations.PER_CHECKPOINT, ge=1, description="M: continuations per checkpoint."
    )
    per_state: int = Field(
        continuations.PER_STATE,
        ge=1,
        description="K: continuations from every state x_t, 0 < t < T, for the methods whose "
        "values are their mean returns (vineppo, factor-mc; VinePPO's K = 9); B, M and support "
        "are FACTOR's value-head budget and do not apply to them.",
    )
    horizon: int = Field(continuations.HORIZON, ge=1, description="Maximum continuation turns.")
    temperature: float = Field(
        continuations.TEMPERATURE, gt=0, description="Continuation sampling temperature."
    )
    support: Literal["paper", "interior"] = Field(
        continuations.SUPPORT,
        description="Checkpoint states: paper (t in 0..T-1, the paper's rule) or interior "
        "(1..T-1: never x_0, whose value is fixed to the baseline).",
    )
    overlap: bool = Field(
        continuations.OVERLAP,
        description="Start a root's continuations as soon as it ends, in the decode batches of "
        "the roots still running (false: after every root has ended; the same episodes, "
        "slower; time_rollout then excludes them).",
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
    head: Literal["mlp", "ridge"] = Field(
        value_defaults.VALUE_HEAD,
        description="mlp: the paper's 2-layer MLP fitted by Adam; ridge: a linear probe on "
        "z-scored features solved in closed form, penalty by 5-fold CV (a scale choice: it "
        "ranks states best at CPU scale, docs/benchmarks.md, Value fitting).",
    )
    standardize: bool = Field(
        value_defaults.VALUE_STANDARDIZE,
        description="Z-score each feature dimension with the replay buffer's mean and standard "
        "deviation before the MLP (refreshed at every fit). A scale change: a small backbone's "
        "states differ by hundredths per dimension (docs/benchmarks.md, Value fitting).",
    )
    features: Literal["boundary", "prompt_mean"] = Field(
        value_defaults.VALUE_FEATURES,
        description="What the head reads of x_t. boundary (the paper's): the last layer's hidden "
        "state at the prompt's last token; prompt_mean: every layer's hidden state (the "
        "embeddings included) averaged over the prompt's tokens, concatenated, (L + 1) x H wide "
        "(a scale choice: a 1M backbone's boundary state carries little of what the text says; "
        "docs/benchmarks.md, Value fitting). One extra forward of the root prompts a step.",
    )
    warmup_rollouts: int = Field(
        value_defaults.VALUE_WARMUP_ROLLOUTS,
        ge=0,
        description="Value warm-up: rollouts of the starting policy, each with its continuations, "
        "whose targets fit the head before the first policy update; the target head then "
        "starts as the fitted online head. 0: none (the paper's head learns during its credit "
        "warm-up steps). Methods without a value head ignore it.",
    )
    warmup_epochs: int = Field(
        value_defaults.VALUE_WARMUP_EPOCHS, ge=1, description="Passes over the warm-up targets."
    )


class OptimConfig(Strict):
    lr: float = Field(5e-7, gt=0, description="Policy Adam learning rate.")
    ppo_epochs: int = Field(1, ge=1, description="PPO epochs per step.")
    minibatches: int = Field(1, ge=1, description="PPO mini-batches per epoch.")
    micro_batch_actions: int = Field(64, ge=1, description="Actions per forward pass.")
    clip_eps: float = Field(PPO_CLIP_EPS, gt=0, description="PPO clip epsilon.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    share_prefixes: bool = Field(
        True,
        description="Encode each prompt prefix that a micro-batch's actions share (system text, "
        "task, earlier turns) once, through the micro-batch's radix tree, and order each "
        "mini-batch's actions by trajectory so micro-batches share most. Same loss and gradients "
        "(within float rounding) as off; off is for comparison. Not applied under ZeRO-3 across "
        "ranks (every forward there is a collective; the tree's count differs per rank).",
    )


class CriticConfig(Strict):
    lr: float = Field(1e-5, gt=0, description="PPO critic Adam learning rate (verl's default).")
    grad_clip: float = Field(1.0, gt=0, description="PPO critic gradient-norm clip.")


class EngineConfig(Strict):
    kind: Literal["deepspeed"] = Field("deepspeed", description="Training engine (DeepSpeed).")
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="ZeRO stage (3 is for GPUs).")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Training precision.")
    offload_optimizer: bool = Field(False, description="ZeRO-Offload the optimizer to CPU.")


class EvalConfig(Strict):
    every: int = Field(0, ge=0, description="Evaluate every N steps (0: only at the end).")
    start: bool = Field(
        True, description="Also evaluate the starting policy (after SFT) on the same items."
    )
    max_items: int | None = Field(None, ge=1, description="Cap on eval instances (None: all).")


class SFTConfig(Strict):
    enabled: bool = Field(False, description="Supervised warm start on gold plays before RL.")
    games: int = Field(200, ge=1, description="Gold plays used.")
    epochs: int = Field(1, ge=1, description="Passes over the gold data.")
    lr: float = Field(3e-3, gt=0, description="Learning rate.")
    batch_size: int = Field(16, ge=1, description="Sequences per step.")
    teacher_examples: bool = Field(
        False,
        description=(
            "Also train on every gold step in the hindsight teacher's format: the student's "
            "prompt with that step's feedback block, rendered by the teacher's own code, so the "
            "model learns that the feedback tells which action was taken (the teacher then has "
            "something to read; `factor model teacher-gap` measures it). False: student "
            "prompts only, as the paper's warm start."
        ),
    )
    hindsight_walks: int = Field(
        0,
        ge=0,
        description=(
            "Also train the teacher's format on this many seeded random walks over train "
            "instances: every step a uniformly drawn admissible action and its own feedback "
            "(teacher examples only; the student never imitates a walk), so the model learns "
            "to name any action from its feedback, not only the gold one. 0: none, as the paper."
        ),
    )


class TrainConfig(Strict):
    study: str = Field("default", description="Study name (ledger tag).")
    method: str = Field("factor", description="Method / ablation name (`factor credit methods`).")
    reduction: str = Field("action-mean", description="Loss reduction of the protocol.")
    steps: int = Field(
        150, ge=1, description="Training steps (a method may scale them: serl-extended 1.25x)."
    )
    seed: int = Field(42, description="Seed of everything stochastic.")
    output_dir: str = Field("runs", description="Where checkpoints and results go.")
    checkpoint_every: int = Field(1, ge=1, description="Write a checkpoint every N steps.")
    checkpoint_keep_every: int | None = Field(
        None,
        ge=1,
        description=(
            "Also keep every N-th step's checkpoint (the two newest are always kept): the "
            "policies `factor diagnose td-sign` replays. None keeps only the two newest."
        ),
    )
    tracking_uri: str | None = Field(None, description="MLflow URI (default: ./ledger sqlite).")
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    continuations: ContinuationConfig = Field(default_factory=ContinuationConfig)
    value: ValueConfig = Field(default_factory=ValueConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    credit: CreditConfig = Field(default_factory=CreditConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    transcripts: TranscriptConfig = Field(default_factory=TranscriptConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)

    @model_validator(mode="after")
    def _credit_names(self) -> TrainConfig:
        # After every field is valid: the credit registries import torch, so a mistake elsewhere
        # answers without paying for it.
        from factor_cli.credit import METHODS, REDUCTIONS

        for field, registry in (("method", METHODS), ("reduction", REDUCTIONS)):
            value = getattr(self, field)
            if value not in registry:
                raise FieldError(
                    field,
                    f"unknown {registry.kind} {value!r}; valid: {', '.join(registry.names())}",
                )
        return self

    @property
    def total_steps(self) -> int:
        from factor_cli.credit import METHODS

        scale = METHODS.get(self.method).steps_scale
        return self.steps if scale is None else math.ceil(scale * self.steps)

    def digest(self) -> str:
        """The config hash: SHA-256 (hex) of the canonical JSON of the resolved configuration.

        Canonical JSON is :func:`factor_cli.ledger.provenance.canonical_json` (keys sorted,
        ``,``/``:`` separators, UTF-8 kept) of ``model_dump(mode="json")``, leaving out only the
        where-to-write fields ``output_dir`` and ``tracking_uri``: the same experiment written
        to another folder or ledger has the same hash, any other change (seed, method, a
        learning rate, a preset's default) gives another. This is the one definition: the
        ledger's ``config_hash`` tag is this value, and studies key their cells on it.
        """
        from factor_cli.ledger.provenance import canonical_json

        where_to_write = {"output_dir", "tracking_uri"}
        text = canonical_json(self.model_dump(mode="json", exclude=where_to_write))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


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
    """A YAML path as given, or the shipped preset called ``source``."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise ConfigError(f"{path}: no such config file")
        if not path.is_file():
            raise ConfigError(f"{path}: is a folder; pass a YAML file or a preset name")
        return path
    folder = presets_dir()
    preset = folder / f"{source}.yaml"
    if not preset.exists():
        names = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(
            f"unknown preset {source!r}; presets: {', '.join(names)} (or a YAML path)"
        )
    return preset


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in ``path``; syntax errors name the file, line and column."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte {exc.start + 1}); save it as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config sections")
    return data


def _blame(loc: tuple[str, ...], path: Path, overrides: list[str]) -> str:
    """Where a bad value came from: the last ``--set`` touching its field, else the file."""
    for item in reversed(overrides):
        key = tuple(item.partition("=")[0].split("."))
        n = min(len(key), len(loc))
        if loc and key[:n] == loc[:n]:
            return f"--set {item}"
    return str(path)


def _validation_error(exc: ValidationError, path: Path, overrides: list[str]) -> ConfigError:
    """The first pydantic error as one line: source, dotted field, message, value."""
    err = exc.errors()[0]
    loc = tuple(str(p) for p in err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):  # a check over a whole section names its own field
        loc = (*loc, *cause.field.split("."))
    where = ".".join(loc)
    if err["type"] == "extra_forbidden":
        msg = "Extra inputs are not permitted (`factor train --help-config` lists every field)"
    else:
        msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    shown = "" if isinstance(value, dict) or not loc else f" (got {value!r})"
    field = f"field {where}: " if where else ""
    return ConfigError(f"{_blame(loc, path, overrides)}: {field}{msg}{shown}")


def load_config(source: str = "smoke", overrides: list[str] | None = None) -> TrainConfig:
    """A preset name or YAML path, plus --set overrides, validated completely into a TrainConfig.

    Raises:
        ConfigError: one line naming the file (and line) or ``--set`` item, the field, the value
            and the fix; nothing has been built or logged yet.
    """
    overrides = list(overrides or [])
    path = resolve_source(source)
    data = apply_overrides(read_yaml(path), overrides)
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, path, overrides) from None
    try:
        check_config(cfg)
    except FieldError as exc:
        where = _blame(tuple(exc.field.split(".")), path, overrides)
        raise ConfigError(f"{where}: field {exc.field}: {exc}") from None
    return cfg


def check_config(cfg: TrainConfig) -> None:
    """What a field cannot check alone: the manifest behind ``env``, the model behind ``model``.

    Raises:
        FieldError: naming the field, the value and the fix.
    """
    _check_env_manifest(cfg.env)
    _check_model(cfg.model, cfg.rollout)
    _check_critic_path(cfg.model.critic_path)


def _check_critic_path(path: str | None) -> None:
    """A critic path must be a model directory (or a hub id), checked before anything loads."""
    from factor_cli.policy.presets import looks_like_path

    if path is None:
        return
    local = Path(path).expanduser()
    if local.is_dir() and (local / "config.json").is_file():
        return
    if local.exists():
        raise FieldError("model.critic_path", f"{local} is not a model directory (no config.json)")
    if looks_like_path(path):
        raise FieldError(
            "model.critic_path",
            f"{path}: no such model directory; point it to a model with the policy's tokenizer "
            "or leave it unset (the critic then copies the policy)",
        )


def _check_env_manifest(env: EnvConfig) -> None:
    from factor_cli.resources import splits_dir
    from factor_cli.splits.manifest import MANIFEST_NAMES, ManifestError, read_manifest

    name = MANIFEST_NAMES.get(env.name)
    if name is None:
        raise FieldError("env.name", f"environment {env.name!r} has no split manifest")
    path = splits_dir(env.splits_dir) / name
    try:
        rows = read_manifest(path)
    except ManifestError as exc:
        raise FieldError("env.splits_dir", str(exc)) from None
    categories = sorted({r.category for r in rows})
    unknown = [g for g in env.games if g not in categories]
    if unknown:
        raise FieldError(
            "env.games",
            f"{', '.join(map(repr, unknown))} not in {path.name}; valid: {', '.join(categories)}",
        )


def _check_model(model: ModelConfig, rollout: RolloutConfig) -> None:
    from factor_cli.policy.presets import TINY_PRESETS, looks_like_path

    local = Path(model.path).expanduser()
    limit: int | None = None
    if local.is_dir() and (local / "config.json").is_file():
        try:
            limit = json.loads((local / "config.json").read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            raise FieldError("model.path", f"{local}/config.json is not valid JSON") from None
    elif local.exists():
        raise FieldError("model.path", f"{local} is not a model directory (it has no config.json)")
    elif model.init_tiny is not None:
        limit = TINY_PRESETS[model.init_tiny].max_position_embeddings
    elif looks_like_path(model.path):
        raise FieldError(
            "model.path",
            f"{model.path}: no such model directory; set model.init_tiny (e.g. 1m) to build a "
            "tiny one there, or point model.path to a model",
        )
    if isinstance(limit, int) and rollout.max_context > limit:
        raise FieldError(
            "rollout.max_context",
            f"{rollout.max_context} exceeds the model's {limit} positions; "
            f"set rollout.max_context <= {limit}",
        )


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
