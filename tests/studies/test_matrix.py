"""Study specs -> job matrices: the shipped specs expand to the paper's tables (issue 11's proof).

The expected matrices are written out below by hand from the paper (Tables 1-5, 10-14, 25) and
the issue, never derived from the code under test: each table lists its variants (a row at one
axis point, labelled ``row[axis=value,...]`` as ``factor study plan`` shows it), the config
values every such cell must resolve to, the envs and the seeds. A cell is one resolved config;
variants that resolve to the same config (a sensitivity sweep's default value) are one cell
serving several variants.

Here (this checkout) WebShop has no split manifest, so its cells come back invalid (``error``
set, ``config`` None) and are never merged; the counts below are written so that they hold with
or without that manifest: variants are counted over ``cell.serves``, valid cells separately.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml

from factor_cli.resources import presets_dir, splits_dir
from factor_cli.splits.manifest import MANIFEST_NAMES
from factor_cli.studies.matrix import Cell, Matrix, Options, cell_key, expand, invalid_cells
from factor_cli.studies.spec import SpecError, load_spec, shipped_specs
from factor_cli.train.config import TrainConfig, load_config

PAPER_ENVS = ("alfworld", "webshop", "scienceworld")
SEEDS = (42, 43, 1337)
ACTION_MEAN = {"reduction": "action-mean"}


@dataclass(frozen=True)
class Table:
    """One paper table's job matrix, written by hand."""

    variants: dict[str, dict[str, Any]]  # label -> dotted config field -> value it must have
    envs: tuple[str, ...]
    seeds: tuple[int, ...]
    cells_total: int  # the issue's count: variants x envs x seeds
    configs_per_env_seed: int  # distinct configs per (env, seed) when the env is valid here
    summary: tuple[str, str]  # (table kind, reference method) of ``factor study report``
    shared: tuple[str, ...] = ()  # variants that are one config (one cell) per env x seed


def _rows(names: list[str], **fields: Any) -> dict[str, dict[str, Any]]:
    return {name: {"method": name, **fields} for name in names}


ABLATION_ROWS = [
    "serl-repro", "serl-uniform", "serl-extended", "serl-actionnorm", "wo-tac", "wo-hta",
    "batch-global-norm", "token-shuffled", "credit-shuffled", "tac-serl-psi", "factor",
]  # fmt: skip
ABLATIONS = _rows(ABLATION_ROWS, reduction="action-mean", steps=150, total_steps=150)
ABLATIONS["serl-extended"]["total_steps"] = 188  # compute-matched SERL (Table 4)

PROTOCOL = {
    f"{method}[reduction={reduction},rollout.temperature={temp}]": {
        "method": method, "reduction": reduction, "rollout.temperature": float(temp)
    }
    for method in ("serl-repro", "factor")
    for reduction in ("token-mean", "action-mean")
    for temp in ("0.4", "1.0")
}  # fmt: skip

BUDGETS = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (3, 4), (4, 4)]  # Tables 5 and 10 (B, M)
BUDGET = {
    f"factor[continuations.budget={b},continuations.per_checkpoint={m}]": {
        "method": "factor", "continuations.budget": b, "continuations.per_checkpoint": m,
        **ACTION_MEAN,
    }
    for b, m in BUDGETS
}  # fmt: skip
# The reference is not crossed with the budget axes: the paper preset's B = 2, M = 4.
BUDGET["serl-repro"] = {"method": "serl-repro", "continuations.budget": 2,
                        "continuations.per_checkpoint": 4, **ACTION_MEAN}  # fmt: skip

# Tables 11-14, one axis at a time from the defaults eta_0 0.7, tau 1.0, d 3.0, W 10.
SENSITIVITY_VALUES = {
    "credit.eta_0": ["0.0", "0.3", "0.5", "0.7", "0.9", "1.0"],
    "credit.tau": ["0.1", "0.3", "0.5", "1.0", "2.0", "5.0"],
    "credit.d": ["1.0", "2.0", "3.0", "5.0", ".inf"],
    "credit.warmup_steps": ["0", "5", "10", "20", "30"],
}
SENSITIVITY_DEFAULTS = {"credit.eta_0": 0.7, "credit.tau": 1.0, "credit.d": 3.0,
                        "credit.warmup_steps": 10}  # fmt: skip
SENSITIVITY = {
    f"factor[{axis}={text}]": {
        "method": "factor", **ACTION_MEAN, **SENSITIVITY_DEFAULTS, axis: yaml.safe_load(text)
    }
    for axis, texts in SENSITIVITY_VALUES.items()
    for text in texts
}  # fmt: skip
SENSITIVITY_SHARED = ("factor[credit.eta_0=0.7]", "factor[credit.tau=1.0]",
                      "factor[credit.d=3.0]", "factor[credit.warmup_steps=10]")  # fmt: skip

