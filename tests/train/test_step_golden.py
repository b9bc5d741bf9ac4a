"""The training step's numbers, pinned: three FACTOR steps (teacher, continuations, value head,
credit, update) and two GRPO steps on the tiny model, every metric except the timings and a
digest of the weights after the last step, against ``tests/data/step_golden.json``.

A change of the step's structure (its phases, their order, the types between them) must leave
these unchanged; a change that means to alter the numbers regenerates the file on purpose:
``FACTOR_WRITE_GOLDEN=1 pytest tests/train/test_step_golden.py`` (docs/development.md, "Pinned
numbers"). The file was written on another CPU than most that run it: each quantity is compared
within a tolerance that follows from float32 arithmetic and the magnitudes it is computed from
(``tests/pins.py``), every mismatch is reported at once, and the same comparison runs in a
fresh process on other kernels (torch's portable ``default`` vector path, one thread), so a
tolerance too tight for another CPU fails here and not on the next machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pins import EXACT, case_mismatches, gamma
from test_train import needs_twx, tiny_overrides

from factor_cli.train.config import load_config

GOLDEN = Path(__file__).parents[1] / "data" / "step_golden.json"
ROOT = Path(__file__).resolve().parents[2]
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
OTHER_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""torch's portable (non-AVX) kernels on one thread: another summation order than any
vectorised multi-threaded run, as another CPU's would be."""


def _digest(module: torch.nn.Module) -> dict[str, float]:
    """Sums over every parameter (a change anywhere moves them)."""
    params = [p.detach().double() for p in module.parameters()]
    return {"sum": float(sum(p.sum() for p in params)),
            "abs_sum": float(sum(p.abs().sum() for p in params))}  # fmt: skip


def _scales(record: object) -> dict[str, float]:
    """The step's magnitudes the tolerances scale with (``tests/pins.py``: Scales)."""
    rb, credit = record.batch, record.credit  # type: ignore[attr-defined]
    amax = lambda t: float(t.detach().abs().max()) if t.numel() else 0.0  # noqa: E731
    return {"logp": amax(rb.batch.logp_old), "adv": max(amax(credit.coef), amax(credit.a_seq)),
            "weight": amax(credit.weight), "kl_coef": float(credit.kl_coef)}  # fmt: skip


def _reduction(model: torch.nn.Module, tokens: int) -> int:
    """R: the longest reduction of the step (vocabulary, the model's widths, the batch's tokens)."""
    c = model.config
    return max(c.vocab_size, c.hidden_size, getattr(c, "intermediate_size", 0), tokens)


def _play(tiny_model_dir: Path, tmp: Path, method: str, steps: int, extra: list[str]) -> dict:
    from factor_cli.train.trainer import Trainer

    cfg = load_config("smoke", [*tiny_overrides(tiny_model_dir, tmp, method, steps), *extra])
    trainer = Trainer(cfg, str(tiny_model_dir))
    try:
        per_step, scales = [], []
        for _ in range(steps):
            result = trainer.train_step()
            per_step.append({k: v for k, v in sorted(result.metrics.items())
                             if not k.startswith("time_")})  # fmt: skip
            scales.append(_scales(result.record))
        model = trainer.policy.model
        tokens = int(max(m["action_tokens"] for m in per_step))
        out = {"metrics": per_step, "scales": scales, "policy": _digest(model),
               "reduction": _reduction(model, tokens),
               "depth": int(model.config.num_hidden_layers) + 2}  # fmt: skip
        if trainer.spec.uses_value_head:
            out["value_online"] = _digest(trainer.heads.online)
            out["value_target"] = _digest(trainer.heads.target)
        return out
    finally:
        trainer.close()


@needs_twx
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
    bad = case_mismatches(case, golden[case], got)
    assert not bad, f"{len(bad)} pinned number(s) differ:\n" + "\n".join(bad)


def _capability(env: dict[str, str]) -> str:
    code = "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip()


@needs_twx
@pytest.mark.slow
def test_the_pins_hold_under_other_kernels() -> None:
    """The FACTOR case, in a fresh process on torch's portable kernels and one thread: the
    pins hold there too (this machine's own kernels are the test above)."""
    env = {**os.environ, **OTHER_KERNELS}
    env.pop("FACTOR_WRITE_GOLDEN", None)
    assert _capability(env) != _capability(dict(os.environ)), "no other kernels to compare on"
    node = f"{Path(__file__).relative_to(ROOT)}::test_the_step_reproduces_its_pinned_numbers"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", f"{node}[factor]", "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-o", "addopts="],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout, proc.stdout[-2000:]


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


def _tolerance(case: dict, step: int, name: str) -> float:
    """The metric's tolerance at its pinned value (``tests/pins.py``), for planting errors."""
    from pins import ABSOLUTE

    g = gamma(case["reduction"], case["depth"])
    value = abs(case["metrics"][step][name])
    atol = g * ABSOLUTE[name](case["scales"][step]) if name in ABSOLUTE else 0.0
    return atol + g * value


@pytest.mark.parametrize("name", ["approx_kl", "loss_action", "kl", "grad_norm", "value_mse"])
def test_a_planted_error_beyond_its_tolerance_fails_and_one_within_passes(name: str) -> None:
    case = _golden()["factor"]
    for factor, caught in ((2.0, True), (0.5, False)):
        got = json.loads(json.dumps(case))
        got["metrics"][1][name] += factor * _tolerance(case, 1, name)
        bad = case_mismatches("factor", case, got)
        assert bool(bad) is caught, bad
        assert not caught or bad[0].startswith(f"factor.metrics[1].{name}:")


def test_every_mismatch_is_reported_not_only_the_first() -> None:
    case = _golden()["factor"]
    got = json.loads(json.dumps(case))
    got["metrics"][0]["approx_kl"] += 1e-3
    got["metrics"][2]["actions"] += 1
    got["policy"]["sum"] += 10.0  # its tolerance: gamma * abs_sum ~ 1.3
    got["value_target"]["abs_sum"] *= 1.001
    bad = case_mismatches("factor", case, got)
    assert [line.split(":")[0] for line in bad] == [
        "factor.metrics[0].approx_kl", "factor.metrics[2].actions", "factor.policy.sum",
        "factor.value_target.abs_sum",
    ]  # fmt: skip


def test_every_pinned_metric_is_classified_and_a_new_one_must_be() -> None:
    case = _golden()["factor"]
    assert case_mismatches("factor", case, case) == []
    pinned, got = json.loads(json.dumps(case)), json.loads(json.dumps(case))
    pinned["metrics"][0]["new_metric"] = got["metrics"][0]["new_metric"] = 0.5
    assert [line for line in case_mismatches("factor", pinned, got)] == [
        "factor.metrics[0].new_metric: unclassified; add it to EXACT, RELATIVE or ABSOLUTE"
    ]
    assert {"actions", "success_rate"} <= EXACT
