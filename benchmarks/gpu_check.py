"""The GPU-only training paths, checked on one CUDA device (they cannot run on the CPU).

For each engine setting (ZeRO stage x precision x optimizer offload) it builds a DeepSpeed
engine around a policy on CUDA, runs PPO updates on a fixed synthetic rollout batch (the update
code of ``factor train``), and checks: finite losses, weights that move, an engine checkpoint
that reloads into a fresh engine with equal weights, and a Hugging Face export (ZeRO-3 gathers
its partitioned parameters) that reloads with the same weights. Then the ``hf`` backend on CUDA:
sampled tokens/s and the gap between behaviour log-probs and a re-score.

Usage: python benchmarks/gpu_check.py OUT_DIR [--medium] [--train]

``--medium`` also times a ~110M Llama built from a config; ``--train`` runs two whole training
steps of the ``paper`` preset (bf16, ZeRO-3) shrunk to the tiny model on TWX, for factor and
serl-repro, and a greedy evaluation. Prints one line per check and writes
``OUT_DIR/gpu_check.json``. Without CUDA it runs the fp32 ZeRO 0/1/3 cases (and ``--train`` at
fp32 ZeRO-1) on the CPU, which is how the script is tested here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from synthetic import synthetic_batch  # noqa: E402  (tests/synthetic.py)

from factor_cli.credit import assign_credit  # noqa: E402
from factor_cli.policy.generation.hf import HFGenerator  # noqa: E402
from factor_cli.policy.generation.scoring import score_replies  # noqa: E402
from factor_cli.policy.model import init_tiny, load_policy  # noqa: E402
from factor_cli.train.config import load_config  # noqa: E402
from factor_cli.train.engine import Engine  # noqa: E402
from factor_cli.train.update import ppo_update  # noqa: E402

CORPUS = [
    f"You are in room {i}. There is a {c} coin on the {t}. Exits: north, south. "
    f"<action>take {c} coin</action> <action>go {d}</action> score {i}"
    for i in range(300)
    for c, t, d in [("gold", "table", "north"), ("silver", "floor", "south")]
]


def weights(engine: Engine) -> list[torch.Tensor]:
    with engine.full_parameters() as module:
        return [p.detach().float().cpu().clone() for p in module.parameters()]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def engine_case(
    model_dir: Path,
    work: Path,
    device: str,
    zero: int,
    precision: str,
    offload: bool,
    updates: int,
    batch: tuple[int, int, int, int],
) -> dict[str, Any]:
    dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
    cfg = load_config(
        "smoke",
        [
            f"model.device={device}",
            f"engine.zero_stage={zero}",
            f"engine.precision={precision}",
            f"engine.offload_optimizer={str(offload).lower()}",
            "optim.micro_batch_actions=16",
            "optim.lr=1e-4",
            "optim.minibatches=1",
        ],
    )
    policy = load_policy(str(model_dir), dtype, device)
    rb = synthetic_batch(policy.model, *batch)
    packed = rb.batch
    credit = assign_credit(packed, "grpo", 20)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    engine = Engine(policy.model, cfg)
    before = weights(engine)
    times, losses = [], []
    for i in range(updates):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        stats = ppo_update(engine, rb, credit, cfg, 0, None, torch.Generator().manual_seed(i))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(stats.loss)
    after = weights(engine)
    ckpt = work / f"ckpt-z{zero}-{precision}-{int(offload)}"
    engine.save(ckpt)
    export = work / f"export-z{zero}-{precision}-{int(offload)}"
    engine.save_pretrained(export, policy.tokenizer)
    reloaded = load_policy(str(export), "float32", "cpu")
    export_gap = max_diff(after, [p.detach().float() for p in reloaded.model.parameters()])
    fresh = Engine(load_policy(str(model_dir), dtype, device).model, cfg)
    fresh.load(ckpt)
    resume_gap = max_diff(after, weights(fresh))
    out = {
        "case": f"zero{zero}-{precision}" + ("-offload" if offload else ""),
        "params": sum(p.numel() for p in before),
        "actions": packed.num_actions,
        "action_tokens": packed.num_tokens,
        "losses": losses,
        "finite": all(math.isfinite(x) for x in losses),
        "weight_change": max_diff(after, before),
        "resume_gap": resume_gap,
        "export_gap": export_gap,
        "s_per_update_median": sorted(times)[len(times) // 2],
        "s_first_update": times[0],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0,
    }
    out["ok"] = (
        out["finite"]
        and out["weight_change"] > 0
        and resume_gap == 0.0
        and export_gap <= (0.0 if precision == "fp32" else 1e-2)
    )
    del engine, fresh
    return out


def generation_case(model_dir: Path, device: str, dtype: str, n: int) -> dict[str, Any]:
    policy = load_policy(str(model_dir), dtype, device)
    gen = HFGenerator(policy, max_new_tokens=64, max_context=512)
    prompts = [f"You are in room {i}. There is a gold coin on the table." for i in range(n)]
    gen.generate(prompts[:4], temperature=1.0, seed=0)  # warm-up (kernels, allocator)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = gen.generate(prompts, temperature=1.0, seed=1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    sc = score_replies(
        policy.model, [o.prompt_ids for o in outs], [o.token_ids for o in outs], 1.0, gen.pad_id
    )
    gap = max(
        float((torch.tensor(o.logprobs) - lp.float().cpu()).abs().max())
        for o, lp in zip(outs, sc.logprobs)
        if o.token_ids
    )
    # Per-reply streams (what rollouts use): time them, and count the replies that come out the
    # same when generated alone (batch invariance holds exactly in arithmetic; GPU kernels may
    # differ by batch size, so this is reported, not required).
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    seeded = gen.generate(prompts, temperature=1.0, seeds=list(range(n)))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt_seeded = time.perf_counter() - t0
    alone = [gen.generate([p], seeds=[i])[0] for i, p in enumerate(prompts[:8])]
    same = sum(a.token_ids == b.token_ids for a, b in zip(seeded, alone))
    return {
        "case": f"hf-generate-{dtype}",
        "replies": n,
        "tokens": tokens,
        "tokens_per_s": tokens / dt,
        "seeded_tokens_per_s": sum(len(o.token_ids) for o in seeded) / dt_seeded,
        "seeded_same_alone": f"{same}/8",
        "rescore_gap": gap,
        "ok": gap < (1e-4 if dtype == "float32" else 0.1),
    }


def train_case(model_dir: Path, work: Path, device: str, method: str) -> dict[str, Any]:
    """Two whole training steps of the ``paper`` preset (bf16, ZeRO-3) shrunk to the tiny model
    and TWX coin games with the hf backend, then a greedy evaluation of 4 items."""
    from factor_cli.train.evaluate import evaluate, metric
    from factor_cli.train.trainer import Trainer

    cuda = device.startswith("cuda")
    sets = [
        f"method={method}",
        f"model.path={model_dir}",
        f"model.device={device}",
        f"model.dtype={'bfloat16' if cuda else 'float32'}",
        f"engine.precision={'bf16' if cuda else 'fp32'}",
        f"engine.zero_stage={3 if cuda else 1}",
        "env.name=twx",
        "env.games=[coin]",
        "env.max_turns=8",
        "rollout.groups=4",
        "rollout.k=4",
        "rollout.max_new_tokens=32",
        "rollout.max_context=768",
        "rollout.backend=hf",
        "continuations.per_checkpoint=2",
        "continuations.horizon=4",
        "value.hidden=64",
        "optim.lr=1e-4",
        "credit.warmup_steps=1",
        "eval.max_items=4",
        "steps=2",
        f"output_dir={work / 'runs'}",
    ]
    cfg = load_config("paper", sets)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, str(model_dir))
    try:
        setup = time.perf_counter() - t0
        steps = [trainer.train_step().metrics for _ in range(2)]
        saved = trainer.save(work / f"train-{method}", None)
        trainer.engine.save_pretrained(work / f"train-{method}-model", trainer.policy.tokenizer)
        t1 = time.perf_counter()
        items = evaluate(trainer.backend, cfg, cfg.method)
        eval_s = time.perf_counter() - t1
    finally:
        trainer.close()
    last = steps[-1]
    keep = ("loss", "kl", "value_mse", "return_mean", "actions", "action_tokens", "grad_norm")
    finite = all(math.isfinite(v) for m in steps for v in m.values())
    return {
        "case": f"train-{method}-{'bf16-zero3' if cuda else 'fp32-zero1'}",
        "setup_s": setup,
        "step_s": [sum(v for k, v in m.items() if k.startswith("time_")) for m in steps],
        "phases_last": {k: round(v, 3) for k, v in last.items() if k.startswith("time_")},
        "last": {k: last[k] for k in keep if k in last},
        "eval_metric": metric(items),
        "eval_items": len(items),
        "eval_s": eval_s,
        "checkpoint": saved.name,
        "finite": finite,
        "ok": finite and len(items) == 4 and (saved / "state.pt").exists(),
    }


def medium_model(tiny_dir: Path, out: Path) -> Path:
    """A ~110M-parameter Llama with the tiny tokenizer (random weights, for timing only)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    conf = AutoConfig.from_pretrained(tiny_dir)
    conf.update(
        {
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "num_key_value_heads": 12,
            "intermediate_size": 2048,
            "head_dim": 64,
        }
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out_dir", type=Path, help="Folder for gpu_check.json.")
    ap.add_argument("--medium", action="store_true", help="Also time a ~110M Llama (CUDA only).")
    ap.add_argument("--train", action="store_true", help="Two whole training steps per method.")
    args = ap.parse_args()
    out_dir = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": cuda,
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
    }
    try:
        import deepspeed

        report["deepspeed"] = deepspeed.__version__
    except ImportError as e:
        report["deepspeed"] = f"missing: {e}"
    print(json.dumps(report), flush=True)
    work = Path(tempfile.mkdtemp(prefix="factor-gpu-check-"))  # checkpoints stay out of OUT_DIR
    tiny = init_tiny(work / "tiny-5m", "5m", texts=CORPUS, overwrite=True)
    cases = [(0, "fp32", False), (1, "fp32", False), (3, "fp32", False)]
    if cuda:
        cases += [(2, "bf16", False), (3, "bf16", False), (3, "bf16", True)]
    results = []

    def record(r: dict[str, Any]) -> None:
        results.append(r)
        print(json.dumps(r), flush=True)
        (out_dir / "gpu_check.json").write_text(
            json.dumps({**report, "results": results}, indent=1)
        )

    def attempt(case: str, fn: Callable[[], dict[str, Any]], prefix: str = "") -> None:
        """Record ``fn()``'s result, or its error: one failing case must not hide the others."""
        try:
            r = fn()
            r["case"] = prefix + r["case"]
        except Exception as e:
            r = {
                "case": prefix + case,
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc()[-3000:],
            }
        record(r)

    for zero, prec, off in cases:
        attempt(
            f"zero{zero}-{prec}{'-offload' if off else ''}",
            partial(engine_case, tiny, work, device, zero, prec, off, 4, (8, 4, 96, 24)),
        )
    for dtype in ["float32"] + (["bfloat16"] if cuda else []):
        attempt(f"hf-generate-{dtype}", partial(generation_case, tiny, device, dtype, 64))
    if args.medium and cuda:
        med = medium_model(tiny, work / "medium")
        for zero, prec in [(0, "bf16"), (3, "bf16")]:
            attempt(
                f"zero{zero}-{prec}",
                partial(engine_case, med, work, device, zero, prec, False, 3, (32, 4, 512, 128)),
                "medium-",
            )
        attempt(
            "hf-generate-bfloat16",
            partial(generation_case, med, device, "bfloat16", 128),
            "medium-",
        )
    if args.train:
        for method in ("factor", "serl-repro"):
            attempt(f"train-{method}", partial(train_case, tiny, work, device, method))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    by_case = {r["case"]: r for r in results}
    ref = by_case.get("zero0-fp32", {}).get("losses")
    for case in ("zero1-fp32", "zero3-fp32"):
        if ref and "losses" in by_case.get(case, {}):
            # Every stage runs the same update: fp32 losses agree with ZeRO-0's.
            gap = max(abs(a - b) for a, b in zip(ref, by_case[case]["losses"]))
            record({"case": f"{case}-equals-zero0", "max_loss_gap": gap, "ok": gap < 1e-4})
    bad = [r["case"] for r in results if not r.get("ok")]
    print("FAILED: " + ", ".join(bad) if bad else "ALL OK", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