BACKBONES = ("Qwen/Qwen2.5-14B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")  # Table 3
TRANSFER = {
    f"{method}[model.path={path}]": {"method": method, "model.path": path, **ACTION_MEAN}
    for method in ("serl-repro", "factor")
    for path in BACKBONES
}

# Table 1's recipe (Section 4.1): Qwen2.5-7B, 150 steps, action-mean; the other tables' default
# rows are checked to be these very runs (test_default_rows_are_table_1s_runs).
TABLE_1 = {"model.path": "Qwen/Qwen2.5-7B-Instruct", "steps": 150, "rollout.temperature": 1.0,
           "continuations.budget": 2, "continuations.per_checkpoint": 4, **ACTION_MEAN}  # fmt: skip

TABLES = {
    "main": Table(_rows(["grpo", "serl-repro", "factor"], **TABLE_1), PAPER_ENVS, SEEDS,
                  27, 3, ("main", "serl-repro")),
    "ablations": Table(ABLATIONS, PAPER_ENVS, SEEDS, 99, 11, ("ablation", "factor")),
    "protocol": Table(PROTOCOL, PAPER_ENVS, SEEDS, 72, 8, ("protocol", "serl-repro")),
    "budget": Table(BUDGET, PAPER_ENVS, (42,), 24, 8, ("budget", "serl-repro")),
    "sensitivity": Table(SENSITIVITY, PAPER_ENVS, (42,), 66, 19, ("ablation", "factor"),
                         SENSITIVITY_SHARED),
    "estimators": Table(
        _rows(["factor", "td-3", "td-5", "gae-0.9", "gae-0.95", "mc"], **ACTION_MEAN),
        ("alfworld", "scienceworld"), (42,), 12, 6, ("ablation", "factor"),
    ),
    "transfer": Table(TRANSFER, PAPER_ENVS, SEEDS, 36, 4, ("transfer", "serl-repro")),
}  # fmt: skip


def has_manifest(env: str) -> bool:
    """Whether this checkout has ``env``'s split manifest (a cell of an env without is invalid)."""
    return (splits_dir() / MANIFEST_NAMES[env]).is_file()


@cache
def paper_matrix(name: str) -> Matrix:
    """The shipped spec ``name`` at its own base (``paper``), expanded once per test session."""
    spec, path = load_spec(name)
    return expand(spec, path)


