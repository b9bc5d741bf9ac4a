"""One PPO update on a fixed synthetic batch, in however many processes torchrun starts.

Usage: torchrun --nproc_per_node N tests/dp_worker.py MODEL_DIR OUT_JSON [--uneven] [--zero3]
[--ppo]
Rank 0 writes the loss and a fingerprint of the updated weights; the test compares them with
:func:`update_results` run in its own process (the one-process reference, without a launch).
``--ppo``: method ppo, its critic trained in its own engine beside the policy (its loss and
weights' fingerprint are written too).
``--uneven``: two mini-batches of 3 actions, one per micro-batch, so the ranks' shares differ
(2 and 1) and the smaller share is padded with an empty micro-batch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import torch
from synthetic import synthetic_batch  # tests/ is this script's directory, so on sys.path
from synthetic_ppo import ppo_inputs

from factor_cli.credit import assign_credit
from factor_cli.policy.model import load_policy
from factor_cli.train.config import load_config
from factor_cli.train.critic import CriticEngine
from factor_cli.train.engine import Engine
from factor_cli.train.update import ppo_update


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    result, rank = update_results(model_dir, sys.argv[3:])
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    # Tear the process group down before the interpreter does: gloo's threads destroyed at exit
    # once aborted a rank ("terminate called without an active exception", SIGABRT) in CI.
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def update_results(model_dir: str, flags: Sequence[str]) -> tuple[dict[str, float], int]:
    """One update under ``flags`` (the script's options): (its results, this rank)."""
    torch.manual_seed(0)
    policy = load_policy(model_dir)
    uneven = "--uneven" in flags
    sets = (
        ["optim.micro_batch_actions=1", "optim.minibatches=2"]
        if uneven
        else ["optim.micro_batch_actions=3"]
    )
    if "--zero3" in flags:
        sets.append("engine.zero_stage=3")
    ppo = "--ppo" in flags
    if ppo:
        sets += ["method=ppo", "critic.lr=1e-3"]
    cfg = load_config("smoke", [*sets, "optim.lr=1e-3"])
    sizes = {"n_traj": 6, "per": 1} if uneven else {}
    critic = None
    if ppo:
        model, rb, credit = ppo_inputs(cfg, policy, **sizes)
    else:
        rb = synthetic_batch(policy.model, **sizes)
        credit = assign_credit(rb.batch, "grpo", 20)
    engine = Engine(policy.model, cfg)
    if ppo:
        critic = CriticEngine(model, cfg)
    engines = [engine] if critic is None else [engine, critic]
    before = [_weights(e) for e in engines]
    gen = torch.Generator().manual_seed(2)
    stats = ppo_update(engine, rb, credit, cfg, 0, None, gen, critic)
    after = [_weights(e) for e in engines]
    result = {"loss": stats.loss, "grad_norm": stats.grad_norm, "world": engine.world_size}
    for name, b, a in zip(("", "critic_"), before, after):
        result[f"{name}delta"] = sum(float((x - y).abs().sum()) for x, y in zip(a, b))
        result[f"{name}first"] = float(a[0].flatten()[:5].sum())
    if critic is not None:
        result |= {"critic_loss": stats.critic_loss, "critic_grad_norm": stats.critic_grad_norm}
    return result, engine.rank


def _weights(engine: Engine) -> list[torch.Tensor]:
    """Copies of the engine's whole parameters (gathered under ZeRO-3)."""
    with engine.full_parameters() as module:
        return [p.detach().clone() for p in module.parameters()]


if __name__ == "__main__":
    main()
