"""Rollout throughput: root rollouts vs Monte-Carlo continuations (B x M) on TWX, tiny model.

Prints tokens/s and env steps/s for root rollouts and for continuations, the cost of one
continuation interaction relative to one root interaction, and the wall-clock ratio of a
training step's rollout phase with continuations to one without, next to the interaction ratio.
Targets (issues 5 and 14): a continuation interaction costs at most half a root one, the
wall-clock ratio stays below the interaction ratio, and prefix reuse (``--prefix-reuse``, on
where the backend has it) lifts generated tokens/s. Beside the cost ratio it prints the tokens
the model computed per interaction (prompt tokens prefilled + tokens generated) of each kind:
their ratio is what the cost ratio would be at an equal cost per computed token.

Each of ``--reps`` repetitions plays the same episodes (same seeds) with a fresh backend, so the
prefix cache starts empty as after a weight update, and the medians over repetitions are
reported; ``--json`` prints them with every repetition's row. Before the first repetition every
slot of the environment pool loads its game once, as a trainer's pool does at its first step
(``--cold-slots``: each slot's first load falls inside the timed rollout instead). The script
runs against older checkouts too (no ``prefix_reuse`` there: the counters read as absent).

    .venv/bin/python benchmarks/rollout.py [--model DIR] [--groups 4] [--k 4] [--reps 3]
        [--game coin] [--history-turns 2] [--no-prefix-reuse] [--no-shared-prefix] [--no-stems]
        [--no-merge-duplicates] [--valid-actions [--no-skip-forced]] [--overlap]
        [--cold-slots] [--json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.model import init_tiny, load_policy
from factor_cli.policy.prompting import PromptFormat
from factor_cli.rollout.continuations import run_continuations
from factor_cli.rollout.runner import RolloutRunner, Start

DEFAULT_MODEL = Path("runs/bench-tiny-1m")
COUNTERS = ("prompt_tokens", "prefill_tokens", "reused_tokens", "shared_prefix_tokens")
COMPUTED = (
    "root_computed_tokens_per_interaction",
    "continuation_computed_tokens_per_interaction",
    "computed_tokens_ratio",
)


def _backend(policy: Any, args: argparse.Namespace) -> HFGenerator:
    """A fresh hf backend; ``prefix_reuse`` only where this checkout's backend has it."""
    options: dict[str, Any] = {}
    if "prefix_reuse" in inspect.signature(HFGenerator).parameters:
        options["prefix_reuse"] = args.prefix_reuse
    elif not args.prefix_reuse:
        raise SystemExit("this checkout's hf backend has no prefix_reuse switch")
    if not args.shared_prefix:
        if "shared_prefix_min" not in inspect.signature(HFGenerator).parameters:
            raise SystemExit("this checkout's hf backend has no shared-prefix decode")
        options["shared_prefix_min"] = None
    if not args.stems:
        if "stem_min" not in inspect.signature(HFGenerator).parameters:
            raise SystemExit("this checkout's hf backend prefills no shared stems")
        options["stem_min"] = None
    if not args.merge_duplicates:
        if "merge_duplicates" not in inspect.signature(HFGenerator).parameters:
            raise SystemExit("this checkout's hf backend merges no duplicate requests")
        options["merge_duplicates"] = False
    if not args.skip_forced:
        if "skip_forced" not in inspect.signature(HFGenerator).parameters:
            raise SystemExit("this checkout's hf backend skips no forced tokens")
        options["skip_forced"] = False
    return HFGenerator(policy, max_new_tokens=args.max_new_tokens, max_context=1024, **options)


def _runner(pool: EnvPool, gen: HFGenerator, args: argparse.Namespace) -> RolloutRunner:
    """The runner, its replies constrained to the admissible actions with ``--valid-actions``."""
    fmt = PromptFormat(history_turns=args.history_turns)
    if not args.valid_actions:
        return RolloutRunner(pool, gen, fmt, max_turns=args.max_turns)
    if "constrain" not in inspect.signature(RolloutRunner).parameters:
        raise SystemExit("this checkout's rollout runner has no valid-action decoding")
    return RolloutRunner(pool, gen, fmt, max_turns=args.max_turns, constrain=True)


def _counters(gen: HFGenerator) -> dict[str, int | None]:
    return {c: getattr(gen, c, None) for c in COUNTERS}


