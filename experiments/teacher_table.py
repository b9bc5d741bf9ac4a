"""The warm-start variants' table of docs/learning.md ("Teaching the teacher to read the
feedback"), rendered from the files experiments/teacher_warm_start.sh writes under
docs/results/teacher/ (no model is run):

    python experiments/teacher_table.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "teacher"
VARIANTS = {
    "t0": "shipped (student prompts, 2 epochs)",
    "e4": "shipped, 4 epochs (t1's optimizer steps)",
    "t1": "+ teacher-format examples",
    "h": "+ teacher-format examples + 60 hindsight walks",
    "h4": "+ teacher-format examples + 240 hindsight walks",
}


def _ci(row: dict, mean: str, low: str, high: str) -> str:
    return f"{row[mean]:+.3f} [{row[low]:+.3f}, {row[high]:+.3f}]"


def rows() -> list[str]:
    out = []
    found = {re.match(r"gap-s(\d+)-(\w+)\.json$", p.name) for p in RESULTS.glob("gap-*.json")}
    keys = sorted({(int(m[1]), m[2]) for m in found if m}, key=lambda k: (k[0] != 42, k[0]))
    for seed, variant in sorted(keys, key=lambda k: (k[0] != 42, k[0], list(VARIANTS).index(k[1]))):
        table = {
            r["source"]: r
            for r in json.loads((RESULTS / f"gap-s{seed}-{variant}.json").read_text())["table"]
        }
        ev = RESULTS / f"eval-s{seed}-{variant}.json"
        greedy = f"{json.loads(ev.read_text())['metric']:.2f}" if ev.exists() else "-"
        s, g = table["sampled"], table["gold"]
        out.append(
            f"| {seed} | {VARIANTS[variant]} | {greedy} | {s['success']:.2f} | "
            f"{_ci(s, 'true_minus_shuffled', 'ci_low', 'ci_high')} | "
            f"{_ci(s, 'true_minus_none', 'none_ci_low', 'none_ci_high')} | {s['gain_true']:+.3f} | "
            f"{_ci(g, 'true_minus_shuffled', 'ci_low', 'ci_high')} |"
        )
    return out


HEADER = (
    "| seed | warm start | greedy start success | sampled start success | "
    "sampled plays: true - shuffled [95% CI] | true - none | gain, true | "
    "gold plays: true - shuffled |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
)

if __name__ == "__main__":
    print("\n".join([HEADER, *rows()]))
