"""Environment throughput and restore cost.

For each available environment: steps/s of plain play (gold or sampled valid actions), reset
time, and the cost of a restore (reset + replay with observation checks) at depth 5 and 20.

    .venv/bin/python benchmarks/envs.py [--envs twx,scienceworld] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from factor_cli.envs import availability, make_env

CASES = {
    "twx": ["cookingworld/3", "coin/11"],
    "scienceworld": ["boil/L0/3"],
    "alfworld": [],  # filled from the data root's manifest rows at run time
}


def actions_for(env, instance: str, depth: int, rng: random.Random) -> list[str]:
    """A legal action sequence of at least ``depth`` steps: the gold path, then valid actions."""
    try:
        seq = env.gold_actions(instance)[: depth + 1]
    except Exception:
        seq = []
    env.reset(instance)
    out = []
    for a in seq[:-1]:
        env.step(a)
        out.append(a)
    while len(out) < depth and not env.done:
        valid = [v for v in env.valid_actions() if not v.startswith(("eat", "focus"))] or [
            "look around"
        ]
        a = rng.choice(valid)
        env.step(a)
        out.append(a)
    return out


def alfworld_case() -> list[str]:
    from factor_cli.envs.alfworld import resolve_data_root
    from factor_cli.envs.alfworld_gen import split_rows

    try:
        rows = split_rows(resolve_data_root(), 0)
    except Exception:
        return []
    return [r["instance_id"] for r in rows if r["category"] == "pick_heat_then_place_in_recep"][:1]


def measure(name: str, repeats: int) -> dict:
    rng = random.Random(0)
    res: dict = {"env": name}
    with make_env(name) as env:
        instance = CASES[name][0]
        seq = actions_for(env, instance, 20, rng)
        recorded = [env.reset(instance)]
        t0 = time.perf_counter()
        for a in seq:
            recorded.append(env.step(a).observation)
        play = time.perf_counter() - t0
        res["steps_per_s"] = len(seq) / play
        resets = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            env.reset(instance)
            resets.append(time.perf_counter() - t0)
        res["reset_ms"] = 1e3 * statistics.median(resets)
        for depth in (5, 20):
            if len(seq) < depth:
                res[f"restore_{depth}_ms"] = None
                continue
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                env.restore(instance, seq[:depth], recorded[: depth + 1])
                times.append(time.perf_counter() - t0)
            res[f"restore_{depth}_ms"] = 1e3 * statistics.median(times)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--envs", default="twx,scienceworld,alfworld")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    if "alfworld" in args.envs and availability("alfworld") is None:
        CASES["alfworld"] = alfworld_case()
    for name in args.envs.split(","):
        missing = availability(name) if name in CASES else "no benchmark case"
        if missing or not CASES.get(name):
            rows.append({"env": name, "skipped": missing or "no instance available"})
            continue
        rows.append(measure(name, args.repeats))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        if "skipped" in r:
            print(f"{r['env']:13s} skipped: {r['skipped']}")
            continue
        r5 = r["restore_5_ms"]
        r20 = r["restore_20_ms"]
        print(
            f"{r['env']:13s} {r['steps_per_s']:8.0f} steps/s  reset {r['reset_ms']:7.1f} ms  "
            f"restore@5 {r5 if r5 is None else f'{r5:.1f} ms'}  "
            f"restore@20 {r20 if r20 is None else f'{r20:.1f} ms'}"
        )


if __name__ == "__main__":
    main()