def value(cfg: TrainConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def served(matrix: Matrix) -> list[tuple[str, str, int]]:
    """(variant, env, seed) of every variant every cell serves."""
    return [(v, c.env, c.seed) for c in matrix.cells for v in c.variants]


# --- the shipped specs are the paper's tables ---------------------------------------------------


def test_shipped_specs_are_the_papers_studies_and_ci() -> None:
    assert shipped_specs() == sorted(
        [*TABLES, "ci", "mini", "mini-cooking", "distill", "distill-coin", "value-levers",
         "value-features", "mini2", "value-states"]
    )  # fmt: skip


def test_mini_replication_fixes_its_protocol() -> None:
    """Issue 29's study: 3 methods x 2 horizons (rooms and turn limit zipped) x 5 seeds on the
    smoke base, the paper's B = 2, M = 4, every cell valid."""
    spec, path = load_spec("mini")
    matrix = expand(spec, path)
    assert len(matrix.cells) == 30 and all(c.error is None for c in matrix.cells)
    seen = Counter()
    for cell in matrix.cells:
        cfg = cell.config
        rooms = cfg.env.options["params"]["coin"].split(",")[0]
        seen[(cfg.method, rooms, cfg.env.max_turns)] += 1
        assert (cfg.continuations.budget, cfg.continuations.per_checkpoint) == (2, 4)
        assert (cfg.steps, cfg.eval.max_items, cfg.reduction) == (12, 100, "action-mean")
        assert cfg.checkpoint_keep_every == 4  # td-sign replays steps 4 and 8's policies
    assert seen == {
        (m, rooms, turns): 5
        for m in ("grpo", "serl-repro", "factor")
        for rooms, turns in (("numLocations=3", 6), ("numLocations=6", 12))
    }


def test_the_second_mini_replication_fixes_its_protocol() -> None:
    """Issue 39's study: seven rows x three zipped horizons; the broadcast baselines and FACTOR
    on seeds 1-5, the ablations and the Monte-Carlo rows on 1-3, factor-mc not at eleven rooms;
    continuations to the episode's end, the paper's B = 2, M = 4 and K = 9."""
    spec, path = load_spec("mini2")
    matrix = expand(spec, path)
    assert all(c.error is None for c in matrix.cells)
    seen = Counter()
    for cell in matrix.cells:
        cfg = cell.config
        rooms = int(cfg.env.options["params"]["coin"].split(",")[0].split("=")[1])
        assert (rooms, cfg.env.max_turns) in ((3, 6), (6, 12), (11, 24))
        seen[(cfg.method, cfg.env.max_turns)] += 1
        assert cfg.seed in ((1, 2, 3, 4, 5) if cfg.method in ("grpo", "serl-repro", "factor")
                            else (1, 2, 3))  # fmt: skip
        assert (cfg.continuations.budget, cfg.continuations.per_checkpoint) == (2, 4)
        assert (cfg.continuations.per_state, cfg.continuations.horizon) == (9, 24)
        assert (cfg.steps, cfg.eval.max_items, cfg.reduction) == (12, 100, "action-mean")
        assert cfg.checkpoint_keep_every == 4
    expected = {(m, t): 5 for m in ("grpo", "serl-repro", "factor") for t in (6, 12, 24)}
    expected |= {(m, t): 3 for m in ("wo-tac", "wo-hta", "vineppo") for t in (6, 12, 24)}
    expected |= {("factor-mc", 6): 3, ("factor-mc", 12): 3}
    assert seen == expected and len(matrix.cells) == 78


@pytest.mark.parametrize("name", TABLES)
def test_table_counts_are_the_issues(name: str) -> None:
    """The hand-written tables themselves multiply out to the issue's counts."""
    table = TABLES[name]
    assert len(table.variants) * len(table.envs) * len(table.seeds) == table.cells_total


@pytest.mark.parametrize("name", TABLES)
def test_spec_expands_to_the_papers_variants(name: str) -> None:
    table = TABLES[name]
    matrix = paper_matrix(name)
    expected = list(product(table.variants, table.envs, table.seeds))
    assert Counter(served(matrix)) == Counter(expected)
    assert sum(len(c.serves) for c in matrix.cells) == table.cells_total
    assert (matrix.spec.summary.table, matrix.spec.summary.reference) == table.summary


@pytest.mark.parametrize("name", TABLES)
def test_cells_come_in_row_axis_env_seed_order(name: str) -> None:
    """rows x axis points x envs x seeds; a shared cell sits where its first variant is."""
    table = TABLES[name]
    matrix = paper_matrix(name)
    firsts = [v for v in table.variants if v not in table.shared[1:]]
    expected = [(v, e, s) for v, e, s in product(firsts, table.envs, table.seeds)]
    assert [(c.variants[0], c.env, c.seed) for c in matrix.cells if c.config is not None] == [
        (v, e, s) for v, e, s in expected if has_manifest(e)
    ]


@pytest.mark.parametrize("name", TABLES)
def test_valid_and_invalid_cell_counts(name: str) -> None:
    """Valid envs: one cell per distinct config; an env without a manifest: one per variant."""
    table = TABLES[name]
    cells = paper_matrix(name).cells
    valid_envs = [e for e in table.envs if has_manifest(e)]
    invalid_envs = [e for e in table.envs if not has_manifest(e)]
    n_seeds = len(table.seeds)
    assert len([c for c in cells if c.config is not None]) == (
        table.configs_per_env_seed * len(valid_envs) * n_seeds
    )
    assert (
        len(invalid_cells(paper_matrix(name))) == len(table.variants) * len(invalid_envs) * n_seeds
    )
    assert all(len(c.serves) == 1 for c in cells if c.config is None)


@pytest.mark.parametrize("name", TABLES)
def test_every_cell_resolves_to_its_variant(name: str) -> None:
    table = TABLES[name]
    matrix = paper_matrix(name)
    for cell in (c for c in matrix.cells if c.config is not None):
        cfg = cell.config
        assert cell.error is None
        assert (cfg.study, cfg.env.name, cfg.seed, cfg.method) == (
            name,
            cell.env,
            cell.seed,
            cell.method,
        )
        assert cell.key == cell_key(cfg)
        assert cfg.output_dir == str(matrix.output_dir)
        assert matrix.output_dir.parts[-2:] == ("studies", name)
        for variant in cell.variants:
            for dotted, want in table.variants[variant].items():
                assert value(cfg, dotted) == want, (cell.label, variant, dotted)


@pytest.mark.parametrize("name", TABLES)
def test_cell_keys_are_unique(name: str) -> None:
    keys = [c.key for c in paper_matrix(name).cells]
    assert len(set(keys)) == len(keys)


def test_sensitivity_defaults_are_one_cell_per_env() -> None:
    """The four sweeps' default points (eta_0 0.7, tau 1, d 3, W 10) are one job, not four."""
    cells = paper_matrix("sensitivity").cells
    valid_envs = [e for e in PAPER_ENVS if has_manifest(e)]
    assert valid_envs
    for env in valid_envs:
        shared = [c for c in cells if c.env == env and len(c.serves) > 1]
        assert len(shared) == 1
        assert shared[0].variants == list(SENSITIVITY_SHARED)
        assert shared[0].rows == ("factor",)


@pytest.mark.skipif(has_manifest("webshop"), reason="this checkout has a WebShop manifest")
@pytest.mark.parametrize("name", [n for n, t in TABLES.items() if "webshop" in t.envs])
def test_webshop_cells_say_the_manifest_is_missing(name: str) -> None:
    webshop = [c for c in paper_matrix(name).cells if c.env == "webshop"]
    assert webshop
    for cell in webshop:
        assert cell.config is None
        assert "manifest" in cell.error and "webshop_ids.csv" in cell.error
        assert "\n" not in cell.error
        assert cell.key.startswith("invalid-")


def _same_run(a: Cell, b: Cell, *, fields: tuple[str, ...] = ()) -> bool:
    """Whether two cells are the same training run apart from the study tag and ``fields``."""

    def dump(cell: Cell) -> dict[str, Any]:
        data = cell.config.model_dump(mode="json", exclude={"study", "output_dir"})
        for dotted in fields:
            *parents, leaf = dotted.split(".")
            node = data
            for part in parents:
                node = node[part]
            del node[leaf]
        return data

    return dump(a) == dump(b)


def _main_cell(method: str, env: str, seed: int) -> Cell:
    (cell,) = [
        c for c in paper_matrix("main").cells if (c.method, c.env, c.seed) == (method, env, seed)
    ]
    return cell


def _valid(name: str, keep: Callable[[Cell], bool]) -> list[Cell]:
    return [c for c in paper_matrix(name).cells if c.config is not None and keep(c)]


def test_transfer_freezes_the_7b_settings() -> None:
    """Table 3: only the backbone differs from the Table 1 run of the same method/env/seed."""
    cells = _valid("transfer", lambda c: True)
    assert cells
    for cell in cells:
        assert _same_run(cell, _main_cell(cell.method, cell.env, cell.seed), fields=("model.path",))


@pytest.mark.parametrize(
    ("name", "keep"),
    [
        ("ablations", lambda c: c.method in ("serl-repro", "factor")),
        ("protocol", lambda c: c.point == {"reduction": "action-mean", "rollout.temperature": 1.0}),
        ("budget", lambda c: c.point in ({}, {"continuations.budget": 2,
                                              "continuations.per_checkpoint": 4})),
        ("sensitivity", lambda c: len(c.serves) == 4),
        ("estimators", lambda c: c.method == "factor"),
    ],
)  # fmt: skip
def test_default_rows_are_table_1s_runs(name: str, keep: Callable[[Cell], bool]) -> None:
    """The tables share Table 1's recipe: their default rows are its runs up to the study tag."""
    cells = _valid(name, keep)
    assert cells
    for cell in cells:
        assert _same_run(cell, _main_cell(cell.method, cell.env, cell.seed))


def test_main_context_rows_only_when_named() -> None:
    spec, path = load_spec("main")
    assert not {"ppo", "gigpo", "hgpo"} & {c.method for c in paper_matrix("main").cells}
    rows = ["grpo", "serl-repro", "factor", "ppo", "gigpo", "hgpo"]
    matrix = expand(spec, path, Options(rows=rows, envs=["alfworld"]))
    assert [c.row for c in matrix.cells] == [r for r in rows for _ in SEEDS]
    assert {c.config.method for c in matrix.cells} == set(rows)


# --- command-line options -----------------------------------------------------------------------

SMOKE_TWX = {"base": "smoke", "envs": ["twx"], "seeds": [42]}


def smoke(name: str, **options: Any) -> Matrix:
    spec, path = load_spec(name)
    return expand(spec, path, Options(**{**SMOKE_TWX, **options}))


def test_ablate_smoke_is_eleven_cells_at_cpu_scale() -> None:
    matrix = smoke("ablations")
    smoke_steps = load_config("smoke").steps
    assert [c.label for c in matrix.cells] == [f"{row}/twx/42" for row in ABLATION_ROWS]
    for cell in matrix.cells:
        cfg = cell.config
        assert cell.error is None
        assert (cfg.study, cfg.method, cfg.reduction) == ("ablations", cell.row, "action-mean")
        assert (cfg.model.path, cfg.model.init_tiny, cfg.model.device) == (
            "runs/tiny-1m",
            "1m",
            "cpu",
        )
        assert (cfg.env.name, cfg.env.games, cfg.steps) == ("twx", ["coin"], smoke_steps)
    assert matrix.base == "smoke"


def test_rows_narrow_the_matrix_in_spec_order() -> None:
    matrix = smoke("ablations", rows=["factor", "wo-tac", "serl-repro"])
    assert [c.row for c in matrix.cells] == ["serl-repro", "wo-tac", "factor"]


def test_seeds_and_envs_narrow_the_matrix() -> None:
    spec, path = load_spec("protocol")
    matrix = expand(spec, path, Options(envs=["scienceworld"], seeds=[43]))
    assert [(c.env, c.seed) for c in matrix.cells] == [("scienceworld", 43)] * 8
    assert [c.variants[0] for c in matrix.cells] == list(PROTOCOL)


def test_unknown_row_is_one_line_listing_the_rows() -> None:
    with pytest.raises(SpecError) as info:
        smoke("ablations", rows=["factor", "wo-nothing"])
    message = str(info.value)
    assert "\n" not in message
    assert "wo-nothing" in message and "ablations" in message
    assert all(row in message for row in ABLATION_ROWS)


def test_axis_option_replaces_an_axis() -> None:
    spec, path = load_spec("transfer")
    models = ["org/model-a", "org/model-b", "org/model-c"]
    matrix = expand(spec, path, Options(envs=["alfworld"], seeds=[42], axes={"model.path": models}))
    expected = [f"{m}[model.path={p}]" for m in ("serl-repro", "factor") for p in models]
    assert [c.variants[0] for c in matrix.cells] == expected
    assert [c.config.model.path for c in matrix.cells] == models * 2


def test_unknown_axis_is_one_line_naming_it() -> None:
    spec, path = load_spec("transfer")
    with pytest.raises(SpecError) as info:
        expand(spec, path, Options(axes={"model.name": ["x"]}))
    message = str(info.value)
    assert "\n" not in message
    assert "model.name" in message and "model.path" in message


def test_overrides_apply_to_every_cell_and_win() -> None:
    """--set comes last: over the spec's set and its axes (here the protocol's reduction)."""
    matrix = smoke("protocol", overrides=["optim.lr=2e-4", "reduction=token-mean"])
    assert sum(len(c.serves) for c in matrix.cells) == 8
    for cell in matrix.cells:
        assert cell.config.optim.lr == 2e-4
        assert cell.config.reduction == "token-mean"
        assert cell.overrides[-2:] == ["optim.lr=2e-4", "reduction=token-mean"]
    # The reduction axis collapses: each (method, temperature) is one cell serving both points.
    assert len(matrix.cells) == 4


def test_env_change_clears_the_bases_env_games() -> None:
    """The smoke base's ``env.games: [coin]`` is TWX's; an ALFWorld cell must not inherit it."""
    matrix = smoke("main", envs=["alfworld", "twx"])
    games = {(c.env, tuple(c.config.env.games)) for c in matrix.cells}
    assert games == {("alfworld", ()), ("twx", ("coin",))}
    assert all(c.error is None for c in matrix.cells)


def test_env_change_clears_the_bases_env_options(tmp_path: Path) -> None:
    """A base's adapter options belong to its env; the base's own env keeps them."""
    data = yaml.safe_load((presets_dir() / "smoke.yaml").read_text())
    data["env"]["options"] = {"params": {"coin": "numLocations=3"}}
    base = tmp_path / "smoke-options.yaml"
    base.write_text(yaml.safe_dump(data))
    matrix = smoke("main", base=str(base), envs=["alfworld", "twx"])
    options = {(c.env, str(c.config.env.options)) for c in matrix.cells}
    assert options == {("alfworld", "{}"), ("twx", str(data["env"]["options"]))}
    assert all(c.error is None for c in matrix.cells)


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ({"base": "no-such-preset"}, ["--base no-such-preset", "paper", "smoke"]),
        ({"overrides": ["optim.lr=0"]}, ["--set optim.lr=0", "optim.lr"]),
        ({"overrides": ["optim.lr"]}, ["optim.lr", "KEY=VALUE"]),
    ],
)
def test_bad_base_or_set_is_one_line(options: dict[str, Any], fragments: list[str]) -> None:
    spec, path = load_spec("ablations")
    with pytest.raises(SpecError) as info:
        expand(spec, path, Options(**options))
    message = str(info.value)
    assert "\n" not in message
    assert all(f in message for f in fragments), message


