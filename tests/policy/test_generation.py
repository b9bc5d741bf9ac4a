"""The generation package's structure and contract: the backend protocol, the registry of
factories, the one meaning of ``seed=``, shared limits, and imports that stay acyclic and light.

The backends' sampling itself is tested in ``test_rollout.py`` (hf) and ``test_vllm_backend.py``.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from factor_cli.policy.generation.backends import BACKEND_NAMES, BACKENDS
from factor_cli.policy.generation.base import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_CONTEXT,
    DEFAULT_MAX_NEW_TOKENS,
    SEED_MODULUS,
    GenerationBackend,
    GenerationLimits,
    request_seeds,
)
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.generation.vllm import VLLMGenerator

PACKAGE = Path(__file__).resolve().parents[2] / "factor_cli"


def _run(code: str) -> str:
    """stdout of ``code`` in a fresh interpreter (nothing imported yet)."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    )
    return out.stdout.strip()


# -- registry and light imports ----------------------------------------------------------------
def test_backend_names_are_the_registry_and_load_no_torch() -> None:
    assert BACKEND_NAMES == tuple(BACKENDS.names()) == ("hf", "vllm")
    loaded = _run(
        "import sys\n"
        "from factor_cli.policy.generation.backends import BACKEND_NAMES\n"
        "from factor_cli.policy.generation.base import DEFAULT_MAX_CONTEXT\n"
        "print(','.join(BACKEND_NAMES), 'torch' in sys.modules)"
    )
    assert loaded == "hf,vllm False"


def test_importing_generation_does_not_import_vllm() -> None:
    loaded = _run(
        "import sys\n"
        "import factor_cli.policy.generation as g\n"
        "from factor_cli.policy.generation import HFGenerator, score_replies, BACKENDS\n"
        "import factor_cli.rollout.runner, factor_cli.rollout.teacher\n"
        "print('vllm' in sys.modules, 'factor_cli.policy.generation.vllm' in sys.modules)"
    )
    assert loaded == "False False"


