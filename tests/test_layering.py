"""Architecture rules that imports must keep (DESIGN section 2).

- ``credit/`` and ``stats/`` load no other ``factor_cli`` module than the stdlib-only registry,
  so other RL stacks can import them on their own.
- The command line starts without torch, transformers, numpy, scipy, pandas, mlflow, matplotlib or
  DeepSpeed: ``factor --help`` and config errors do not pay for them.
- The package has no import cycles between its sub-packages' modules that matter at import time:
  every module imports on its own in a fresh interpreter.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

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