def test_no_cells_left_names_the_spec_file() -> None:
    spec, path = load_spec("ablations")
    with pytest.raises(SpecError) as info:
        expand(spec, path, Options(envs=[]))
    assert str(info.value).startswith(f"{path}:")
    assert "\n" not in str(info.value)


# --- custom specs: axes modes, reference rows, exclusions, invalid cells ------------------------


def write_spec(tmp_path: Path, body: str, name: str = "study.yaml") -> tuple[Any, Path]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return load_spec(str(path))


HEADER = """\
    name: custom
    base: smoke
    envs: [twx]
    seeds: [42, 43]
    rows:
      - {name: factor}
      - {name: ref, method: serl-repro, crossed: false}
    axes:
      rollout.k: [2, 3]
      rollout.temperature: [0.5, 0.8]
"""


def labels(matrix: Matrix) -> list[str]:
    return [c.label for c in matrix.cells]


AXES_MODES = {
    "product": [
        "factor[rollout.k=2,rollout.temperature=0.5]/twx/42",
        "factor[rollout.k=2,rollout.temperature=0.5]/twx/43",
        "factor[rollout.k=2,rollout.temperature=0.8]/twx/42",
        "factor[rollout.k=2,rollout.temperature=0.8]/twx/43",
        "factor[rollout.k=3,rollout.temperature=0.5]/twx/42",
        "factor[rollout.k=3,rollout.temperature=0.5]/twx/43",
        "factor[rollout.k=3,rollout.temperature=0.8]/twx/42",
        "factor[rollout.k=3,rollout.temperature=0.8]/twx/43",
        "ref/twx/42",
        "ref/twx/43",
    ],
    "zip": [
        "factor[rollout.k=2,rollout.temperature=0.5]/twx/42",
        "factor[rollout.k=2,rollout.temperature=0.5]/twx/43",
        "factor[rollout.k=3,rollout.temperature=0.8]/twx/42",
        "factor[rollout.k=3,rollout.temperature=0.8]/twx/43",
        "ref/twx/42",
        "ref/twx/43",
    ],
    "each": [
        "factor[rollout.k=2]/twx/42",
        "factor[rollout.k=2]/twx/43",
        "factor[rollout.k=3]/twx/42",
        "factor[rollout.k=3]/twx/43",
        "factor[rollout.temperature=0.5]/twx/42",
        "factor[rollout.temperature=0.5]/twx/43",
        "factor[rollout.temperature=0.8]/twx/42",
        "factor[rollout.temperature=0.8]/twx/43",
        "ref/twx/42",
        "ref/twx/43",
    ],
}


