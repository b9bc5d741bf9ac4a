"""The study spec schema: shipped specs load; bad specs are one-line SpecErrors naming the file.

A spec is strict (unknown keys are errors at any level) and checked as a whole (unique rows,
seeds and envs; zipped axes of one length; exclusion keys among row/method/env/seed/axes).
Its hash (``StudySpec.digest``, the ``spec_hash`` tag) is of the validated spec: comments and
key order do not change it, any value does.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from factor_cli.studies.spec import SpecError, StudySpec, load_spec, shipped_specs, studies_dir
from factor_cli.train.config import ConfigError

SHIPPED = [
    "ablations", "budget", "ci", "distill", "distill-coin", "estimators", "main", "mini",
    "mini-cooking", "mini2", "protocol", "sensitivity", "transfer", "value-features",
    "value-levers", "value-states",
]  # fmt: skip

MINIMAL = """\
name: tiny
base: smoke
envs: [twx]
seeds: [42, 43]
rows:
  - {name: factor}
  - {name: ref, method: serl-repro, crossed: false}
axes:
  rollout.k: [2, 4]
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def spec_error(source: str | Path) -> str:
    """The message of the SpecError that loading ``source`` raises (checked to be one line)."""
    with pytest.raises(SpecError) as info:
        load_spec(str(source))
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_loads(name: str) -> None:
    spec, path = load_spec(name)
    assert spec.name == name == path.stem
    assert path == studies_dir() / f"{name}.yaml"
    assert isinstance(spec, StudySpec)


def test_shipped_names_and_paths_load_the_same_spec() -> None:
    assert shipped_specs() == SHIPPED
    by_name, path = load_spec("protocol")
    by_path, same = load_spec(str(path))
    assert (by_path, same) == (by_name, path)


def test_minimal_spec_defaults(tmp_path: Path) -> None:
    spec, _ = load_spec(str(write(tmp_path, "name: x\nrows: [{name: factor}]\n")))
    assert (spec.base, spec.envs, spec.seeds) == ("paper", ["alfworld", "webshop", "scienceworld"],
                                                  [42, 43, 1337])  # fmt: skip
    assert (spec.axes, spec.axes_mode, spec.exclude, spec.set) == ({}, "product", [], {})
    assert (spec.summary.table, spec.summary.reference, spec.summary.subject) == (
        "main",
        "serl-repro",
        "factor",
    )
    assert spec.rows[0].method_name == "factor" and spec.rows[0].crossed


def test_spec_error_is_a_config_error() -> None:
    """Callers that catch the package's ConfigError (the CLI) catch spec errors too."""
    assert issubclass(SpecError, ConfigError)


BAD_SPECS = {
    "unknown top-level key": (MINIMAL + "colour: red\n", ["field colour", "unknown field"]),
    "unknown key in a row": (
        MINIMAL.replace("{name: factor}", "{name: factor, stes: 3}"),
        ["field rows.0.stes", "unknown field"],
    ),
    "unknown key in summary": (
        MINIMAL + "summary: {table: main, refrence: grpo}\n",
        ["field summary.refrence", "unknown field"],
    ),
    "duplicate row names": (
        MINIMAL.replace("{name: ref, method: serl-repro", "{name: factor, method: serl-repro"),
        ["row names must be unique", "factor"],
    ),
    "duplicate seeds": (MINIMAL.replace("[42, 43]", "[42, 42]"), ["seeds must be unique"]),
    "duplicate envs": (MINIMAL.replace("[twx]", "[twx, twx]"), ["envs must be unique"]),
    "zip axes of different lengths": (
        MINIMAL + "  rollout.temperature: [0.5, 0.7, 1.0]\naxes_mode: zip\n",
        ["axes_mode zip", "rollout.k: 2", "rollout.temperature: 3"],
    ),
    "empty axis": (MINIMAL + "  rollout.temperature: []\n", ["field axes", "rollout.temperature"]),
    "exclude rule with an unknown key": (
        MINIMAL + "exclude: [{row: ref, colour: red}]\n",
        ["exclude rule", "colour", "env, method, rollout.k, row, seed"],
    ),
    "empty exclude rule": (MINIMAL + "exclude: [{}]\n", ["exclude rule"]),
    "axis key not dotted": (
        MINIMAL.replace("rollout.k:", "rollout..k:"),
        ["field axes", "rollout..k", "dotted config key"],
    ),
    "row set key not dotted": (
        MINIMAL.replace("{name: factor}", "{name: factor, set: {.lr: 1}}"),
        ["field rows.0.set", ".lr"],
    ),
    "unknown axes mode": (
        MINIMAL + "axes_mode: grid\n",
        ["field axes_mode", "product", "zip", "each"],
    ),
    "unknown summary table": (
        MINIMAL + "summary: {table: pareto}\n",
        ["field summary.table", "ablation"],
    ),
    "no rows": (MINIMAL.split("rows:")[0] + "rows: []\n", ["field rows"]),
    "no name": (MINIMAL.replace("name: tiny\n", ""), ["field name", "required"]),
    "bad name": (MINIMAL.replace("name: tiny", "name: my study"), ["field name"]),
    "no seeds": (MINIMAL.replace("[42, 43]", "[]"), ["field seeds"]),
    "seed not an int": (MINIMAL.replace("[42, 43]", "[42, forty]"), ["field seeds.1"]),
    "a list at the top": ("- name: tiny\n", ["top level must be a mapping"]),
}


