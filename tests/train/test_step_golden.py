"""The training step's numbers, pinned: three FACTOR steps (teacher, continuations, value head,
credit, update) and two GRPO steps on the tiny model, every metric except the timings and a
digest of the weights after the last step, against ``tests/data/step_golden.json``.

A change of the step's structure (its phases, their order, the types between them) must leave
these unchanged; a change that means to alter the numbers regenerates the file on purpose:
``FACTOR_WRITE_GOLDEN=1 pytest tests/train/test_step_golden.py``. Floats are compared to a
relative 1e-6 (the file was written on one machine; another CPU's kernels may differ in the
last bits), integers exactly."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from test_train import needs_twx, tiny_overrides

from factor_cli.train.config import load_config

pytestmark = needs_twx
GOLDEN = Path(__file__).parents[1] / "data" / "step_golden.json"
# Three rooms and constrained replies: the untrained model plays valid actions, wins some
# games and loses others, so every phase has something to compute.
PLAYABLE = [
    "env.options.params.coin=numLocations=3,numDistractorItems=0,includeDoors=0",
    "rollout.valid_action_decoding=true",
    "rollout.groups=2",
    "rollout.k=4",
]
CASES = {
    "factor": ("factor", 3, [*PLAYABLE, "credit.warmup_steps=0", "continuations.per_checkpoint=2"]),
    "grpo": ("grpo", 2, PLAYABLE),
}


def _digest(module: torch.nn.Module) -> dict[str, float]:
    """Sums over every parameter (a change anywhere moves them)."""
    params = [p.detach().double() for p in module.parameters()]
    return {"sum": float(sum(p.sum() for p in params)),
            "abs_sum": float(sum(p.abs().sum() for p in params))}  # fmt: skip


def _play(tiny_model_dir: Path, tmp: Path, method: str, steps: int, extra: list[str]) -> dict:
    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", [*tiny_overrides(tiny_model_dir, tmp, method, steps), *extra])
    trainer = Trainer(cfg, str(tiny_model_dir))
    try:
        per_step = []
        for _ in range(steps):
            result = trainer.train_step()
            per_step.append({k: v for k, v in sorted(result.metrics.items())
                             if not k.startswith("time_")})  # fmt: skip
        out = {"metrics": per_step, "policy": _digest(trainer.policy.model)}
        if trainer.spec.uses_value_head:
            out["value_online"] = _digest(trainer.heads.online)
            out["value_target"] = _digest(trainer.heads.target)
        return out
    finally:
        trainer.close()


def _close(a: object, b: object, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys differ"
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not float(a).is_integer():
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a} != {b}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_step_reproduces_its_pinned_numbers(
    tiny_model_dir: Path, tmp_path: Path, case: str
) -> None:
    got = _play(tiny_model_dir, tmp_path, *CASES[case])
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("FACTOR_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps({**golden, case: got}, indent=1, sort_keys=True) + "\n")
        return
    assert case in golden, f"no golden numbers for {case}: FACTOR_WRITE_GOLDEN=1 writes them"
    _close(golden[case], got, case)
