"""A local study's wall-clock with several cells in flight: does splitting the cores between
the cells help?

    .venv/bin/python benchmarks/parallel_cells.py [--max-parallel 2] [--cells 2] [--steps 3]
        [--method grpo] [--warm-start] [--json]

Runs ``factor study run`` on a throw-away spec (``--cells`` seeds of one method on the smoke
preset, no warm start, ``--steps`` steps, 20 eval items) in a temporary folder with its own
ledger, and prints the study's wall-clock seconds and every cell's median seconds per training
step (rollout + continuations + value + teacher + update, the first step left out).
``--warm-start`` keeps the preset's warm start (built per seed in the temporary folder, about a
minute each, inside the wall-clock but not the step medians): a warm-started policy plays and
trains like a study's cells, an untrained one does not. Thread settings reach the cells through
the environment (``OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python ...``).

Every cell is a ``python -m factor_cli train`` child, so the checkout the benchmark measures is
the one the children import: against an older commit, put its worktree first on the path
(``PYTHONPATH=/tmp/old .venv/bin/python benchmarks/parallel_cells.py``). Pair two checkouts
with ``farm-bench --vs``, as docs/benchmarks.md ("Cells in parallel") does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PHASES = ("rollout", "continuations", "value", "teacher", "update")
SPEC = """\
name: parallel-bench
title: "benchmark: cells in parallel"
base: smoke
envs: [twx]
seeds: {seeds}
set:
  steps: {steps}
  sft.enabled: {warm_start}
  eval.max_items: 20
  eval.every: {steps}
rows:
  - {{name: {method}}}
"""


def run(
    max_parallel: int, cells: int, steps: int, method: str, warm_start: bool = False
) -> dict[str, Any]:
    """The study's wall-clock and each cell's median step seconds."""
    with tempfile.TemporaryDirectory(prefix="factor-parallel-") as tmp:
        root = Path(tmp)
        spec = root / "spec.yaml"
        seeds = list(range(1, cells + 1))
        spec.write_text(
            SPEC.format(seeds=seeds, steps=steps, method=method, warm_start=str(warm_start).lower())
        )
        command = [
            sys.executable, "-m", "factor_cli", "study", "run", str(spec),
            "--max-parallel", str(max_parallel),
            "--set", f"output_dir={root}/runs", "--set", f"tracking_uri=sqlite:///{root}/m.db",
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"study failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        step_s = [_median_step(p) for p in sorted(root.rglob("metrics.jsonl"))]
    if len(step_s) != cells:
        raise SystemExit(f"expected {cells} runs' metrics, found {len(step_s)}")
    return {"max_parallel": max_parallel, "cells": cells, "steps": steps, "method": method,
            "warm_start": warm_start, "wall_s": wall, "median_step_s": step_s}  # fmt: skip


def _median_step(metrics: Path) -> float:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    totals = [sum(r.get(f"time_{p}", 0.0) or 0.0 for p in PHASES) for r in rows if r["step"] > 1]
    return statistics.median(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-parallel", type=int, default=2)
    parser.add_argument("--cells", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--method", default="grpo")
    parser.add_argument("--warm-start", action="store_true", help="Keep the preset's warm start.")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.max_parallel, args.cells, args.steps, args.method, args.warm_start)
    if args.json:
        print(json.dumps(result))
        return
    steps = ", ".join(f"{s:.1f}" for s in result["median_step_s"])
    print(f"{result['cells']} cells, --max-parallel {result['max_parallel']}: "
          f"{result['wall_s']:.0f} s wall; median s per step by cell: {steps}")  # fmt: skip


if __name__ == "__main__":
    main()
