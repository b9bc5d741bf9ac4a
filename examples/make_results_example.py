"""Write SYNTHETIC example files for `factor stats` (deterministic; no model was trained).

The numbers are drawn from a toy generative model loosely shaped like the paper's setting
(ALFWorld's six categories with its evaluation sizes, a one-category WebShop, ScienceWorld task
type x level cells): they exercise the commands and show the file format; they are not results.

    python examples/make_results_example.py                      # the two committed files
    python examples/make_results_example.py --study protocol --output /tmp/protocol.csv
    python examples/make_results_example.py --study transfer --output /tmp/transfer.csv
    python examples/make_results_example.py --study budget --output /tmp/budget.csv

Model: item i has a difficulty z_i ~ N(0, 1) shared by every method and seed; a run (method,
seed) succeeds on it when z_i + e < Phi^-1(p) * sqrt(1 + sigma^2), e ~ N(0, sigma^2), which makes
p the expected success rate of the item's category and keeps methods strongly paired.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

HERE = Path(__file__).resolve().parent
SEEDS = (42, 43, 1337)
SIGMA = 0.5  # run-level noise on top of the shared item difficulty
ALFWORLD = {"pick": 22, "look": 24, "clean": 31, "heat": 23, "cool": 21, "pick2": 13}
WEBSHOP_ITEMS = 100
SCIWORLD_TYPES, SCIWORLD_LEVELS, SCIWORLD_PER_CELL = 10, 3, 2

# Expected success per method: ALFWorld per category, then WebShop and ScienceWorld overall.
RATES: dict[str, tuple[tuple[float, ...], float, float]] = {
    "GRPO": ((0.89, 0.83, 0.84, 0.71, 0.68, 0.57), 0.64, 0.36),
    "SERL-Repro": ((0.94, 0.94, 0.90, 0.97, 0.76, 0.86), 0.80, 0.45),
    "w/o TAC": ((0.94, 0.95, 0.90, 0.97, 0.77, 0.86), 0.80, 0.45),
    "FACTOR": ((0.94, 0.99, 0.91, 0.98, 0.79, 0.88), 0.82, 0.49),
}


def items(rng: np.random.Generator) -> pd.DataFrame:
    """The evaluation items of the three environments with their shared difficulty z_i."""
    rows = []
    for cat, n in ALFWORLD.items():
        rows += [("alfworld", f"alf-{cat}-{k:02d}", cat) for k in range(n)]
    rows += [("webshop", f"ws-{k:03d}", "all") for k in range(WEBSHOP_ITEMS)]
    for t in range(SCIWORLD_TYPES):
        for lv in range(SCIWORLD_LEVELS):
            rows += [
                ("scienceworld", f"sw-t{t:02d}-L{lv}-{k}", f"t{t:02d}/L{lv}")
                for k in range(SCIWORLD_PER_CELL)
            ]
    frame = pd.DataFrame(rows, columns=["env", "item_id", "category"])
    frame["z"] = rng.normal(size=len(frame))
    return frame


def item_rates(frame: pd.DataFrame, method: str, shift: float) -> np.ndarray:
    """Expected success p_i of every item for ``method``, moved by ``shift`` (clipped)."""
    alf, ws, sw = RATES[method]
    by_cat = dict(zip(ALFWORLD, alf, strict=True))
    p = np.where(
        frame["env"] == "alfworld",
        frame["category"].map(by_cat).fillna(0.0),
        np.where(frame["env"] == "webshop", ws, sw),
    )
    # ScienceWorld: harder levels are harder (L0 +6 pp, L2 -6 pp around the mean).
    level = frame["category"].str.extract(r"/L(\d)$")[0].astype(float).fillna(1.0).to_numpy()
    p = p + np.where(frame["env"] == "scienceworld", 0.06 * (1.0 - level), 0.0)
    return np.clip(p + shift, 0.01, 0.995)


def run(
    frame: pd.DataFrame, method: str, seed: int, rng: np.random.Generator, shift: float = 0.0
) -> pd.DataFrame:
    """One run's item rows: success from the threshold model, and a score per environment."""
    p = item_rates(frame, method, shift + rng.normal(scale=0.01))
    noise = rng.normal(scale=SIGMA, size=len(frame))
    success = (frame["z"].to_numpy() + noise < norm.ppf(p) * np.sqrt(1 + SIGMA**2)).astype(int)
    partial = np.round(rng.uniform(0, 95, size=len(frame)), 1)
    env = frame["env"].to_numpy()
    score = np.where(success == 1, 100.0, np.where(env == "alfworld", 0.0, partial))
    score = np.where(env == "alfworld", success.astype(float), score)
    out = frame[["env", "item_id", "category"]].copy()
    out.insert(1, "method", method)
    out.insert(2, "seed", seed)
    out["success"] = success
    out["score"] = score
    return out


