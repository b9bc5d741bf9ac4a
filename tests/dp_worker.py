"""One PPO update on a fixed synthetic batch, in however many processes torchrun starts.

Usage: torchrun --nproc_per_node N tests/dp_worker.py MODEL_DIR OUT_JSON [--uneven] [--zero3]
Rank 0 writes the loss and a fingerprint of the updated weights; the test compares N = 1 and 2.
``--uneven``: two mini-batches of 3 actions, one per micro-batch, so the ranks' shares differ
(2 and 1) and the smaller share is padded with an empty micro-batch.
"""

from __future__ import annotations

import json
import sys

import torch
from synthetic import synthetic_batch  # tests/ is this script's directory, so on sys.path

from factor_cli.credit import assign_credit
from factor_cli.policy.model import load_policy
from factor_cli.train.config import load_config
from factor_cli.train.engine import Engine
from factor_cli.train.update import ppo_update


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    policy = load_policy(model_dir)
    uneven = "--uneven" in sys.argv
    sets = (
        ["optim.micro_batch_actions=1", "optim.minibatches=2"]
        if uneven
        else ["optim.micro_batch_actions=3"]
    )
    if "--zero3" in sys.argv:
        sets.append("engine.zero_stage=3")
    cfg = load_config("smoke", [*sets, "optim.lr=1e-3"])
    rb = synthetic_batch(policy.model, n_traj=6, per=1) if uneven else synthetic_batch(policy.model)
    credit = assign_credit(rb.batch, "grpo", 20)
    engine = Engine(policy.model, cfg)
    with engine.full_parameters() as module:
        before = [p.detach().clone() for p in module.parameters()]
    stats = ppo_update(engine, rb, credit, cfg, 0, None, torch.Generator().manual_seed(2))
    with engine.full_parameters() as module:
        delta = sum(
            float((p.detach() - b).abs().sum()) for p, b in zip(module.parameters(), before)
        )
        first = float(next(module.parameters()).detach().flatten()[:5].sum())
    if engine.rank == 0:
        with open(out, "w") as fh:
            json.dump(
                {"loss": stats.loss, "delta": delta, "first": first, "world": engine.world_size}, fh
            )
    # Tear the process group down before the interpreter does: gloo's threads destroyed at exit
    # once aborted a rank ("terminate called without an active exception", SIGABRT) in CI.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
