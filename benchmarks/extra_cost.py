"""Where FACTOR's time beyond SERL-Repro's goes, per root interaction, weighed against issue 14's
FACTOR / SERL <= 1.15 budget (smoke preset, tiny model, TWX coin, CPU).

Both methods train ``--steps`` steps of the smoke preset (at the target's B = 2, M = 4 unless
``--set`` says otherwise). While a step generates (the rollout phase, and the continuations
phase where it runs apart) the script records:

- model: seconds inside the policy's forwards, the tokens they prefill (rows x columns of every
  forward over more than one column, padding included), the rows of one-column decode forwards
  (decode row-steps), and the number of forwards;
- engine: seconds inside the environment's calls (reset, step, restore, task description),
  and of those the restores (reset + replay of the root's actions: TWX cannot clone a state);
- other: the rest of the generation phases (prompts, tokenization, the decode loop's Python,
  sampling, bookkeeping).

Every figure is taken per root interaction (medians over the steps after the first) and scaled
to FACTOR's root interactions per step, so FACTOR minus SERL is the extra work of each kind at
equal root work. The budget is 0.15 x SERL's seconds per root interaction, times those root
interactions. ``replay_s`` is each step's forwards run again as plain Hugging Face forwards of
the same shapes (rows x new columns over a filled cache of the same context, every row attending
to all of it): the model's cost for that work without the backend around it (its shared-prefix
attention, which reads system + task once per batch, makes its own forwards cost about as much,
less for SERL's wide batches). The extra forwards' plain cost, plus the engine's extra time and
the value phase, is ``work_s``: what FACTOR's extra work costs on this core with HF's forward and
no overhead in Python.

    .venv/bin/python benchmarks/extra_cost.py [--steps 5] [--set KEY=VALUE] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from factor_cli.policy.generation.decode import buffer_cache
from factor_cli.policy.model import load_policy
from factor_cli.train.config import ConfigError, load_config
from factor_cli.train.run import warm_start
from factor_cli.train.trainer import Trainer

METHODS = ("serl-repro", "factor")
TARGET = 1.15
GENERATION_PHASES = ("phase_rollout", "phase_continuations")
ENGINE_CALLS = ("reset", "step", "restore")
KINDS = (
    "generation_s",
    "model_s",
    "engine_s",
    "restore_s",
    "other_s",
    "replay_s",
    "value_s",
    "teacher_s",
    "update_s",
)
COUNTS = ("prefill_tokens", "decode_row_steps", "forwards", "engine_calls")


class Meter:
    """Time and work inside the policy's forwards and the engine's calls, while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.totals: dict[str, float] = dict.fromkeys((*KINDS[:4], *COUNTS), 0.0)
        self._t0 = 0.0
        self.shapes: list[tuple[int, int, int]] = []
        """(rows, new columns, context columns) of every metered forward."""

    def before_forward(self, _module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if not self.on:
            return
        rows, cols = kwargs["input_ids"].shape
        pos = kwargs.get("position_ids")
        self.shapes.append((rows, cols, cols if pos is None else int(pos.max()) + 1))
        if cols > 1:
            self.totals["prefill_tokens"] += rows * cols
        else:
            self.totals["decode_row_steps"] += rows
        self.totals["forwards"] += 1
        self._t0 = time.perf_counter()

    def after_forward(self, *_: Any) -> None:
        if self.on:
            self.totals["model_s"] += time.perf_counter() - self._t0

    def wrap(self, fn: Callable[..., Any], *kinds: str) -> Callable[..., Any]:
        """``fn`` with its time added to each of ``kinds`` while on (``engine_s`` counts calls
        too)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                for kind in kinds:
                    self.totals[kind] += time.perf_counter() - t0
                if "engine_s" in kinds:
                    self.totals["engine_calls"] += 1

        return timed

    def switched(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` metered: on for its duration, its wall time added to ``generation_s``."""

        def run(*args: Any, **kwargs: Any) -> Any:
            self.on = True
            try:
                return self.wrap(fn, "generation_s")(*args, **kwargs)
            finally:
                self.on = False

        return run


def instrument(trainer: Trainer) -> Meter:
    """Hooks on the generation model, the engine pool and the generation phases."""
    meter = Meter()
    model = trainer.backend.model
    model.register_forward_pre_hook(meter.before_forward, with_kwargs=True)
    model.register_forward_hook(meter.after_forward)
    pool = trainer.pool
    for name in ENGINE_CALLS:  # a restore is a reset and a replay where the engine cannot clone
        kinds = ("engine_s", "restore_s") if name == "restore" else ("engine_s",)
        setattr(pool, name, meter.wrap(getattr(pool, name), *kinds))
    for env in pool.envs:  # the prompt asks each episode's environment for its task once
        env.task_description = meter.wrap(env.task_description, "engine_s")  # type: ignore[method-assign]
    for name in GENERATION_PHASES:
        setattr(trainer, name, meter.switched(getattr(trainer, name)))
    return meter


def _model(cfg: Any) -> str:
    """The smoke config's warm-start model (built once, silently, if missing)."""
    return warm_start(cfg, lambda *a: None, lambda s: None)


def method_rows(method: str, steps: int, overrides: list[str]) -> list[dict[str, Any]]:
    """One row per step: seconds and work by kind, the step's interactions and its forwards'
    shapes (``shapes``, replayed later by :func:`replay`). A line per step goes to stderr."""
    cfg = load_config("smoke", [f"method={method}", "continuations.per_checkpoint=4", *overrides])
    trainer = Trainer(cfg, _model(cfg))
    meter = instrument(trainer)
    rows = []
    try:
        for k in range(1, steps + 1):
            before, n0 = dict(meter.totals), len(meter.shapes)
            t0 = time.perf_counter()
            m = trainer.train_step().metrics
            row: dict[str, Any] = {"method": method, "step_s": time.perf_counter() - t0}
            row.update({k: meter.totals[k] - before[k] for k in meter.totals})
            row["other_s"] = row["generation_s"] - row["model_s"] - row["engine_s"]
            for phase in ("value", "teacher", "update"):
                row[f"{phase}_s"] = m.get(f"time_{phase}", 0.0)
            row["root_interactions"] = m["root_interactions"]
            row["continuation_interactions"] = m["continuation_interactions"]
            row["shapes"] = meter.shapes[n0:]
            rows.append(row)
            print(f"{method} step {k}/{steps}: {row['step_s']:.1f} s", file=sys.stderr)
    finally:
        trainer.close()
    return rows


@torch.no_grad()
def replay(model: torch.nn.Module, shapes: list[tuple[int, int, int]]) -> float:
    """Seconds of plain forwards of ``shapes`` (rows, new columns, context columns): random
    tokens over a buffer cache already holding the context's first columns."""
    cfg = model.config
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    total = 0.0
    for rows, new, ctx in shapes:
        past = ctx - new
        kv = torch.randn(cfg.num_hidden_layers, 2, rows, cfg.num_key_value_heads, ctx, dim)
        cache = buffer_cache(cfg, ctx, kv, length=past) if past else None
        ids = torch.randint(3, cfg.vocab_size, (rows, new))
        pos = torch.arange(past, ctx).expand(rows, new)
        t0 = time.perf_counter()
        model(
            input_ids=ids,
            position_ids=pos,
            past_key_values=cache,
            use_cache=cache is not None,
            logits_to_keep=1,
        )
        total += time.perf_counter() - t0
    return total


def add_replay(rows: dict[str, list[dict[str, Any]]], overrides: list[str]) -> None:
    """Each step's ``replay_s``, on the smoke model (warmed up by one replayed step first)."""
    cfg = load_config("smoke", overrides)
    model = load_policy(_model(cfg)).model.eval()
    replay(model, rows["factor"][0]["shapes"])
    for method_rows_ in rows.values():
        for row in method_rows_:
            row["replay_s"] = replay(model, row["shapes"])


def per_root(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians (steps after the first) of every figure divided by the step's root interactions."""
    kept = rows[1:] or rows
    keys = ("step_s", *KINDS, *COUNTS, "continuation_interactions")
    return {k: statistics.median(r[k] / max(r["root_interactions"], 1) for r in kept) for k in keys}


def summary(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """FACTOR's extra per step (at its root work) by kind, against the budget and its work."""
    serl, factor = per_root(rows["serl-repro"]), per_root(rows["factor"])
    roots = statistics.median(r["root_interactions"] for r in rows["factor"][1:])
    extra = {k: (factor[k] - serl[k]) * roots for k in factor}
    return {
        "root_interactions": roots,
        "factor_over_serl": factor["step_s"] / serl["step_s"],
        "budget_s": (TARGET - 1.0) * serl["step_s"] * roots,
        "extra": extra,
        "work_s": extra["replay_s"] + extra["engine_s"] + extra["value_s"],
        "serl_per_root": serl,
        "factor_per_root": factor,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="steps per method (the first left out)")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a smoke-preset override, repeatable (M = 4 is set first)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is left out)")
    try:  # every config is checked before any step runs
        for method in METHODS:
            load_config("smoke", [f"method={method}", *args.overrides])
    except ConfigError as exc:
        ap.error(str(exc))
    torch.manual_seed(0)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed prints as it loads its ops
        rows = {m: method_rows(m, args.steps, args.overrides) for m in METHODS}
        add_replay(rows, args.overrides)
    res = summary(rows)
    if args.json:
        steps = {
            m: [{k: v for k, v in r.items() if k != "shapes"} for r in rs] for m, rs in rows.items()
        }
        print(json.dumps({**res, "steps": steps}, indent=1))
        return
    ex = res["extra"]
    print(
        f"FACTOR / SERL-Repro per root interaction: {res['factor_over_serl']:.2f} "
        f"(target <= {TARGET}); at FACTOR's {res['root_interactions']:.0f} root interactions "
        f"per step, FACTOR's extra per step and what it is spent on:"
    )
    print(
        f"  extra {ex['step_s']:.2f} s: generation {ex['generation_s']:.2f} s (model "
        f"{ex['model_s']:.2f}, engine {ex['engine_s']:.2f} of which restores "
        f"{ex['restore_s']:.2f}, other {ex['other_s']:.2f}), value {ex['value_s']:.2f}, "
        f"teacher {ex['teacher_s']:.2f}, update {ex['update_s']:.2f}"
    )
    print(
        f"  extra work: {ex['continuation_interactions']:.0f} continuation interactions, "
        f"{ex['prefill_tokens']:.0f} prefilled tokens, {ex['decode_row_steps']:.0f} decode "
        f"row-steps, {ex['forwards']:.0f} forwards, {ex['engine_calls']:.0f} engine calls"
    )
    print(
        f"  budget {res['budget_s']:.2f} s; the extra forwards as plain forwards "
        f"{ex['replay_s']:.2f} s (the backend's {ex['model_s']:.2f} s); with the engine and the "
        f"value phase {res['work_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
