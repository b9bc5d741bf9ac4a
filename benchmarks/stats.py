"""Time the hierarchical bootstrap at the issue's size: 10,000 replicates x 3 seeds x 1,000 items.

    .venv/bin/python benchmarks/stats.py [--replicates 10000] [--seeds 3] [--items 1000]

Synthetic paired binary successes in 6 categories (ALFWorld-like); prints the best and median
wall time of several repeats for both resampling methods (``counts``, the default, and the
literal ``items`` draw). Target: under one second for the default.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from factor_cli.stats import hierarchical_bootstrap


def synthetic(seeds: int, items: int, rng: np.random.Generator) -> tuple[list, list]:
    """Per seed: d = a - b of correlated binary successes, and a category per item."""
    diffs, strata = [], []
    for _ in range(seeds):
        category = rng.integers(0, 6, size=items)
        ease = rng.random(items)
        a = ease < 0.82
        b = (ease + rng.normal(scale=0.05, size=items)) < 0.80
        diffs.append(a.astype(np.float64) - b)
        strata.append(category)
    return diffs, strata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=10_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    diffs, strata = synthetic(args.seeds, args.items, np.random.default_rng(0))
    size = f"{args.replicates:,} replicates x {args.seeds} seeds x {args.items:,} items"
    print(f"hierarchical bootstrap, {size}")
    for method in ("counts", "items"):
        times = []
        for k in range(args.repeats):
            start = time.perf_counter()
            res = hierarchical_bootstrap(diffs, strata, args.replicates, k, method=method)
            times.append(time.perf_counter() - start)
        best, median = min(times), statistics.median(times)
        print(
            f"  method={method:<6}  best {best:.3f} s   median {median:.3f} s"
            f"   (point {100 * res.point:+.2f} pp, CI [{100 * res.ci_low:+.2f}, "
            f"{100 * res.ci_high:+.2f}])"
        )
    print("target: < 1 s for the default method (counts)")


if __name__ == "__main__":
    main()