@pytest.mark.parametrize("mode", AXES_MODES)
def test_axes_modes(tmp_path: Path, mode: str) -> None:
    spec, path = write_spec(tmp_path, HEADER + f"    axes_mode: {mode}\n")
    matrix = expand(spec, path)
    assert labels(matrix) == AXES_MODES[mode]
    for cell in matrix.cells:
        for key, want in cell.point.items():
            assert value(cell.config, key) == want
    smoke_k, smoke_temperature = 4, 1.0  # the reference row stays at the base's values
    refs = [c.config for c in matrix.cells if c.row == "ref"]
    assert {(c.method, c.rollout.k, c.rollout.temperature) for c in refs} == {
        ("serl-repro", smoke_k, smoke_temperature)
    }


def test_each_mode_merges_points_equal_to_the_base(tmp_path: Path) -> None:
    """Smoke's k = 4 and temperature 1.0 are the same config: one cell serving both variants."""
    spec, path = write_spec(
        tmp_path,
        """\
        name: merged
        base: smoke
        envs: [twx]
        seeds: [42]
        rows: [{name: factor}]
        axes: {rollout.k: [2, 4], rollout.temperature: [1.0, 0.5]}
        axes_mode: each
        """,
    )
    matrix = expand(spec, path)
    assert [c.variants for c in matrix.cells] == [
        ["factor[rollout.k=2]"],
        ["factor[rollout.k=4]", "factor[rollout.temperature=1.0]"],
        ["factor[rollout.temperature=0.5]"],
    ]


