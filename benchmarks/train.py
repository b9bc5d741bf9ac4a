"""Seconds per training step by phase (rollout, continuations, value, teacher, update) for grpo,
serl-repro and factor on the smoke preset (tiny model, TWX coin, CPU).

    .venv/bin/python benchmarks/train.py [--methods grpo,serl-repro,factor] [--steps 2] [--json]

Each method trains ``--steps`` steps from the same model; the last step is reported (the first
includes one-off costs such as the value-head warm-up).
"""

from __future__ import annotations

import argparse
import json
import time

from factor_cli.train.config import load_config
from factor_cli.train.run import warm_start
from factor_cli.train.trainer import Trainer

PHASES = ("rollout", "continuations", "value", "teacher", "update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--methods", default="grpo,serl-repro,factor")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for method in args.methods.split(","):
        cfg = load_config("smoke", [f"method={method}", *args.overrides])
        model = warm_start(cfg, lambda *a: None, lambda s: None)
        trainer = Trainer(cfg, model)
        try:
            for _ in range(args.steps):
                t0 = time.perf_counter()
                m = trainer.train_step().metrics
                total = time.perf_counter() - t0
        finally:
            trainer.close()
        rows.append(
            {
                "method": method,
                "step_s": total,
                **{p: m.get(f"time_{p}", 0.0) for p in PHASES},
                "interactions": m["root_interactions"] + m["continuation_interactions"],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'method':12s} {'step':>7s} " + " ".join(f"{p:>13s}" for p in PHASES) + "  interactions"
    )
    for r in rows:
        print(
            f"{r['method']:12s} {r['step_s']:6.1f}s "
            + " ".join(f"{r[p]:12.1f}s" for p in PHASES)
            + f"  {r['interactions']:.0f}"
        )


if __name__ == "__main__":
    main()
