"""Seconds per training step by phase (rollout, continuations, value, teacher, update) for grpo,
serl-repro and factor on the smoke preset (tiny model, TWX coin, CPU).

    .venv/bin/python benchmarks/train.py [--methods grpo,serl-repro,factor] [--steps 4]
        [--set rollout.prefix_reuse=false] [--json]

Each method trains ``--steps`` steps from the same model; the first step is left out (it
includes one-off costs such as the value-head warm-up) and the medians of the others are
reported, with the interactions, generated tokens and prefilled prompt tokens of each step
(``prefill_tokens``: those whose KV the backend computed; ``reused_prefill_tokens``: those it
took from its prefix cache). Raw step times are noisy because each method's (and each step's)
episodes differ, so compare seconds per interaction (``s_per_interaction``) and, between methods
at equal root work, seconds per root interaction (``s_per_root_interaction``). ``--json`` prints
the medians and every step's row. Runs against older checkouts too (their backend has no
prefix-reuse counters: those read as None). With ``continuations.overlap`` (the default)
FACTOR's continuations play inside the rollout phase, so its ``rollout`` column covers both and
``continuations`` reads 0; ``--set continuations.overlap=false`` times them apart. The smoke
preset has M = 2 continuations per checkpoint; issue 14's FACTOR / SERL target is stated at
B = 2, M = 4: ``--set continuations.per_checkpoint=4``.

``--methods factor,vineppo`` times VinePPO's Monte-Carlo values (K = ``continuations.per_state``
continuations from every interior state, no value head) against FACTOR's value head (B x M
continuations per root) side by side (issue 37). The last lines give every method's medians as
multiples of the first method's: under load only these ratios within one run mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import sys
import time
from typing import Any

from factor_cli.train.config import load_config
from factor_cli.train.run import warm_start
from factor_cli.train.trainer import Trainer

PHASES = ("rollout", "continuations", "value", "teacher", "update")
COUNTERS = ("reused_tokens", "prefill_tokens")
"""The backend's prompt tokens taken from earlier computation, and those whose KV it computed."""


def _counter(trainer: Trainer, name: str) -> int | None:
    """A generation counter of the trainer's backend (None where an older checkout lacks it)."""
    return getattr(trainer.backend, name, None)


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None else after - (before or 0)


def method_rows(method: str, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    """One row per training step of ``method``: seconds by phase, interactions, tokens."""
    cfg = load_config("smoke", [f"method={method}", *overrides])
    model = warm_start(cfg, lambda *a: None, lambda s: None)
    trainer = Trainer(cfg, model)
    rows = []
    try:
        for _ in range(steps):
            tokens0 = trainer.runner.generated_tokens
            before = {c: _counter(trainer, c) for c in COUNTERS}
            t0 = time.perf_counter()
            m = trainer.train_step().metrics
            total = time.perf_counter() - t0
            counts = {c: _delta(_counter(trainer, c), before[c]) for c in COUNTERS}
            root, cont = m["root_interactions"], m["continuation_interactions"]
            rows.append(
                {
                    "method": method,
                    "step_s": total,
                    **{p: m.get(f"time_{p}", 0.0) for p in PHASES},
                    "root_interactions": root,
                    "continuation_interactions": cont,
                    "interactions": root + cont,
                    "generated_tokens": trainer.runner.generated_tokens - tokens0,
                    "reused_prefill_tokens": counts["reused_tokens"],
                    "prefill_tokens": counts["prefill_tokens"],
                    "s_per_interaction": total / max(root + cont, 1),
                    "s_per_root_interaction": total / max(root, 1),
                    "generation_s_per_interaction": (
                        m.get("time_rollout", 0.0) + m.get("time_continuations", 0.0)
                    )
                    / max(root + cont, 1),
                }
            )
    finally:
        trainer.close()
    return rows


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Field-wise medians over the steps after the first."""
    kept = rows[1:] or rows
    out: dict[str, Any] = {"method": rows[0]["method"], "steps": len(kept)}
    for key, val in rows[0].items():
        if key == "method":
            continue
        vals = [r[key] for r in kept]
        out[key] = None if val is None else statistics.median(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--methods", default="grpo,serl-repro,factor")
    ap.add_argument("--steps", type=int, default=4, help="steps per method (the first is left out)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints as it loads its ops
        per_step = {m: method_rows(m, args.steps, args.overrides) for m in args.methods.split(",")}
    medians = [median_row(rows) for rows in per_step.values()]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        rel = {r["method"]: ratios(r, medians[0]) for r in medians[1:]}
        out = {"median": medians, "ratios_to_first": rel, "steps": per_step, "peak_rss_mib": peak}
        print(json.dumps(out, indent=1))
        return
    print(
        f"{'method':12s} {'step':>7s} "
        + " ".join(f"{p:>13s}" for p in PHASES)
        + "  root+cont interactions  s/interaction  s/root interaction  tokens"
    )
    for r in medians:
        print(
            f"{r['method']:12s} {r['step_s']:6.1f}s "
            + " ".join(f"{r[p]:12.1f}s" for p in PHASES)
            + f"  {r['root_interactions']:.0f}+{r['continuation_interactions']:.0f}"
            + f"  {r['s_per_interaction']:.4f}  {r['s_per_root_interaction']:.4f}"
            + f"  {r['generated_tokens']:.0f}"
        )
    print(f"medians over {medians[0]['steps']} steps per method; peak RSS {peak:.0f} MiB")
    for r in medians[1:]:
        print(f"{r['method']} / {medians[0]['method']}: " + ratio_line(r, medians[0]))


RATIOS = ("step_s", "rollout", "update", "interactions", "generated_tokens")
"""Compared between methods (not ``continuations``: with overlap it is ~0 s, inside rollout)."""


def ratios(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """``row``'s medians as multiples of ``base``'s (None where the base's is 0)."""
    return {k: row[k] / base[k] if base[k] else None for k in RATIOS}


def ratio_line(row: dict[str, Any], base: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:.2f}x" if v is not None else f"{k} n/a" for k, v in ratios(row, base).items()
    )


if __name__ == "__main__":
    main()