def test_two_rows_of_one_config_are_one_cell(tmp_path: Path) -> None:
    spec, path = write_spec(
        tmp_path,
        """\
        name: twins
        base: smoke
        envs: [twx]
        seeds: [42]
        rows: [{name: a, method: grpo}, {name: b, method: grpo}, {name: c, method: factor}]
        """,
    )
    matrix = expand(spec, path)
    assert [(c.rows, c.method) for c in matrix.cells] == [(("a", "b"), "grpo"), (("c",), "factor")]


def test_exclusions_remove_matching_cells(tmp_path: Path) -> None:
    """A rule drops the cells matching all its keys (row, method, env, seed, an axis value)."""
    spec, path = write_spec(
        tmp_path,
        HEADER
        + """\
    axes_mode: product
    exclude:
      - {row: ref, seed: 43}
      - {rollout.k: 3, rollout.temperature: 0.8}
      - {method: factor, seed: 42, rollout.temperature: 0.5}
""",
    )
    assert labels(expand(spec, path)) == [
        "factor[rollout.k=2,rollout.temperature=0.5]/twx/43",
        "factor[rollout.k=2,rollout.temperature=0.8]/twx/42",
        "factor[rollout.k=2,rollout.temperature=0.8]/twx/43",
        "factor[rollout.k=3,rollout.temperature=0.5]/twx/43",
        "ref/twx/42",
    ]


