"""A spec's job matrix: every cell's resolved, validated training config and its key.

Cells are rows x axis points x envs x seeds, in that order, with the spec's exclusions left out.
Axis points are the product of the axes' values (``product``), their i-th values together
(``zip``), or one axis varied at a time from the base (``each``); a row with ``crossed: false``
gets one point, the base. A cell's overrides apply in this order (later wins): ``study=<name>``,
``method``, ``env.name`` (with the base's env-specific ``env.games``/``env.options`` cleared when
the env changes), the spec's ``set``, its ``env_set`` for the env, the row's ``set``, the axis
point, ``seed``, the command line's ``--set``, ``output_dir``. Each cell's config is validated
completely (:func:`factor_cli.train.config.load_config`) before anything runs.

The cell key (:func:`cell_key`) is a hash of the resolved config: cells of two rows that resolve
to one config (a sweep's default value) are one job, listed under both rows.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from factor_cli.train.config import ConfigError, TrainConfig, load_config, resolve_source

from .spec import Overrides, Row, SpecError, StudySpec, check_envs

STUDY_OUTPUT = "studies"  # cells of study S write under <base output_dir>/studies/S/
ENV_SPECIFIC = ("env.games", "env.options")  # meaningless once the env changes


@dataclass(frozen=True)
class Options:
    """What the command line changes in a spec's matrix (``None``: the spec's own)."""

    base: str | None = None
    seeds: Sequence[int] | None = None
    envs: Sequence[str] | None = None
    rows: Sequence[str] | None = None
    overrides: Sequence[str] = ()
    axes: dict[str, list[Any]] | None = None


@dataclass
class Cell:
    """One job of a study: a ``factor train`` of ``config``."""

    key: str  # cell_key() of the resolved config
    serves: list[tuple[str, dict[str, Any]]]  # (row, axis point) pairs resolving to this config
    method: str
    env: str
    seed: int
    overrides: list[str]  # --set items over the base that make this cell
    config: TrainConfig | None = field(repr=False)  # None: invalid here (see error)
    error: str | None = None  # why this cell's config cannot run (e.g. a missing manifest)
    own: list[str] = field(default_factory=list)  # the row's and axis point's overrides only

    @property
    def row(self) -> str:
        return self.serves[0][0]

    @property
    def point(self) -> dict[str, Any]:
        return self.serves[0][1]

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(row for row, _ in self.serves))

    @property
    def variants(self) -> list[str]:
        """Every ``row[axis=value,...]`` this cell stands for (several for a shared default)."""
        return [variant_label(row, point) for row, point in self.serves]

    @property
    def label(self) -> str:
        """``row[axis=value,...]/env/seed``: how plan, status and errors name the cell."""
        return f"{self.variants[0]}/{self.env}/{self.seed}"


def variant_label(row: str, point: dict[str, Any]) -> str:
    """``row`` or ``row[key=value,...]``: a row at one axis point."""
    text = ",".join(f"{k}={override_text(v)}" for k, v in point.items())
    return f"{row}[{text}]" if text else row


@dataclass
class Matrix:
    """A spec expanded: the cells (unique keys, in spec order) and what they came from."""

    spec: StudySpec
    spec_path: Path
    base: str
    cells: list[Cell]
    output_dir: Path  # <base output_dir>/studies/<name>
    tracking_uri: str | None
    overrides: tuple[str, ...] = ()  # the command line's --set, applied to every cell

    @property
    def spec_hash(self) -> str:
        return self.spec.digest()


def override_text(value: Any) -> str:
    """A value as ``--set`` text: YAML flow style, so :func:`load_config` reads it back."""
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, str) and _reads_back(value):
        return value  # plain, as a user would type it: runs/tiny-1m, token-mean
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _reads_back(text: str) -> bool:
    """Whether ``text`` unquoted is read back by YAML as the same string ("on" is not)."""
    try:
        return yaml.safe_load(text) == text
    except yaml.YAMLError:
        return False


def override_items(overrides: Overrides) -> list[str]:
    return [f"{key}={override_text(value)}" for key, value in overrides.items()]


def axis_points(axes: dict[str, list[Any]], mode: str) -> list[dict[str, Any]]:
    """The axis assignments of a crossed row (``[{}]`` with no axes)."""
    if not axes:
        return [{}]
    keys = list(axes)
    if mode == "product":
        return [dict(zip(keys, values)) for values in itertools.product(*axes.values())]
    if mode == "zip":
        return [dict(zip(keys, values)) for values in zip(*axes.values())]
    return [{key: value} for key in keys for value in axes[key]]  # each


def _excluded(rules: list[dict[str, Any]], facts: dict[str, Any]) -> bool:
    def same(a: Any, b: Any) -> bool:
        return a == b or str(a) == str(b)

    return any(all(same(facts.get(k), v) for k, v in rule.items()) for rule in rules)


def _selected_rows(spec: StudySpec, wanted: Sequence[str] | None) -> list[Row]:
    if wanted is None:
        return [r for r in spec.rows if not r.optional]
    names = [r.name for r in spec.rows]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise SpecError(
            f"--rows {', '.join(unknown)}: not a row of study {spec.name}; rows: {', '.join(names)}"
        )
    return [r for r in spec.rows if r.name in wanted]


def _base_output(base: str, overrides: Sequence[str]) -> tuple[Path, str | None, str]:
    """The base config's output folder, ledger URI and env (with the command line's --set)."""
    cfg = load_config(base, list(overrides))
    return Path(cfg.output_dir), cfg.tracking_uri, cfg.env.name


def expand(
    spec: StudySpec,
    spec_path: Path,
    options: Options = Options(),
    on_cell: Callable[[int, int], None] | None = None,
) -> Matrix:
    """Every cell of ``spec`` under ``options``, each config validated.

    A cell whose config does not validate (e.g. an env without a manifest here) is kept with
    its ``error``: ``plan`` shows it, ``run`` refuses to start while one is selected.

    Raises:
        SpecError: a bad option (base, --rows, --axis) or no cells at all.
    """
    base = options.base or spec.base
    try:
        resolve_source(base)
        out, uri, base_env = _base_output(base, options.overrides)
    except ConfigError as exc:
        raise SpecError(f"--base {base}: {exc}") from None
    if options.envs is not None:
        try:
            check_envs(list(options.envs))
        except ValueError as exc:
            raise SpecError(f"--envs: {exc}") from None
    axes = _narrow_axes(spec, options.axes)
    plan = list(_plan(spec, options, axes))
    study_out = out / STUDY_OUTPUT / spec.name
    cells: dict[str, Cell] = {}
    for i, (row, env, seed, point) in enumerate(plan):
        items = _cell_items(spec, row, env, seed, point, base_env, options.overrides)
        items.append(f"output_dir={study_out}")
        cfg, error = _validated(base, items, options.overrides)
        key = cell_key(cfg) if cfg is not None else _unresolved_key(base, items[:-1])
        if key in cells:
            cells[key].serves.append((row.name, point))
        else:
            method = cfg.method if cfg is not None else row.method_name
            serves = [(row.name, point)]
            own = override_items(row.set) + override_items(point)
            cells[key] = Cell(key, serves, method, env, seed, items[:-1], cfg, error, own)
        if on_cell is not None:
            on_cell(i + 1, len(plan))
    if not cells:
        raise SpecError(f"{spec_path}: study {spec.name} has no cells after exclusions / options")
    cell_list = list(cells.values())
    return Matrix(spec, spec_path, base, cell_list, study_out, uri, tuple(options.overrides))


def _narrow_axes(spec: StudySpec, replaced: dict[str, list[Any]] | None) -> dict[str, list[Any]]:
    axes = dict(spec.axes)
    for key, values in (replaced or {}).items():
        if key not in axes:
            raise SpecError(
                f"--axis {key}: study {spec.name} has no such axis; axes: "
                f"{', '.join(axes) or 'none'}"
            )
        axes[key] = list(values)
    return axes


def _plan(spec: StudySpec, options: Options, axes: dict[str, list[Any]]):
    """(row, env, seed, point) of every cell before validation, exclusions left out."""
    envs = list(options.envs) if options.envs is not None else spec.envs
    seeds = list(options.seeds) if options.seeds is not None else spec.seeds
    for row in _selected_rows(spec, options.rows):
        points = axis_points(axes, spec.axes_mode) if row.crossed else [{}]
        for point in points:
            for env in envs:
                if row.envs is not None and env not in row.envs:
                    continue
                for seed in seeds:
                    facts = {"row": row.name, "method": row.method_name, "env": env,
                             "seed": seed, **point}  # fmt: skip
                    if not _excluded(spec.exclude, facts):
                        yield row, env, seed, point


def _cell_items(
    spec: StudySpec,
    row: Row,
    env: str,
    seed: int,
    point: dict[str, Any],
    base_env: str,
    extra: Sequence[str],
) -> list[str]:
    items = [f"study={spec.name}", f"method={row.method_name}", f"env.name={env}"]
    if env != base_env:
        items += [f"{key}={'[]' if key == 'env.games' else '{}'}" for key in ENV_SPECIFIC]
    for layer in (spec.set, spec.env_set.get(env, {}), row.set):
        items += override_items(layer)
    items += [*override_items(point), f"seed={seed}", *extra]
    return items


def _validated(
    base: str, items: list[str], typed: Sequence[str]
) -> tuple[TrainConfig | None, str | None]:
    """The cell's config, or why it cannot be built here (shown by plan, refused by run).

    An error blamed on an override the spec made (not one typed as ``--set``) says so.
    """
    try:
        return load_config(base, items), None
    except ConfigError as exc:
        text = str(exc)
        if text.startswith("--set ") and text[6:].split(":")[0] not in typed:
            text = "the spec's override " + text[6:]
        return None, text


WHERE_TO_WRITE = ("output_dir", "tracking_uri")  # not part of what a cell is


def _sparse(value: Any, default: Any) -> Any:
    """``value`` without the entries equal to ``default`` (recursively, for mappings)."""
    if isinstance(value, dict) and isinstance(default, dict):
        out = {k: _sparse(v, default.get(k)) for k, v in value.items() if v != default.get(k)}
        return out
    return value


@functools.lru_cache(maxsize=1)
def _schema_defaults() -> dict[str, Any]:
    return TrainConfig().model_dump(mode="json", exclude=set(WHERE_TO_WRITE))


def cell_key(cfg: TrainConfig) -> str:
    """The cell key: SHA-256 (hex) of the canonical JSON of the resolved config's fields that
    differ from the schema's defaults (:class:`TrainConfig` with no arguments), leaving out the
    where-to-write fields ``output_dir`` and ``tracking_uri``.

    Unlike the full :meth:`TrainConfig.digest` (the ledger's ``config_hash``), a new config field
    whose default keeps the old behaviour leaves every key, and so every finished cell, as it
    was: upgrading the code does not restart a study. A changed default (the same key, other
    behaviour) shows as a finished cell from another git commit, which ``study run`` warns about
    (``--force`` runs it again).
    """
    from factor_cli.ledger.provenance import canonical_json

    data = cfg.model_dump(mode="json", exclude=set(WHERE_TO_WRITE))
    text = canonical_json(_sparse(data, _schema_defaults()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _unresolved_key(base: str, items: list[str]) -> str:
    """A stable key for a cell whose config does not validate (it never reaches the ledger)."""
    text = json.dumps([base, items])
    return "invalid-" + hashlib.sha256(text.encode()).hexdigest()[:56]


def invalid_cells(matrix: Matrix) -> list[Cell]:
    """The cells that cannot run here, in matrix order."""
    return [c for c in matrix.cells if c.error is not None]
