"""Benchmark the credit core on a paper-sized batch (128 trajectories, ~10 actions x ~16 tokens).

Prints, as medians over repeats:
  * allocation + action-mean loss forward+backward: vectorised vs a per-action Python loop;
  * FACTOR vs GRPO: credit assignment + loss forward+backward.
Targets (issue 2): vectorised >= 50x faster than the loop; FACTOR <= 1.3x GRPO.

    .venv/bin/python benchmarks/credit.py [--repeats 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from factor_cli.credit import PackedBatch, allocation, assign_credit, policy_loss


def make_batch(seed: int = 0, n_traj: int = 128, k: int = 8) -> tuple[PackedBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t_len = torch.randint(5, 16, (n_traj,), generator=g)  # ~10 actions
    n_act = int(t_len.sum())
    l_len = torch.randint(8, 25, (n_act,), generator=g)  # ~16 tokens
    n_tok = int(l_len.sum())
    logp_old = -torch.rand(n_tok, generator=g) * 3
    batch = PackedBatch(
        action_index=torch.repeat_interleave(torch.arange(n_act), l_len),
        logp_old=logp_old,
        traj_index=torch.repeat_interleave(torch.arange(n_traj), t_len),
        group_index=torch.arange(n_traj) // k,
        outcome=(torch.rand(n_traj, generator=g) < 0.5).float(),
        logp_teacher=logp_old + torch.randn(n_tok, generator=g),
        values=torch.rand(n_act, generator=g),
    )
    logp = logp_old + 0.1 * torch.randn(n_tok, generator=g)
    return batch, logp


def timed(fn: Callable[[], None], repeats: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def timed_pair(a: Callable[[], None], b: Callable[[], None], repeats: int) -> tuple[float, float]:
    """Medians of two functions timed in alternation, so drift (clock, cache, other load) hits
    both alike."""
    for _ in range(3):
        a()
        b()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        ta.append(t1 - t0)
        tb.append(time.perf_counter() - t1)
    return statistics.median(ta), statistics.median(tb)


def vectorised(batch: PackedBatch, logp: torch.Tensor, credit: torch.Tensor) -> torch.Tensor:
    lp = logp.clone().requires_grad_(True)
    omega = allocation(batch.gap, batch.action_index, credit, eta=0.5)
    coef = credit[batch.action_index] * omega
    loss = policy_loss(lp, batch.logp_old, coef, batch.action_index, "action-mean")
    loss.backward()
    return loss.detach()


def per_action_loop(batch: PackedBatch, logp: torch.Tensor, credit: torch.Tensor) -> torch.Tensor:
    """The straightforward implementation: one slice, softmax and mean per action."""
    lp = logp.clone().requires_grad_(True)
    gap = batch.gap
    bounds = torch.cumsum(batch.lengths, 0).tolist()
    start, total = 0, lp.new_zeros(())
    for a, end in enumerate(bounds):
        c = credit[a]
        s = torch.sign(c) * gap[start:end].clamp(-3.0, 3.0)
        length = end - start
        omega = length * (0.5 / length + 0.5 * torch.softmax(s, 0))
        q = torch.exp(lp[start:end] - batch.logp_old[start:end])
        coef = c * omega
        per_tok = -torch.minimum(q * coef, q.clamp(0.8, 1.2) * coef)
        total = total + per_tok.mean()
        start = end
    loss = total / len(bounds)
    loss.backward()
    return loss.detach()


def method_step(batch: PackedBatch, logp: torch.Tensor, method: str) -> None:
    out = assign_credit(batch, method, 20)
    lp = logp.clone().requires_grad_(True)
    policy_loss(lp, batch.logp_old, out.coef, batch.action_index, out.reduction).backward()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    batch, logp = make_batch()
    batch.validate()
    credit = assign_credit(batch, "factor", 20).credit
    # Both compute the same loss; check before timing so the comparison is like for like.
    torch.testing.assert_close(
        vectorised(batch, logp, credit), per_action_loop(batch, logp, credit)
    )
    t_vec = timed(lambda: vectorised(batch, logp, credit), args.repeats)
    t_loop = timed(lambda: per_action_loop(batch, logp, credit), max(3, args.repeats // 10))
    t_factor, t_grpo = timed_pair(
        lambda: method_step(batch, logp, "factor"),
        lambda: method_step(batch, logp, "grpo"),
        args.repeats,
    )
    res = {
        "trajectories": batch.num_trajectories,
        "actions": batch.num_actions,
        "tokens": batch.num_tokens,
        "threads": torch.get_num_threads(),
        "alloc_loss_vectorised_ms": 1e3 * t_vec,
        "alloc_loss_loop_ms": 1e3 * t_loop,
        "speedup_vs_loop": t_loop / t_vec,
        "factor_step_ms": 1e3 * t_factor,
        "grpo_step_ms": 1e3 * t_grpo,
        "factor_over_grpo": t_factor / t_grpo,
    }
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(
        f"batch: {res['trajectories']} trajectories, {res['actions']} actions, "
        f"{res['tokens']} tokens, {res['threads']} threads"
    )
    print(
        "allocation + action-mean loss fwd+bwd: "
        f"vectorised {res['alloc_loss_vectorised_ms']:.2f} ms, "
        f"per-action loop {res['alloc_loss_loop_ms']:.1f} ms "
        f"-> {res['speedup_vs_loop']:.0f}x (target >= 50x)"
    )
    print(
        f"credit + loss fwd+bwd: factor {res['factor_step_ms']:.2f} ms, "
        f"grpo {res['grpo_step_ms']:.2f} ms -> {res['factor_over_grpo']:.2f}x (target <= 1.3x)"
    )


if __name__ == "__main__":
    main()