@pytest.mark.parametrize("case", BAD_SPECS)
def test_bad_spec_is_one_line_naming_file_and_field(tmp_path: Path, case: str) -> None:
    text, fragments = BAD_SPECS[case]
    path = write(tmp_path, text)
    message = spec_error(path)
    assert message.startswith(f"{path}:"), message
    for fragment in fragments:
        assert fragment in message, (case, message)


def test_not_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "name: tiny\nrows:\n  - {name: factor\n")
    message = spec_error(path)
    # The flow mapping opened on line 3 is never closed: the parser stops at the end (4:1).
    assert re.match(rf"^{re.escape(str(path))}:4:1: not valid YAML \(", message), message


def test_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: tiny\ntitle: caf\xe9\n")
    assert spec_error(path).startswith(f"{path}:2: not UTF-8")


def test_missing_spec_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    assert spec_error(path) == f"{path}: no such study spec file"


def test_a_folder_is_not_a_spec(tmp_path: Path) -> None:
    assert spec_error(tmp_path) == f"{tmp_path}: no such study spec file"


def test_unknown_study_name_lists_the_shipped_ones() -> None:
    message = spec_error("ablation")
    assert "'ablation'" in message
    assert f"shipped: {', '.join(SHIPPED)}" in message


# --- the spec hash ------------------------------------------------------------------------------


def digest_of(tmp_path: Path, text: str, name: str = "spec.yaml") -> str:
    return load_spec(str(write(tmp_path, text, name)))[0].digest()


def test_digest_is_stable_across_loads(tmp_path: Path) -> None:
    first = digest_of(tmp_path, MINIMAL, "a.yaml")
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    assert digest_of(tmp_path, MINIMAL, "b.yaml") == first
    assert load_spec("ablations")[0].digest() == load_spec("ablations")[0].digest()


def test_digest_ignores_comments_and_key_order(tmp_path: Path) -> None:
    reordered = """\
    # the same study, written differently (the rows keep their order: it is the table's)
    rows: [{name: factor}, {crossed: false, method: serl-repro, name: ref}]
    axes: {rollout.k: [2, 4]}   # one axis
    seeds: [42, 43]
    envs: [twx]
    base: smoke
    name: tiny
    """
    assert digest_of(tmp_path, reordered, "b.yaml") == digest_of(tmp_path, MINIMAL, "a.yaml")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("[42, 43]", "[42, 1337]"),  # a seed
        ("[2, 4]", "[2, 8]"),  # an axis value
        ("[twx]", "[alfworld]"),  # an env
        ("base: smoke", "base: paper"),  # the base
        ("{name: factor}", "{name: factor, set: {optim.lr: 1.0e-4}}"),  # a row's overrides
        ("crossed: false", "crossed: true"),  # a row flag
        ("name: tiny", "name: tiny2"),  # the study name
    ],
)
def test_digest_changes_with_any_value(tmp_path: Path, old: str, new: str) -> None:
    assert old in MINIMAL
    changed = MINIMAL.replace(old, new)
    assert digest_of(tmp_path, changed, "b.yaml") != digest_of(tmp_path, MINIMAL, "a.yaml")


def test_digest_follows_row_order(tmp_path: Path) -> None:
    """Row order is the table's order, so it is part of the spec."""
    swapped = MINIMAL.replace(
        "  - {name: factor}\n  - {name: ref, method: serl-repro, crossed: false}\n",
        "  - {name: ref, method: serl-repro, crossed: false}\n  - {name: factor}\n",
    )
    assert swapped != MINIMAL
    assert digest_of(tmp_path, swapped, "b.yaml") != digest_of(tmp_path, MINIMAL, "a.yaml")


def test_shipped_specs_have_distinct_digests() -> None:
    digests = {load_spec(name)[0].digest() for name in SHIPPED}
    assert len(digests) == len(SHIPPED)