def test_exclusions_by_env_and_row_envs(tmp_path: Path) -> None:
    spec, path = write_spec(
        tmp_path,
        """\
        name: envs
        base: smoke
        envs: [twx, alfworld, scienceworld]
        seeds: [42]
        rows:
          - {name: factor}
          - {name: grpo, envs: [twx]}
        exclude: [{row: factor, env: alfworld}]
        """,
    )
    assert labels(expand(spec, path)) == ["factor/twx/42", "factor/scienceworld/42", "grpo/twx/42"]


def test_set_env_set_and_row_set_layer_in_order(tmp_path: Path) -> None:
    """spec set < env_set of the cell's env < row set < seed."""
    spec, path = write_spec(
        tmp_path,
        """\
        name: layers
        base: smoke
        envs: [twx, alfworld]
        seeds: [7]
        set: {optim.lr: 1.0e-3, rollout.k: 3}
        env_set: {alfworld: {rollout.k: 5, env.max_turns: 30}}
        rows:
          - {name: factor}
          - {name: fast, method: factor, set: {optim.lr: 2.0e-3, rollout.k: 6}}
        """,
    )
    got = {(c.row, c.env): c.config for c in expand(spec, path).cells}
    summary = {
        key: (cfg.optim.lr, cfg.rollout.k, cfg.env.max_turns, cfg.seed) for key, cfg in got.items()
    }
    turns = load_config("smoke").env.max_turns  # the base's, where no layer sets it
    assert summary == {
        ("factor", "twx"): (1e-3, 3, turns, 7),
        ("factor", "alfworld"): (1e-3, 5, 30, 7),
        ("fast", "twx"): (2e-3, 6, turns, 7),
        ("fast", "alfworld"): (2e-3, 6, 30, 7),
    }


@pytest.mark.parametrize(
    ("row_set", "field"),
    [("{credit.eta_0: -1}", "credit.eta_0"), ("{optim.lr: 0}", "optim.lr")],
)
def test_bad_config_value_in_a_row_is_a_cell_error(
    tmp_path: Path, row_set: str, field: str
) -> None:
    """The matrix still expands; the bad row's cells carry a one-line error naming the field."""
    spec, path = write_spec(
        tmp_path,
        f"""\
        name: bad-row
        base: smoke
        envs: [twx]
        seeds: [42, 43]
        rows:
          - {{name: grpo}}
          - {{name: broken, method: factor, set: {row_set}}}
        """,
    )
    matrix = expand(spec, path)
    assert [c.label for c in invalid_cells(matrix)] == ["broken/twx/42", "broken/twx/43"]
    for cell in invalid_cells(matrix):
        assert cell.config is None
        assert field in cell.error and "\n" not in cell.error
    assert [c.error for c in matrix.cells if c.row == "grpo"] == [None, None]


def test_missing_manifest_cells_are_invalid_and_never_merged(tmp_path: Path) -> None:
    """Two variants of an env without a manifest stay two cells (their configs are unknown)."""
    empty = tmp_path / "no-splits"
    empty.mkdir()
    spec, path = write_spec(
        tmp_path,
        f"""\
        name: nomanifest
        base: smoke
        envs: [twx, alfworld]
        seeds: [42]
        env_set: {{alfworld: {{env.splits_dir: {empty}}}}}
        rows: [{{name: factor}}]
        axes: {{rollout.k: [2, 4], rollout.temperature: [1.0]}}
        axes_mode: each
        """,
    )
    matrix = expand(spec, path)
    assert [(c.env, len(c.serves), c.error is None) for c in matrix.cells] == [
        ("twx", 1, True), ("alfworld", 1, False), ("twx", 2, True),
        ("alfworld", 1, False), ("alfworld", 1, False),
    ]  # fmt: skip
    for cell in invalid_cells(matrix):
        assert "manifest" in cell.error and str(empty) in cell.error


@pytest.mark.parametrize("path_value", ["runs/model #2", "on"])
def test_string_values_reach_the_config_unchanged(tmp_path: Path, path_value: str) -> None:
    spec, path = write_spec(
        tmp_path,
        f"""\
        name: strings
        base: smoke
        envs: [twx]
        seeds: [42]
        rows: [{{name: factor, set: {{model.path: {path_value!r}}}}}]
        """,
    )
    (cell,) = expand(spec, path).cells
    assert cell.error is None
    assert cell.config.model.path == path_value