def _top_level_imports(path: Path, module: str) -> set[str]:
    """Modules ``module`` imports when it is imported: top-level statements (``if`` / ``try``
    bodies included), not function bodies and not ``if TYPE_CHECKING:`` blocks."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                target = ".".join(p for p in (base, node.module) if p)
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)  # `from . import x`
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)

    visit(ast.parse(path.read_text()).body)
    return found


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def test_policy_and_rollout_modules_import_without_cycles() -> None:
    """The module graph of ``policy/`` and ``rollout/`` (import-time edges) is acyclic: the old
    ``generation`` <-> ``vllm_backend`` pair would be reported here."""
    mods = {**_modules(PACKAGE / "policy"), **_modules(PACKAGE / "rollout")}
    graph = {m: sorted(_top_level_imports(p, m) & mods.keys() - {m}) for m, p in mods.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                return [*path, m, n]
            if n not in state and (found := cycle_from(n, [*path, m])):
                return found
        state[m] = 2
        return None

    cycles = [c for m in sorted(graph) if m not in state and (c := cycle_from(m, []))]
    assert cycles == []
    assert "factor_cli.policy.generation.vllm" not in graph["factor_cli.policy.generation.backends"]


def test_hf_factory_refuses_options() -> None:
    with pytest.raises(ValueError, match="hf generation backend has no option rescore; valid: "):
        BACKENDS.get("hf")(object(), rescore=True)  # type: ignore[arg-type]


# -- limits and defaults -----------------------------------------------------------------------
def test_limits_are_checked_once_for_every_backend() -> None:
    assert GenerationLimits().prompt_budget == DEFAULT_MAX_CONTEXT - DEFAULT_MAX_NEW_TOKENS
    assert GenerationLimits(8, 64, 2).prompt_budget == 56
    with pytest.raises(ValueError, match=r"max_new_tokens \(64\) must be < max_context \(64\)"):
        GenerationLimits(64, 64)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        GenerationLimits(8, 64, 0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        GenerationLimits(0, 64)
    for backend in (HFGenerator, VLLMGenerator):
        with pytest.raises(ValueError, match="must be < max_context"):
            backend(object(), max_new_tokens=64, max_context=64)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "build",
    [HFGenerator, VLLMGenerator, *(BACKENDS.get(n) for n in BACKEND_NAMES)],
    ids=["HFGenerator", "VLLMGenerator", *(f"factory-{n}" for n in BACKEND_NAMES)],
)
def test_limit_defaults_have_one_home(build: object) -> None:
    params = inspect.signature(build).parameters  # type: ignore[arg-type]
    assert params["max_new_tokens"].default == DEFAULT_MAX_NEW_TOKENS == 512
    assert params["max_context"].default == DEFAULT_MAX_CONTEXT == 4096
    assert params["batch_size"].default == DEFAULT_BATCH_SIZE


def test_config_rollout_defaults_match_the_backends() -> None:
    from factor_cli.train.config import RolloutConfig

    fields = RolloutConfig.model_fields
    assert fields["max_new_tokens"].default == DEFAULT_MAX_NEW_TOKENS
    assert fields["max_context"].default == DEFAULT_MAX_CONTEXT


# -- the one meaning of seed= ------------------------------------------------------------------
def test_request_seeds() -> None:
    assert request_seeds(3, None, None) is None
    assert request_seeds(3, 10, None) == [10, 11, 12]
    assert request_seeds(2, 10, [5, 6]) == [5, 6]  # seeds win over seed
    assert request_seeds(2, None, [-1, SEED_MODULUS + 3]) == [SEED_MODULUS - 1, 3]
    assert request_seeds(1, SEED_MODULUS - 1, None) == [SEED_MODULUS - 1]
    with pytest.raises(ValueError, match="seeds has 1 entries for 2 prompts"):
        request_seeds(2, None, [1])


# -- the hf backend against the protocol -------------------------------------------------------
@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    from factor_cli.policy.model import load_policy

    return load_policy(str(tiny_model_dir))


def test_hf_backend_satisfies_the_protocol(policy) -> None:
    gen = BACKENDS.get("hf")(policy, max_new_tokens=8, max_context=64, batch_size=4)
    assert isinstance(gen, HFGenerator) and isinstance(gen, GenerationBackend)
    assert gen.limits == GenerationLimits(8, 64, 4)
    assert gen.pad_id == policy.tokenizer.pad_token_id
    ((ids, cut),) = gen.encode(["word " * 100])
    assert cut and len(ids) == 56
    gen.generate(["Take the coin."], seed=0)
    assert gen.last_logprob_gap is None  # it samples with the trainer's own forward
    assert gen.copies_weights is False  # so the trainer never gathers ZeRO-3 weights for it
    other = torch.nn.Linear(1, 1)
    gen.refresh(other)
    assert gen.model is other  # refresh rebinds: nothing to copy
    gen.refresh()
    assert gen.model is other
    gen.close()
    gen.close()  # idempotent


def test_hf_seed_means_seed_plus_i(policy) -> None:
    """``seed=s`` is ``seeds=[s, s + 1, ...]`` (it used to reseed torch's global generator)."""
    gen = HFGenerator(policy, max_new_tokens=12, max_context=256)
    group = ["You are in the kitchen. Find the coin."] * 4
    torch.manual_seed(0)
    by_seed = gen.generate(group, temperature=1.0, seed=5)
    torch.manual_seed(1)  # the global generator's state does not matter
    by_seeds = gen.generate(group, temperature=1.0, seeds=[5, 6, 7, 8])
    assert [g.token_ids for g in by_seed] == [g.token_ids for g in by_seeds]
    assert len({tuple(g.token_ids) for g in by_seed}) > 1  # a group still draws different replies
    alone = gen.generate(group[:1], temperature=1.0, seed=7)  # reply 0 of seed 7 = reply 2 of 5
    assert alone[0].token_ids == by_seed[2].token_ids


def test_every_hf_switch_is_reachable_from_config(tiny_model_dir) -> None:
    """rollout.hf.* reaches the hf backend (off: every optimisation disabled)."""
    from factor_cli.policy.model import load_policy
    from factor_cli.train.config import load_config
    from factor_cli.train.generation import make_backend

    off = ["rollout.hf.shared_prefix_min=null", "rollout.hf.stem_min=null",
           "rollout.hf.merge_duplicates=false", "rollout.hf.skip_forced=false",
           "rollout.hf.prefix_cache_tokens=100"]  # fmt: skip
    cfg = load_config("smoke", off)
    gen = make_backend(cfg.rollout, load_policy(str(tiny_model_dir)))
    try:
        reuse = gen.reuse
        switches = (reuse.shared_prefix_min, reuse.stem_min, gen.merge_duplicates, gen.skip_forced)
        assert switches == (None, None, False, False)
        assert gen.prefix_cache.capacity == 100
        default = make_backend(load_config("smoke").rollout, load_policy(str(tiny_model_dir)))
        assert (default.reuse.shared_prefix_min, default.reuse.stem_min) == (16, 32)
        assert default.merge_duplicates and default.skip_forced
    finally:
        gen.close()
