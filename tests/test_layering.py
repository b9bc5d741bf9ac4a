"""Architecture rules that imports must keep (docs/design.md section 2.2).

- Every import between sub-packages is in the layer table (:data:`MAY_IMPORT`), and the edges
  that do not point down the layers are listed with their reason (:data:`SIDEWAYS`).

- ``credit/`` and ``stats/`` load no other ``factor_cli`` module than the stdlib-only registry,
  so other RL stacks can import them on their own.
- The command line starts without torch, transformers, numpy, scipy, pandas, mlflow, matplotlib or
  DeepSpeed: ``factor --help`` and config errors do not pay for them.
- The package has no import cycles between its sub-packages' modules that matter at import time:
  every module imports on its own in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import factor_cli

HEAVY = (
    "torch",
    "transformers",
    "numpy",
    "scipy",
    "pandas",
    "mlflow",
    "matplotlib",
    "deepspeed",
    "vllm",
)


def _loaded_after(statement: str) -> dict[str, list[str]]:
    code = (
        "import json, sys\n"
        f"{statement}\n"
        "mods = sorted(m for m in sys.modules if m.startswith('factor_cli'))\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps({'factor': mods, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("layer", ["credit", "stats"])
def test_pure_layers_import_nothing_else_from_the_package(layer: str) -> None:
    loaded = _loaded_after(f"import factor_cli.{layer}; factor_cli.{layer}.__all__")
    allowed_prefix = f"factor_cli.{layer}"
    others = [
        m
        for m in loaded["factor"]
        if m not in ("factor_cli", "factor_cli.registry") and not m.startswith(allowed_prefix)
    ]
    assert others == []


def test_every_credit_and_stats_name_resolves_without_other_package_modules() -> None:
    """Touching every public name (which imports every submodule) keeps the rule."""
    stmt = (
        "import factor_cli.credit as c, factor_cli.stats as s\n"
        "[getattr(c, n) for n in c.__all__]; [getattr(s, n) for n in s.__all__]"
    )
    loaded = _loaded_after(stmt)
    others = [
        m
        for m in loaded["factor"]
        if m not in ("factor_cli", "factor_cli.registry")
        and not m.startswith(("factor_cli.credit", "factor_cli.stats"))
    ]
    assert others == []


def test_the_command_line_starts_without_heavy_libraries() -> None:
    loaded = _loaded_after("from factor_cli.cli.app import app")
    assert loaded["heavy"] == []


def test_config_loading_is_light() -> None:
    loaded = _loaded_after(
        "from factor_cli.train.config import TrainConfig, field_reference; field_reference()"
    )
    assert loaded["heavy"] == []


def _modules() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.walk_packages(factor_cli.__path__, "factor_cli.")
        if not m.name.startswith("factor_cli._shipped")
    )


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """An import cycle shows up as an ImportError when the module is imported first."""
    optional = {"factor_cli.policy.generation.vllm"}  # needs the optional vllm package
    code = (
        "import importlib, sys, json\n"
        "bad = {}\n"
        f"for name in {[m for m in _modules() if m not in optional]!r}:\n"
        "    for k in [k for k in sys.modules if k.startswith('factor_cli')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        bad[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}


# ----------------------------------------------------------------------------- the layer table

UTILITIES = frozenset({"registry", "atomic", "interrupts", "resources"})
"""Standard-library-only helpers at the package's top level; any layer may use them (``credit``
and ``stats`` only ``registry``: the tests above)."""

MAY_IMPORT: dict[str, frozenset[str]] = {
    "__main__": frozenset({"cli"}),
    "cli": frozenset(
        {
            "studies",
            "diagnostics",
            "train",
            "rollout",
            "policy",
            "envs",
            "credit",
            "stats",
            "ledger",
            "splits",
        }
    ),
    "studies": frozenset({"train", "envs", "ledger", "stats"}),
    "diagnostics": frozenset({"train", "rollout", "policy", "envs", "credit", "stats", "ledger"}),
    "train": frozenset({"rollout", "policy", "envs", "credit", "stats", "ledger", "splits"}),
    "rollout": frozenset({"policy", "envs", "credit", "ledger"}),
    "policy": frozenset({"envs"}),
    "envs": frozenset(),
    "splits": frozenset({"envs"}),
    "ledger": frozenset({"stats"}),
    "credit": frozenset(),
    "stats": frozenset(),
}
"""Which sub-package may import which (besides :data:`UTILITIES` and itself). The order of
docs/design.md section 2.2 is cli > studies, diagnostics > train > rollout > policy > envs >
credit, with ledger, stats and splits beside them; the edges that do not point down that order
are in :data:`SIDEWAYS`."""

SIDEWAYS: dict[tuple[str, str], str] = {
    ("policy", "envs"): "the tiny model's tokenizer is trained on environment text "
    "(policy/corpus.py plays games to collect it)",
    ("rollout", "ledger"): "transcripts are built in the ledger's record schema "
    "(ledger/transcripts.py EpisodeRecord), which the ledger also reads back",
    ("ledger", "stats"): "item-level exports are validated against the statistics' file "
    "schema (stats/io.py), so factor stats reads what the ledger writes",
    ("splits", "envs"): "manifests are built by enumerating each environment's instances",
}


def _imported_layers(path: Path, root: Path) -> set[str]:
    """The top-level ``factor_cli`` sub-packages (or modules) that ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ("factor_cli", *path.relative_to(root).parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names = [".".join((*base, *([node.module] if node.module else [])))]
            else:
                names = [node.module or ""]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("factor_cli.")}
    return found


def test_every_import_follows_the_layer_table() -> None:
    """A new upward or sideways import fails here, naming the file and the edge."""
    root = Path(factor_cli.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        layer = parts[0] if len(parts) > 1 else path.stem
        if layer not in MAY_IMPORT:  # a top-level helper module (registry, atomic...)
            continue
        for target in _imported_layers(path, root) - {layer} - UTILITIES:
            if target not in MAY_IMPORT[layer]:
                bad.append(f"{path.relative_to(root)}: {layer} -> {target}")
    assert bad == [], "imports outside the layer table (add an edge with a reason, or move code)"


def test_sideways_edges_are_in_the_table_with_a_reason() -> None:
    for (src, dst), reason in SIDEWAYS.items():
        assert dst in MAY_IMPORT[src] and reason
    root = Path(factor_cli.__file__).parent
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert packages <= set(MAY_IMPORT), packages - set(MAY_IMPORT)
