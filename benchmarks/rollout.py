"""Rollout throughput: root rollouts vs Monte-Carlo continuations (B x M) on TWX, tiny model.

Prints tokens/s and env steps/s for root rollouts and for continuations, the cost of one
continuation interaction relative to one root interaction, and the wall-clock ratio of a
training step's rollout phase with continuations to one without, next to the interaction ratio.
Targets (issue 5): a continuation interaction costs no more than a root one, and the wall-clock
ratio stays below the interaction ratio.

    .venv/bin/python benchmarks/rollout.py [--model DIR] [--groups 4] [--k 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.model import init_tiny, load_policy
from factor_cli.policy.prompting import PromptFormat
from factor_cli.rollout.continuations import run_continuations
from factor_cli.rollout.runner import RolloutRunner, Start

DEFAULT_MODEL = Path("runs/bench-tiny-1m")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="built with init-tiny if missing"
    )
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--budget", type=int, default=2, help="B checkpoints per trajectory")
    ap.add_argument("--per-checkpoint", type=int, default=4, help="M continuations per checkpoint")
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    if not (args.model / "config.json").exists():
        init_tiny(args.model, "1m")
    policy = load_policy(str(args.model))
    gen = HFGenerator(policy, max_new_tokens=args.max_new_tokens, max_context=1024)
    n_root = args.groups * args.k
    n_cont = n_root * args.budget * args.per_checkpoint
    starts = [Start(f"coin/{100 + g}", group=g) for g in range(args.groups) for _ in range(args.k)]
    with EnvPool("twx", max(n_root, n_cont)) as pool:
        runner = RolloutRunner(pool, gen, PromptFormat(), max_turns=args.max_turns)
        runner.run(starts[:2], seed=99)  # warm-up: JIT, JVM, allocator
        runner.env_steps = runner.generated_tokens = 0
        t0 = time.perf_counter()
        roots = runner.run(starts, seed=1)
        t_root = time.perf_counter() - t0
        root_steps, root_tokens = runner.env_steps, runner.generated_tokens
        t0 = time.perf_counter()
        cont = run_continuations(
            runner, roots, "leave-one-out", args.budget, args.per_checkpoint, 15, seed=2
        )
        t_cont = time.perf_counter() - t0
        cont_tokens = runner.generated_tokens - root_tokens
    res = {
        "root_trajectories": n_root,
        "continuations": len(cont.episodes),
        "root_interactions": root_steps,
        "continuation_interactions": cont.interactions,
        "replay_steps": cont.replay_steps,
        "root_s": t_root,
        "continuation_s": t_cont,
        "root_tokens_per_s": root_tokens / t_root,
        "root_steps_per_s": root_steps / t_root,
        "continuation_tokens_per_s": cont_tokens / t_cont,
        "continuation_steps_per_s": cont.interactions / t_cont,
        "cost_per_interaction_ratio": (t_cont / max(cont.interactions, 1)) / (t_root / root_steps),
        "interaction_ratio": (root_steps + cont.interactions) / root_steps,
        "wall_clock_ratio": (t_root + t_cont) / t_root,
    }
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(
        f"root: {n_root} trajectories, {root_steps} interactions in {t_root:.1f} s "
        f"({res['root_steps_per_s']:.1f} steps/s, {res['root_tokens_per_s']:.0f} tokens/s)"
    )
    print(
        f"continuations: {len(cont.episodes)} ({args.budget}x{args.per_checkpoint}), "
        f"{cont.interactions} interactions (+{cont.replay_steps} replay steps) in {t_cont:.1f} s "
        f"({res['continuation_steps_per_s']:.1f} steps/s, "
        f"{res['continuation_tokens_per_s']:.0f} tokens/s)"
    )
    print(
        f"cost of a continuation interaction / a root one: {res['cost_per_interaction_ratio']:.2f} "
        "(target <= 1)"
    )
    print(
        f"wall-clock ratio {res['wall_clock_ratio']:.2f}x vs interaction ratio "
        f"{res['interaction_ratio']:.2f}x (target: below)"
    )


if __name__ == "__main__":
    main()
