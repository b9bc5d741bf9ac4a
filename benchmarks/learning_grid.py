"""Where does RL have signal? The starting policy of a grid of task settings, measured before
any method comparison: greedy and sampled success, the share of groups whose outcomes differ
(the only groups that carry outcome signal), the horizon in turns, and seconds per RL step.

    .venv/bin/python benchmarks/learning_grid.py [--grid default] [--items 50] [--k 4]
        [--rl-steps 1] [--json] [--set a.b=c ...]

Every setting is the ``smoke`` preset plus its overrides (``--set`` applies to all of them). For
each it builds (or reuses) the warm start, then plays:

- ``greedy``: one greedy episode per eval item (the first ``--items``), macro success, as
  ``factor train`` evaluates;
- ``sampled``: ``--k`` episodes per eval item at T = 1 (the training-time policy), success and
  ``mixed``: the share of those groups whose outcomes are not all equal (an all-success or
  all-failure group has A^seq = 0 for every member under the leave-one-out baseline);
- ``turns``: mean turns of the sampled episodes, and of their successful ones (the horizon);
- ``s/step``: seconds of ``--rl-steps`` FACTOR training steps (after one untimed step) at the
  setting's rollout size.

Rows print as they finish (stderr) and as one table at the end; ``--json`` prints the rows as
JSON instead. The committed results are in ``benchmarks/results/learning_grid_cpu.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import numpy as np

from factor_cli.policy.model import load_policy
from factor_cli.train.config import ConfigError, load_config
from factor_cli.train.data import instances
from factor_cli.train.evaluate import metric, play_evaluation
from factor_cli.train.generation import make_backend
from factor_cli.train.prompts import prompt_format
from factor_cli.train.run import warm_start
from factor_cli.train.trainer import Trainer

COIN = "numDistractorItems=0,includeDoors=0"
COOK = "numDistractorItems=0,includeDoors=0,limitInventorySize=0"
GRIDS: dict[str, list[tuple[str, list[str]]]] = {
    "default": [
        (
            f"coin{n} T{t} sft{g}x{e}",
            [
                f"env.options.params.coin=numLocations={n},{COIN}",
                f"env.max_turns={t}",
                f"sft.games={g}",
                f"sft.epochs={e}",
            ],
        )
        for n, t in ((3, 10), (3, 6), (6, 12), (6, 20))
        for g, e in ((120, 2), (30, 1))
    ],
    # The second mini-replication's third horizon: about twice coin6 T12's winning length (TWX
    # allows at most 11 rooms), measured before its comparison was run.
    "horizon": [
        (
            f"coin{n} T{t}",
            [f"env.options.params.coin=numLocations={n},{COIN}", f"env.max_turns={t}"],
        )
        for n, t in ((9, 18), (11, 24))
    ],
    # The mini-replication's second look (issue 29): a second game of the family, measured
    # before its comparison was run.
    "cooking": [
        (
            f"cooking{i} T{t}",
            [
                "env.games=[cookingworld]",
                f"env.options.params.cookingworld=numLocations=1,numIngredients={i},{COOK}",
                f"env.max_turns={t}",
            ],
        )
        for i, t in ((1, 12), (2, 16))
    ],
}


def sampled_play(cfg: Any, generator: Any, items: int, k: int) -> dict[str, float]:
    """``k`` T = 1 episodes per eval item: success, mixed-outcome groups, turns."""
    from factor_cli.envs.pool import EnvPool
    from factor_cli.rollout.runner import RolloutRunner, Start

    pool_items = instances(cfg, "eval")[:items]
    starts = [Start(i.instance_id, group=g) for g, i in enumerate(pool_items) for _ in range(k)]
    with EnvPool(cfg.env.name, min(len(starts), 64), **cfg.env.options) as pool:
        runner = RolloutRunner(
            pool,
            generator,
            prompt_format(cfg),
            max_turns=cfg.env.max_turns or pool[0].max_turns,
            constrain=cfg.rollout.valid_action_decoding,
        )
        eps = runner.run(starts, temperature=1.0, seed=cfg.seed + 7)
    wins = np.array([bool(e.outcome and e.outcome.success) for e in eps], dtype=float)
    groups = wins.reshape(len(pool_items), k)
    turns = np.array([len(e.turns) for e in eps], dtype=float)
    return {
        "sampled": float(wins.mean()),
        "mixed": float(np.mean(groups.min(axis=1) != groups.max(axis=1))),
        "turns": float(turns.mean()),
        "turns_win": float(turns[wins > 0].mean()) if wins.any() else float("nan"),
    }


def measure(label: str, overrides: list[str], args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config("smoke", [*overrides, *args.set])
    t0 = time.perf_counter()
    path = warm_start(cfg, lambda *a: None, lambda s: None)
    row: dict[str, Any] = {"setting": label, "overrides": overrides}
    row["warm_start_s"] = time.perf_counter() - t0
    policy = load_policy(path, cfg.model.dtype, cfg.model.device)
    gen = make_backend(cfg.rollout, policy)
    cfg.eval.max_items = args.items
    row["greedy"] = metric(play_evaluation(gen, cfg, cfg.method).items)
    row.update(sampled_play(cfg, gen, args.items, args.k))
    if args.rl_steps:
        trainer = Trainer(cfg, path)
        try:
            trainer.train_step()
            t0 = time.perf_counter()
            for _ in range(args.rl_steps):
                trainer.train_step()
            row["s_per_step"] = (time.perf_counter() - t0) / args.rl_steps
        finally:
            trainer.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="default", choices=sorted(GRIDS))
    ap.add_argument("--items", type=int, default=50, help="eval items played per setting")
    ap.add_argument("--k", type=int, default=4, help="sampled episodes per item")
    ap.add_argument("--rl-steps", type=int, default=1, help="timed FACTOR steps (0: none)")
    ap.add_argument("--only", default=None, help="run only settings whose label contains this")
    ap.add_argument("--set", action="append", default=[], help="override for every setting")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.items < 1 or args.k < 2:
        ap.error("--items must be >= 1 and --k >= 2")
    grid = [(lab, o) for lab, o in GRIDS[args.grid] if args.only is None or args.only in lab]
    try:
        for _, o in grid:  # every config is validated before any setting is measured
            load_config("smoke", [*o, *args.set])
    except ConfigError as exc:
        ap.error(str(exc))
    rows = []
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints as it loads its ops
        for lab, o in grid:
            rows.append(measure(lab, o, args))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ("greedy", "sampled", "mixed", "turns", "turns_win", "s_per_step", "warm_start_s")
    print(f"{'setting':24s} " + " ".join(f"{c:>12s}" for c in cols))
    for r in rows:
        print(f"{r['setting']:24s} " + " ".join(f"{r.get(c, float('nan')):12.3f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