def main_results(rng: np.random.Generator) -> pd.DataFrame:
    frame = items(rng)
    runs = [run(frame, m, s, rng) for m in RATES for s in SEEDS]
    return pd.concat(runs, ignore_index=True)


def protocol_results(rng: np.random.Generator) -> pd.DataFrame:
    """2 reductions x {SERL-Repro, FACTOR}; token-mean costs a little, more for FACTOR."""
    frame = items(rng)
    parts = []
    for reduction, shift in (("token-mean", -0.015), ("action-mean", 0.0)):
        for m in ("SERL-Repro", "FACTOR"):
            extra = -0.01 if (m == "FACTOR" and reduction == "token-mean") else 0.0
            for s in SEEDS:
                parts.append(run(frame, m, s, rng, shift + extra).assign(reduction=reduction))
    return pd.concat(parts, ignore_index=True)


def transfer_results(rng: np.random.Generator) -> pd.DataFrame:
    frame = items(rng)
    parts = []
    for backbone, shift in (("qwen2.5-14b", 0.02), ("llama-3.1-8b", -0.03)):
        for m in ("SERL-Repro", "FACTOR"):
            for s in SEEDS:
                parts.append(run(frame, m, s, rng, shift).assign(backbone=backbone))
    return pd.concat(parts, ignore_index=True)


def budget_results(rng: np.random.Generator) -> pd.DataFrame:
    """FACTOR at six B x M budgets against SERL-Repro, seed 42, with run-level cost columns."""
    frame = items(rng)
    budgets = {  # budget: (gain shift vs the default, interactions x, wall-clock x)
        "1x1": (-0.016, 1.4, 1.06),
        "1x2": (-0.011, 1.8, 1.09),
        "1x4": (-0.008, 2.4, 1.14),
        "2x2": (-0.005, 2.5, 1.15),
        "2x4": (0.0, 3.5, 1.25),
        "4x4": (0.002, 5.8, 1.43),
    }
    parts = [run(frame, "SERL-Repro", 42, rng).assign(budget="", interactions=1.0, wall_clock=1.0)]
    state = rng.integers(2**32)
    for b, (shift, inter, wall) in budgets.items():
        # Common random numbers across budgets: only the shift differs, so gains are monotone.
        part = run(frame, "FACTOR", 42, np.random.default_rng(state), shift)
        parts.append(part.assign(budget=b, interactions=inter, wall_clock=wall))
    return pd.concat(parts, ignore_index=True)


def metrics(rng: np.random.Generator) -> pd.DataFrame:
    """Training curves: normalised reward and success every 10 steps, ALFWorld, 3 methods."""
    rows = []
    plateau = {"GRPO": 0.38, "SERL-Repro": 0.45, "FACTOR": 0.56}
    for m, top in plateau.items():
        for s in SEEDS:
            speed = rng.uniform(35, 50)
            for step in range(0, 151, 10):
                level = top * (1 - np.exp(-step / speed))
                reward = level + rng.normal(scale=0.02)
                rows.append(
                    (
                        "alfworld",
                        m,
                        s,
                        step,
                        round(reward, 4),
                        round(min(1.0, 0.4 + level + rng.normal(scale=0.02)), 4),
                    )
                )
    return pd.DataFrame(rows, columns=["env", "method", "seed", "step", "reward", "success_rate"])


STUDIES = {"protocol": protocol_results, "transfer": transfer_results, "budget": budget_results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=sorted(STUDIES), help="write one study's file instead")
    parser.add_argument("--output", type=Path, help="output CSV (with --study)")
    args = parser.parse_args()
    if args.study:
        out = args.output or Path(f"{args.study}_example.csv")
        STUDIES[args.study](np.random.default_rng(2608)).to_csv(out, index=False)
        print(f"wrote {out} (synthetic)")
        return
    main_results(np.random.default_rng(2608)).to_csv(HERE / "results_example.csv", index=False)
    metrics(np.random.default_rng(2609)).to_csv(HERE / "metrics_example.csv", index=False)
    print(f"wrote {HERE / 'results_example.csv'} and {HERE / 'metrics_example.csv'} (synthetic)")


if __name__ == "__main__":
    main()