def one_rep(policy: Any, pool: EnvPool, args: argparse.Namespace) -> dict[str, Any]:
    """Roots then continuations with a fresh backend; seconds, interactions and tokens."""
    gen = _backend(policy, args)
    runner = _runner(pool, gen, args)
    n_root = args.groups * args.k
    starts = [
        Start(f"{args.game}/{100 + g}", group=g) for g in range(args.groups) for _ in range(args.k)
    ]
    t0 = time.perf_counter()
    roots = runner.run(starts, seed=1)
    t_root = time.perf_counter() - t0
    root_steps, root_tokens = runner.env_steps, runner.generated_tokens
    root_counts = _counters(gen)
    t0 = time.perf_counter()
    cont = run_continuations(
        runner, roots, "leave-one-out", args.budget, args.per_checkpoint, 15, seed=2
    )
    t_cont = time.perf_counter() - t0
    cont_tokens = runner.generated_tokens - root_tokens
    counts = _counters(gen)
    return {
        **_computed_work(
            {**root_counts, "generated_tokens": root_tokens},
            {**counts, "generated_tokens": runner.generated_tokens},
            root_steps,
            cont.interactions,
        ),
        "root_trajectories": n_root,
        "continuations": len(cont.episodes),
        "root_interactions": root_steps,
        "continuation_interactions": cont.interactions,
        "replay_steps": cont.replay_steps,
        "root_generated_tokens": root_tokens,
        "continuation_generated_tokens": cont_tokens,
        **{f"root_{c}": v for c, v in root_counts.items()},
        **counts,
        "root_s": t_root,
        "continuation_s": t_cont,
        "root_tokens_per_s": root_tokens / t_root,
        "root_steps_per_s": root_steps / t_root,
        "continuation_tokens_per_s": cont_tokens / t_cont,
        "continuation_steps_per_s": cont.interactions / t_cont,
        "generated_tokens_per_s": (root_tokens + cont_tokens) / (t_root + t_cont),
        "s_per_interaction": (t_root + t_cont) / (root_steps + cont.interactions),
        "cost_per_interaction_ratio": (t_cont / max(cont.interactions, 1)) / (t_root / root_steps),
        "interaction_ratio": (root_steps + cont.interactions) / root_steps,
        "wall_clock_ratio": (t_root + t_cont) / t_root,
    }


def _computed_work(
    root: dict[str, Any], total: dict[str, Any], root_steps: int, cont_steps: int
) -> dict[str, float | None]:
    """Tokens the model computed (prompt tokens prefilled + tokens generated) per root and per
    continuation interaction, and their ratio: the continuation / root cost ratio at an equal
    cost per computed token, which the measured one can undercut only by the continuations'
    larger batches paying less overhead per token."""
    if root["prefill_tokens"] is None or total["prefill_tokens"] is None:
        return dict.fromkeys(COMPUTED)
    per_root = (root["prefill_tokens"] + root["generated_tokens"]) / max(root_steps, 1)
    per_cont = sum(total[c] - root[c] for c in ("prefill_tokens", "generated_tokens"))
    per_cont /= max(cont_steps, 1)
    return dict(zip(COMPUTED, (per_root, per_cont, per_cont / per_root)))