def test_the_second_look_fixes_its_protocol() -> None:
    """Issue 29's second look: mini's protocol on cookingworld at one horizon, three seeds."""
    spec, path = load_spec("mini-cooking")
    matrix = expand(spec, path)
    assert len(matrix.cells) == 9 and all(c.error is None for c in matrix.cells)
    assert Counter(c.config.method for c in matrix.cells) == {
        "grpo": 3, "serl-repro": 3, "factor": 3,
    }  # fmt: skip
    for cell in matrix.cells:
        cfg = cell.config
        assert cfg.env.games == ["cookingworld"] and cfg.env.max_turns == 12
        assert (cfg.continuations.budget, cfg.continuations.per_checkpoint) == (2, 4)
        assert (cfg.steps, cfg.eval.max_items, cfg.checkpoint_keep_every) == (12, 100, 4)


@pytest.mark.parametrize("name", ["distill", "distill-coin"])
def test_the_distillation_study_fixes_its_protocol(name: str) -> None:
    """Issue 38's study: mini's cells (cookingworld, or coin with six rooms) with and without
    the action-KL loss (lambda_k = 0 and nothing else changed), GRPO beside, seeds 1-3."""
    spec, path = load_spec(name)
    matrix = expand(spec, path)
    assert len(matrix.cells) == 15 and all(c.error is None for c in matrix.cells)
    kl = Counter((c.config.method, c.config.credit.kl_0 != 0.0) for c in matrix.cells)
    assert kl == {
        ("grpo", True): 3, ("serl-repro", True): 3, ("serl-repro", False): 3,
        ("factor", True): 3, ("factor", False): 3,
    }  # fmt: skip
    games = ["cookingworld"] if name == "distill" else ["coin"]
    for cell in matrix.cells:
        cfg = cell.config
        assert cfg.env.games == games and cfg.env.max_turns == 12
        assert (cfg.continuations.budget, cfg.continuations.per_checkpoint) == (2, 4)
        assert (cfg.steps, cfg.eval.max_items, cfg.checkpoint_keep_every) == (12, 100, 4)
        assert cfg.seed in (1, 2, 3)


def test_the_value_levers_study_is_the_main_job_with_two_levers() -> None:
    """Issue 37's ten-seed check: the smoke preset as shipped against the same config with the
    value warm-up and full-length continuations, and nothing else changed, seeds 1-10."""
    spec, path = load_spec("value-levers")
    matrix = expand(spec, path)
    assert len(matrix.cells) == 20 and all(c.error is None for c in matrix.cells)
    by_row = {}
    for cell in matrix.cells:
        cfg = cell.config
        assert cfg.method == "factor" and cfg.seed in range(1, 11)
        assert (cfg.steps, cfg.env.max_turns, cfg.checkpoint_keep_every) == (12, 12, 4)
        levers = (cfg.value.warmup_rollouts, cfg.continuations.horizon)
        by_row.setdefault(levers, []).append(cfg.model_dump(exclude={"seed"}, mode="json"))
    assert sorted(by_row) == [(0, 6), (8, 12)]
    assert all(len(v) == 10 for v in by_row.values())
    shipped, levered = (by_row[k][0] for k in sorted(by_row))
    levered["value"]["warmup_rollouts"], levered["continuations"]["horizon"] = 0, 6
    assert levered == shipped


def test_the_value_features_study_changes_only_the_value_settings() -> None:
    """The prompt-reading value head against the shipped preset, seeds 1-10: the two rows differ
    in the five settings the spec names and nothing else."""
    spec, path = load_spec("value-features")
    matrix = expand(spec, path)
    assert len(matrix.cells) == 20 and all(c.error is None for c in matrix.cells)
    rows: dict[str, list[dict]] = {}
    for cell in matrix.cells:
        cfg = cell.config
        assert cfg.method == "factor" and cfg.seed in range(1, 11)
        assert (cfg.steps, cfg.env.max_turns, cfg.checkpoint_keep_every) == (12, 12, 4)
        rows.setdefault(cfg.value.features, []).append(
            cfg.model_dump(exclude={"seed"}, mode="json")
        )
    assert sorted(rows) == ["boundary", "prompt_mean"] and all(len(v) == 10 for v in rows.values())
    shipped, reading = rows["boundary"][0], rows["prompt_mean"][0]
    assert (reading["value"]["head"], reading["value"]["tau"]) == ("ridge", 0.01)
    assert (reading["value"]["warmup_rollouts"], reading["continuations"]["horizon"]) == (8, 12)
    for key in ("features", "head", "tau", "warmup_rollouts"):
        reading["value"][key] = shipped["value"][key]
    reading["continuations"]["horizon"] = shipped["continuations"]["horizon"]
    assert reading == shipped
