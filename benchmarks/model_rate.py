"""The model's own speed on this machine, without the backend around it: microseconds per token
of a plain prefill forward (B prompts of L tokens, no cache, logits of the last position only)
and per row of a decode step over a filled KV buffer of S columns.

These are the rates a generation backend could reach at best with Hugging Face's forward, so
they bound what a rollout can cost from below: the tokens a rollout computes (``prefill_tokens``
and generated tokens in ``benchmarks/rollout.py`` and ``benchmarks/train.py``) times these rates.
Issue 14's cost-ratio targets are weighed against that bound in docs/benchmark-log.md.

    .venv/bin/python benchmarks/model_rate.py [--model DIR] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from credit import timed  # benchmarks/credit.py: median of timed calls after warm-up ones

from factor_cli.policy.generation.decode import buffer_cache
from factor_cli.policy.model import init_tiny, load_policy

DEFAULT_MODEL = Path("runs/bench-tiny-1m")
PREFILL_SHAPES = ((1, 64), (8, 64), (16, 64), (32, 64), (4, 128), (8, 128), (16, 128), (32, 128))
DECODE_SHAPES = ((1, 300), (8, 300), (32, 300), (8, 550), (32, 550), (64, 550))


@torch.no_grad()
def prefill_rate(model: torch.nn.Module, b: int, length: int, reps: int) -> float:
    """Microseconds per token of one forward over [b, length] tokens."""
    ids = torch.randint(3, model.config.vocab_size, (b, length))
    dt = timed(lambda: model(input_ids=ids, logits_to_keep=1, use_cache=False), reps)
    return dt / (b * length) * 1e6


@torch.no_grad()
def decode_rate(model: torch.nn.Module, b: int, columns: int, reps: int) -> float:
    """Microseconds per row of one decode step over ``columns`` cached columns (the cache is
    the backend's in-place buffer, rewound before each step)."""
    ids = torch.randint(3, model.config.vocab_size, (b, columns))
    cache = buffer_cache(model.config, columns + 1)
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    step = torch.randint(3, model.config.vocab_size, (b, 1))

    def one() -> None:
        for layer in cache.layers:
            layer.length = columns
        model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1)

    return timed(one, reps) / b * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="built with init-tiny if missing"
    )
    ap.add_argument("--reps", type=int, default=5, help="timed calls per shape; medians")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    if not (args.model / "config.json").exists():
        init_tiny(args.model, "1m")
    model = load_policy(str(args.model)).model.eval()
    prefill = {f"{b}x{n}": prefill_rate(model, b, n, args.reps) for b, n in PREFILL_SHAPES}
    decode = {f"{b}x{s}": decode_rate(model, b, s, args.reps) for b, s in DECODE_SHAPES}
    if args.json:
        print(json.dumps({"prefill_us_per_token": prefill, "decode_us_per_row": decode}, indent=1))
        return
    print(f"threads {torch.get_num_threads()}; medians of {args.reps} calls")
    print(
        "prefill, us per token (rows x tokens): "
        + ", ".join(f"{k} {v:.1f}" for k, v in prefill.items())
    )
    print(
        "decode step, us per row (rows x cached columns): "
        + ", ".join(f"{k} {v:.0f}" for k, v in decode.items())
    )


if __name__ == "__main__":
    main()
