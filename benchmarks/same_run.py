"""Are two runs of the main job the same, bit for bit? Every per-step metric but the timings,
every eval record, the item-level results and the exported model's weights, of the one run
under each of two project roots (e.g. git worktrees of two commits, each having run
`factor train`):

    .venv/bin/python benchmarks/same_run.py ../old-root ../new-root

Exits 1 when anything differs. Used to check that a restructuring changed no number
(docs/benchmarks.md, "Same numbers").
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def run_dir(root: Path) -> Path:
    """The one run folder under ``root/runs`` with per-step metrics."""
    found = [p for p in (root / "runs").iterdir() if (p / "metrics.jsonl").exists()]
    if len(found) != 1:
        raise SystemExit(f"{root}/runs: expected one run folder with metrics, found {len(found)}")
    return found[0]


def records(path: Path) -> list[dict]:
    """JSON lines without the timing fields (wall-clock time is never the same twice)."""
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out.append(
            {k: v for k, v in rec.items() if not k.startswith("time") and "seconds" not in k}
        )
    return out


def weights(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((run / "model").glob("*.safetensors"))}  # fmt: skip


def main(argv: list[str]) -> int:
    a, b = (run_dir(Path(r)) for r in argv[1:3])
    checks = {
        "per-step metrics": records(a / "metrics.jsonl") == records(b / "metrics.jsonl"),
        "eval records": records(a / "evals.jsonl") == records(b / "evals.jsonl"),
        "model weights": weights(a) == weights(b),
    }
    for name in ("eval_items_start.csv", "eval_items.csv"):
        if (a / name).exists() or (b / name).exists():
            checks[name] = (a / name).read_bytes() == (b / name).read_bytes()
    steps = len(records(a / "metrics.jsonl"))
    for name, same in checks.items():
        print(f"{name}: {'same' if same else 'DIFFERENT'}")
    print(
        f"{steps} steps; eval success {[r.get('eval_metric') for r in records(a / 'evals.jsonl')]}"
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
