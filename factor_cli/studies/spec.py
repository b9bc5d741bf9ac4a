"""Study specs: the paper's experiment matrices as declarative YAML (``experiments/studies/``).

A spec is one strict schema (unknown keys are errors)::

    name: ablations                      # the ledger's ``study`` tag of every cell
    title: "Table 4: ablations"          # shown by plan / report
    base: paper                          # preset or YAML every cell starts from (--base)
    envs: [alfworld, webshop, scienceworld]
    seeds: [42, 43, 1337]
    set: {reduction: action-mean}        # overrides applied to every cell
    env_set: {webshop: {env.max_turns: 15}}   # overrides for one env's cells
    rows:                                # a row = a method plus its overrides
      - {name: serl-repro}
      - {name: serl-extended, set: {...}}
      - {name: gigpo, optional: true}    # only run when --rows names it
      - {name: serl-repro, crossed: false}   # not crossed with the axes (a reference row)
    axes:                                # dotted config keys -> values
      reduction: [token-mean, action-mean]
      rollout.temperature: [0.4, 1.0]
    axes_mode: product                   # product | zip | each (one axis at a time)
    exclude: [{row: factor, env: webshop}]   # cells matching every key are left out
    summary: {table: ablation, reference: factor, subject: factor}

The job matrix is rows x axes x envs x seeds (:mod:`factor_cli.studies.matrix`). The
``summary`` says what ``factor study report`` builds: which ``factor stats table`` layout, the
reference method the bootstrap and Delta columns compare to, and whether the table's method
column shows the method or the row name (``by: row``, for sweeps of one method).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from factor_cli.resources import presets_dir
from factor_cli.train.config import ConfigError, read_yaml

STUDIES_DIR = "studies"  # inside experiments/: the shipped specs
SEEDS = (42, 43, 1337)  # the paper's three seeds
PAPER_ENVS = ("alfworld", "webshop", "scienceworld")
AXES_MODES = ("product", "zip", "each")
TABLE_KINDS = ("main", "ablation", "protocol", "budget", "transfer", "none")
Scalar = str | int | float | bool | None
Overrides = dict[str, Any]


class SpecError(ConfigError):
    """A study spec that cannot be used; one line naming the file, the field and the fix."""


def check_envs(envs: list[str]) -> list[str]:
    """``envs`` if every name is a registered environment (light: no engine starts)."""
    from factor_cli.envs import ENVIRONMENTS

    unknown = [e for e in envs if e not in ENVIRONMENTS]
    if unknown:
        raise ValueError(
            f"unknown environment {', '.join(unknown)}; valid: {', '.join(ENVIRONMENTS.names())}"
        )
    return envs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _dotted_keys(value: Overrides, where: str) -> Overrides:
    for key in value:
        if not key or any(not part for part in str(key).split(".")):
            raise ValueError(f"{where} key {key!r} is not a dotted config key like rollout.k")
    return value


class Row(_Strict):
    """One named row of a table: a method and the overrides that make the row."""

    name: str = Field(description="Row label (the ablation's name); also the method by default.")
    method: str | None = Field(None, description="Method (default: the row name).")
    set: Overrides = Field(default_factory=dict, description="Overrides of this row's cells.")
    crossed: bool = Field(True, description="Crossed with the study's axes (false: a reference).")
    optional: bool = Field(False, description="Left out unless --rows names it.")
    envs: list[str] | None = Field(None, description="Only these envs (default: all).")

    @field_validator("set")
    @classmethod
    def _set(cls, v: Overrides) -> Overrides:
        return _dotted_keys(v, "set")

    @field_validator("envs")
    @classmethod
    def _envs(cls, v: list[str] | None) -> list[str] | None:
        return v if v is None else check_envs(v)

    @property
    def method_name(self) -> str:
        return self.method or self.name


class Summary(_Strict):
    """What ``factor study report`` builds from the finished cells."""

    table: Literal["main", "ablation", "protocol", "budget", "transfer", "none"] = "main"
    reference: str = Field("serl-repro", description="Method the bootstrap / Delta refer to.")
    subject: str = Field("factor", description="Method compared with the reference.")
    by: Literal["method", "row"] = Field("method", description="Table rows: method or row name.")
    group_column: str | None = Field(None, description="Study column of protocol/budget/transfer.")


class StudySpec(_Strict):
    """A study: rows x axes x envs x seeds over one base config."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    title: str = ""
    description: str = ""
    base: str = "paper"
    envs: list[str] = Field(default_factory=lambda: list(PAPER_ENVS), min_length=1)
    seeds: list[int] = Field(default_factory=lambda: list(SEEDS), min_length=1)
    set: Overrides = Field(default_factory=dict)
    env_set: dict[str, Overrides] = Field(default_factory=dict)
    rows: list[Row] = Field(min_length=1)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    axes_mode: Literal["product", "zip", "each"] = "product"
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    summary: Summary = Field(default_factory=Summary)

    @field_validator("set")
    @classmethod
    def _set(cls, v: Overrides) -> Overrides:
        return _dotted_keys(v, "set")

    @field_validator("envs")
    @classmethod
    def _envs(cls, v: list[str]) -> list[str]:
        return check_envs(v)

    @field_validator("axes")
    @classmethod
    def _axes(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        _dotted_keys(v, "axes")
        for key, values in v.items():
            if not values:
                raise ValueError(f"axis {key} has no values")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        names = [r.name for r in self.rows]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"row names must be unique; repeated: {', '.join(twice)}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be unique")
        if len(set(self.envs)) != len(self.envs):
            raise ValueError("envs must be unique")
        for row in self.rows:
            outside = [e for e in row.envs or [] if e not in self.envs]
            if outside:
                raise ValueError(
                    f"row {row.name}: envs {', '.join(outside)} are not among the study's envs "
                    f"({', '.join(self.envs)})"
                )
        if self.axes_mode == "zip" and len({len(v) for v in self.axes.values()}) > 1:
            lengths = ", ".join(f"{k}: {len(v)}" for k, v in self.axes.items())
            raise ValueError(f"axes_mode zip needs axes of one length ({lengths})")
        known = {"row", "method", "env", "seed", *self.axes}
        for rule in self.exclude:
            unknown = sorted(set(rule) - known)
            if unknown or not rule:
                raise ValueError(
                    f"exclude rule {rule!r}: keys must be among {', '.join(sorted(known))}"
                )
        return self

    def digest(self) -> str:
        """The spec hash: SHA-256 of the canonical JSON of the spec (the tag ``spec_hash``)."""
        from factor_cli.ledger.provenance import canonical_json

        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()


def studies_dir() -> Path:
    """Folder of the shipped study specs."""
    return presets_dir() / STUDIES_DIR


def shipped_specs() -> list[str]:
    """Names of the shipped study specs."""
    return sorted(p.stem for p in studies_dir().glob("*.yaml"))


def resolve_spec(source: str) -> Path:
    """A spec YAML path as given, or the shipped spec called ``source``."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise SpecError(f"{path}: no such study spec file")
        return path
    shipped = studies_dir() / f"{source}.yaml"
    if not shipped.is_file():
        raise SpecError(
            f"unknown study {source!r}; shipped: {', '.join(shipped_specs())} (or a YAML path)"
        )
    return shipped


def load_spec(source: str) -> tuple[StudySpec, Path]:
    """The validated spec of a shipped name or YAML path, and the file it came from.

    Raises:
        SpecError: one line naming the file, the field and what is wrong.
    """
    path = resolve_spec(source)
    try:
        data = read_yaml(path)
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    try:
        return StudySpec.model_validate(data), path
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (see the schema in factor_cli/studies/spec.py)"
        field = f"field {where}: " if where else ""
        raise SpecError(f"{path}: {field}{msg}") from None