def one_overlapped_rep(policy: Any, pool: EnvPool, args: argparse.Namespace) -> dict[str, Any]:
    """Roots with their continuations started as each root ends (``continuations.overlap``,
    the trainer's default): one wall time for both, so no per-phase cost ratio."""
    from factor_cli.rollout.continuations import ContinuationPlan
    from factor_cli.rollout.runner import Job

    gen = _backend(policy, args)
    runner = _runner(pool, gen, args)
    starts = [
        Start(f"{args.game}/{100 + g}", group=g) for g in range(args.groups) for _ in range(args.k)
    ]
    plan = ContinuationPlan(args.budget, args.per_checkpoint, 15, seed=2)
    t0 = time.perf_counter()
    roots, followed = runner.play([Job(s, i, seed=1) for i, s in enumerate(starts)], plan.jobs)
    elapsed = time.perf_counter() - t0
    cont = plan.result(roots, range(len(roots)), followed, "leave-one-out")
    root_steps = sum(len(r.turns) for r in roots)
    steps = runner.env_steps
    return {
        "root_trajectories": len(roots),
        "continuations": len(cont.episodes),
        "root_interactions": root_steps,
        "continuation_interactions": cont.interactions,
        "replay_steps": cont.replay_steps,
        "generated_tokens": runner.generated_tokens,
        **_counters(gen),
        "rollout_s": elapsed,
        "generated_tokens_per_s": runner.generated_tokens / elapsed,
        "steps_per_s": steps / elapsed,
        "s_per_interaction": elapsed / steps,
        "interaction_ratio": steps / root_steps,
    }


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per field, the median over repetitions (None where a checkout lacks the counter)."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        vals = [r[key] for r in rows]
        out[key] = None if any(v is None for v in vals) else statistics.median(vals)
    return out


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
    ap.add_argument("--game", default="coin", help="TWX game (coin, cookingworld, ...)")
    ap.add_argument(
        "--history-turns", type=int, default=2, help="prompt.history_turns (large: append-only)"
    )
    ap.add_argument("--no-prefix-reuse", dest="prefix_reuse", action="store_false")
    ap.add_argument(
        "--no-shared-prefix",
        dest="shared_prefix",
        action="store_false",
        help="decode without holding a prefix shared by every row once (shared_attention)",
    )
    ap.add_argument(
        "--no-stems",
        dest="stems",
        action="store_false",
        help="prefill each prompt's own suffix, without first prefilling once what several "
        "prompts of a batch share past the cache (stems.shared_stems)",
    )
    ap.add_argument(
        "--no-merge-duplicates",
        dest="merge_duplicates",
        action="store_false",
        help="decode a row per request, without sharing one row among requests with the same "
        "prompt while their replies agree (duplicates.duplicate_rows)",
    )
    ap.add_argument(
        "--valid-actions",
        action="store_true",
        help="constrain every reply to an admissible action (rollout.valid_action_decoding, "
        "as the smoke preset does); the untrained model then picks among them",
    )
    ap.add_argument(
        "--no-skip-forced",
        dest="skip_forced",
        action="store_false",
        help="with --valid-actions: a forward per reply token, also for tokens the actions "
        "force (the <action> tag, the rest of the only action with a prefix)",
    )
    ap.add_argument(
        "--overlap",
        action="store_true",
        help="start continuations as their root ends (the trainer's default); one wall time",
    )
    ap.add_argument(
        "--cold-slots",
        dest="warm_slots",
        action="store_false",
        help="leave the pool's slots unloaded before the first repetition (each slot's first "
        "game then loads the engine's interface inside the timed rollout, as before 2026-12-02)",
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions; medians are reported")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.skip_forced and not args.valid_actions:
        ap.error("--no-skip-forced needs --valid-actions (free replies have no forced tokens)")
    torch.manual_seed(0)
    if not (args.model / "config.json").exists():
        init_tiny(args.model, "1m")
    policy = load_policy(str(args.model))
    n_root = args.groups * args.k
    n_cont = n_root * args.budget * args.per_checkpoint
    with EnvPool("twx", n_root + n_cont if args.overlap else max(n_root, n_cont)) as pool:
        warm = RolloutRunner(pool, _backend(policy, args), PromptFormat(), max_turns=3)
        warm.run([Start(f"{args.game}/{100}")] * 2, seed=99)  # warm-up: JIT, JVM, allocator
        if args.warm_slots:
            # A slot's first game loads the engine's interface (~80 ms, once per slot for the
            # pool's life): a trainer's pool pays it at its first step, not every rollout.
            for slot in range(len(pool)):
                pool.reset(slot, f"{args.game}/{100}")
        rep = one_overlapped_rep if args.overlap else one_rep
        rows = [rep(policy, pool, args) for _ in range(args.reps)]
    res = medians(rows)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        print(json.dumps({"median": res, "reps": rows}, indent=1))
        return
    _print(res, args)


def _print(res: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"medians of {args.reps} repetitions ({args.game}, history_turns={args.history_turns}, "
        f"prefix reuse {'on' if args.prefix_reuse else 'off'}"
        + (", valid actions" if args.valid_actions else "")
        + ")"
    )
    if "rollout_s" in res:  # --overlap: one wall time for roots and continuations
        print(
            f"roots and continuations together: {res['root_interactions']} + "
            f"{res['continuation_interactions']} interactions (+{res['replay_steps']} replay "
            f"steps) in {res['rollout_s']:.1f} s: {res['generated_tokens_per_s']:.0f} generated "
            f"tokens/s, {res['s_per_interaction'] * 1000:.1f} ms per interaction; "
            f"peak RSS {res['peak_rss_mib']:.0f} MiB"
        )
        return
    print(
        f"root: {res['root_trajectories']} trajectories, {res['root_interactions']} interactions "
        f"in {res['root_s']:.1f} s ({res['root_steps_per_s']:.1f} steps/s, "
        f"{res['root_tokens_per_s']:.0f} tokens/s)"
    )
    print(
        f"continuations: {res['continuations']} ({args.budget}x{args.per_checkpoint}), "
        f"{res['continuation_interactions']} interactions (+{res['replay_steps']} replay steps) "
        f"in {res['continuation_s']:.1f} s ({res['continuation_steps_per_s']:.1f} steps/s, "
        f"{res['continuation_tokens_per_s']:.0f} tokens/s)"
    )
    print(
        f"all: {res['generated_tokens_per_s']:.0f} generated tokens/s, "
        f"{res['s_per_interaction'] * 1000:.1f} ms per interaction"
    )
    if res["prompt_tokens"] is not None:
        print(
            f"prompt tokens {res['prompt_tokens']}: {res['prefill_tokens']} prefilled, "
            f"{res['reused_tokens']} reused ({res['reused_tokens'] / res['prompt_tokens']:.0%})"
        )
    print(
        f"cost of a continuation interaction / a root one: {res['cost_per_interaction_ratio']:.2f} "
        "(target <= 0.5)"
    )
    if res["computed_tokens_ratio"] is not None:
        print(
            "tokens computed (prefilled + generated) per interaction: roots "
            f"{res['root_computed_tokens_per_interaction']:.1f}, continuations "
            f"{res['continuation_computed_tokens_per_interaction']:.1f}: ratio "
            f"{res['computed_tokens_ratio']:.2f}, the cost ratio at an equal cost per token"
        )
    print(
        f"wall-clock ratio {res['wall_clock_ratio']:.2f}x vs interaction ratio "
        f"{res['interaction_ratio']:.2f}x (target: below)"
    )
    print(f"peak RSS {res['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
