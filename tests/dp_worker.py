"""One PPO update on a fixed synthetic batch, in however many processes torchrun starts.

Usage: torchrun --nproc_per_node N tests/dp_worker.py MODEL_DIR OUT_JSON
Rank 0 writes the loss and a fingerprint of the updated weights; the test compares N = 1 and 2.
"""

from __future__ import annotations

import json
import sys

import torch

from factor_cli.credit import PackedBatch, assign_credit
from factor_cli.policy.generation import score_replies
from factor_cli.policy.model import load_policy
from factor_cli.rollout.packing import RolloutBatch
from factor_cli.train.config import load_config
from factor_cli.train.engine import Engine
from factor_cli.train.update import ppo_update


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    policy = load_policy(model_dir)
    cfg = load_config("smoke", ["optim.micro_batch_actions=3", "optim.lr=1e-3"])
    g = torch.Generator().manual_seed(1)
    vocab = policy.model.config.vocab_size
    n_traj, per = 4, 2
    prompts = [torch.randint(5, vocab, (10,), generator=g).tolist() for _ in range(n_traj * per)]
    replies = [torch.randint(5, vocab, (6,), generator=g).tolist() for _ in range(n_traj * per)]
    masks = [[False, True, True, True, False, False] for _ in replies]
    sc = score_replies(policy.model, prompts, replies, 1.0, 0)
    act_lp = [lp[torch.tensor(m)] for lp, m in zip(sc.logprobs, masks)]
    na_lp = [lp[~torch.tensor(m)] for lp, m in zip(sc.logprobs, masks)]
    batch = PackedBatch(
        action_index=torch.repeat_interleave(torch.arange(n_traj * per), 3),
        logp_old=torch.cat(act_lp) - 0.05,
        traj_index=torch.repeat_interleave(torch.arange(n_traj), per),
        group_index=torch.tensor([0, 0, 1, 1]),
        outcome=torch.tensor([1.0, 0.0, 0.0, 1.0]),
    ).validate()
    rb = RolloutBatch(
        batch,
        prompts,
        replies,
        masks,
        torch.cat(na_lp) - 0.05,
        torch.repeat_interleave(torch.repeat_interleave(torch.arange(n_traj), per), 3),
        [""] * len(replies),
        [(i // per, i % per) for i in range(len(replies))],
    )
    credit = assign_credit(batch, "grpo", 20)
    engine = Engine(policy.model, cfg)
    before = [p.detach().clone() for p in engine.module.parameters()]
    stats = ppo_update(engine, rb, credit, cfg, 0, None, torch.Generator().manual_seed(2))
    delta = sum(
        float((p.detach() - b).abs().sum()) for p, b in zip(engine.module.parameters(), before)
    )
    first = float(next(engine.module.parameters()).detach().flatten()[:5].sum())
    if engine.rank == 0:
        with open(out, "w") as fh:
            json.dump(
                {"loss": stats.loss, "delta": delta, "first": first, "world": engine.world_size}, fh
            )


if __name__ == "__main__":
    main()
