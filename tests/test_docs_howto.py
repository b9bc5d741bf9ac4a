"""The how-to guides, followed as written: each guide's titled code blocks (the file a reader
would create or edit, and the test file it tells them to write) are run here against the real
registries, loader and CLI, so a guide that stops working fails this file (docs/howto/).

Registering a toy environment or method mutates global registries; each test works on copies
that are put back afterwards.
"""

from __future__ import annotations

import inspect
import re
import shlex
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
HOWTO = REPO / "docs" / "howto"
BLOCK = re.compile(r'^```(\w+) title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)


def blocks(guide: str) -> dict[str, str]:
    """The guide's titled code blocks, by title (the file they belong in)."""
    text = (HOWTO / guide).read_text(encoding="utf-8")
    return {title: code for _, title, code in BLOCK.findall(text)}


def commands(guide: str, prefix: str) -> list[str]:
    """The lines of the guide's bash blocks that start with ``prefix`` (continuations joined)."""
    text = (HOWTO / guide).read_text(encoding="utf-8").replace("\\\n", " ")
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        found += [ln.split(" # ")[0].strip() for ln in block.splitlines() if ln.startswith(prefix)]
    return found


def run_tests(code: str, namespace: dict[str, Any], **fixtures: Any) -> list[str]:
    """Exec a guide's test file and call each ``test_*`` function with the fixtures it names."""
    exec(compile(code, "<guide test>", "exec"), namespace)
    ran = []
    for name, fn in list(namespace.items()):
        if name.startswith("test_") and callable(fn):
            fn(**{p: fixtures[p] for p in inspect.signature(fn).parameters})
            ran.append(name)
    assert ran, "the guide's test file defines no test"
    return ran


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Copies of every registry a guide adds to, restored after the test."""
    from factor_cli.credit import methods
    from factor_cli.credit.estimators import ESTIMATORS
    from factor_cli.envs import ENVIRONMENTS
    from factor_cli.splits.build import COUNT_RULES, PLANNERS

    for registry in (ENVIRONMENTS, PLANNERS, COUNT_RULES, ESTIMATORS, methods.METHODS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    yield


def module_namespace(module_name: str) -> dict[str, Any]:
    """A copy of a module's globals: code "added beside the others" in that file runs here."""
    module = __import__(module_name, fromlist=["_"])
    return dict(vars(module))


def test_add_an_environment_as_the_guide_says(
    registries: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from factor_cli.envs import ENVIRONMENTS, make_env
    from factor_cli.splits.manifest import MANIFEST_NAMES, read_manifest
    from factor_cli.train.config import load_config

    code = blocks("add-environment.md")
    adapter = types.ModuleType("factor_cli.envs.guess")
    exec(compile(code["factor_cli/envs/guess.py"], "guess.py", "exec"), adapter.__dict__)
    assert "guess" in ENVIRONMENTS
    # Step 2: the manifest's name (the prose's dict entry), then the split rule block.
    monkeypatch.setitem(MANIFEST_NAMES, "guess", "guess_ids.csv")
    build_ns = module_namespace("factor_cli.splits.build")
    exec(compile(code["factor_cli/splits/build.py"], "build.py", "exec"), build_ns)
    with make_env("guess") as env:
        path = build_ns["build_manifest"]("guess", env, tmp_path)
    rows = read_manifest(path)
    assert {r.split for r in rows} == {"train", "eval"} and len(rows) == 10
    assert build_ns["COUNT_RULES"].get("guess")(rows) == []
    # Step 3: the test file the guide says to write passes.
    run_tests(code["tests/envs/test_env_guess.py"], {})
    # Step 4: its `factor train` overrides validate against the manifest just built.
    (train,) = commands("add-environment.md", "factor train")
    overrides = [w for w in shlex.split(train) if "=" in w] + [f"env.splits_dir={tmp_path}"]
    cfg = load_config("smoke", overrides)
    assert cfg.env.name == "guess" and not cfg.sft.enabled


def test_add_a_credit_method_as_the_guide_says(registries: None) -> None:
    from factor_cli.credit import METHODS
    from factor_cli.credit import methods as methods_module
    from factor_cli.credit.estimators import ESTIMATORS

    code = blocks("add-method.md")
    ns = module_namespace("factor_cli.credit.estimators")
    exec(compile(code["factor_cli/credit/estimators.py"], "estimators.py", "exec"), ns)
    assert ESTIMATORS.get("last").conserves
    spec = eval(code["factor_cli/credit/methods.py"], module_namespace(methods_module.__name__))
    methods_module._add(spec)
    assert "last-action" in METHODS
    run_tests(code["tests/credit/test_last_action.py"], {})
    with pytest.raises(ValueError, match="already registered"):
        methods_module._add(spec)


def test_the_study_spec_guide_expands_as_it_says(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from factor_cli.cli.main import app

    code = blocks("study-spec.md")
    spec_path = tmp_path / "eta-sweep.yaml"
    spec_path.write_text(code["eta-sweep.yaml"], encoding="utf-8")
    run_tests(code["tests/studies/test_matrix.py"], {}, spec_path=spec_path)
    result = CliRunner().invoke(app, ["study", "plan", str(spec_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "8 cells: 8 pending" in result.output  # what the guide's comment promises


def test_the_slurm_guide_dry_run_prints_torchrun_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from factor_cli.cli.main import app

    monkeypatch.chdir(tmp_path)
    (dry,) = [c for c in commands("slurm.md", "factor study run") if "--dry-run" in c]
    args = [*shlex.split(dry)[1:], "--set", f"output_dir={tmp_path / 'runs'}"]
    env = {"COLUMNS": "300", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'ledger.db'}"}
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert result.output.count("--nproc_per_node=2") == 3  # the ci spec's three cells
    assert not list(tmp_path.glob("runs/studies/ci/cells/*/attempt-*.log"))  # nothing started


def test_the_multi_gpu_guide_matches_the_paper_preset() -> None:
    from factor_cli.train.config import load_config

    text = (HOWTO / "multi-gpu.md").read_text(encoding="utf-8")
    cfg = load_config("paper")
    assert "`engine.zero_stage: 3`" in text and cfg.engine.zero_stage == 3
    assert "`rollout.backend: vllm`" in text and cfg.rollout.backend == "vllm"
    for line in commands("multi-gpu.md", "torchrun"):
        assert "-m factor_cli train" in line
