"""Supervised warm start on gold plays, so a tiny model emits valid actions before RL.

Each gold step becomes (student prompt x_t, reply ``<action>a_t</action>``); the loss is the
mean cross-entropy of the reply tokens. Gold plays come from the engines' own gold paths
(TextWorldExpress, ScienceWorld) or ALFWorld's expert plans, on the manifest's train instances.
A plain torch Adam loop: the SFT model is saved and RL starts from it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch

from factor_cli.envs import make_env
from factor_cli.policy.generation import score_replies, truncate_middle
from factor_cli.policy.prompting import ACTION_CLOSE, ACTION_OPEN, PromptFormat, TurnView, render

from .config import TrainConfig
from .data import instances


def gold_examples(
    cfg: TrainConfig,
    tokenizer: object,
    fmt: PromptFormat,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids) for every step of ``cfg.sft.games`` gold plays."""
    pool = instances(cfg, "train")
    rng = random.Random(cfg.seed)
    chosen = [rng.choice(pool) for _ in range(cfg.sft.games)]
    budget = cfg.rollout.max_context - cfg.rollout.max_new_tokens
    out: list[tuple[list[int], list[int]]] = []
    with make_env(cfg.env.name, **cfg.env.options) as env:
        for g, inst in enumerate(chosen):
            gold = env.gold_actions(inst.instance_id)
            obs = [env.reset(inst.instance_id)]
            task = env.task_description()
            history: list[tuple[str, str]] = []
            for action in gold:
                text = render(fmt, TurnView(task, history, obs[-1]), tokenizer)
                prompt, _ = truncate_middle(
                    tokenizer.encode(text, add_special_tokens=False), budget
                )  # type: ignore[attr-defined]
                reply = tokenizer.encode(
                    f"{ACTION_OPEN}{action}{ACTION_CLOSE}", add_special_tokens=False
                )  # type: ignore[attr-defined]
                out.append((prompt, reply))
                step = env.step(action)
                history.append((action, step.observation))
                obs.append(step.observation)
                if env.done:
                    break
            if progress:
                progress(g + 1, len(chosen))
    return out


def supervised_finetune(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    cfg: TrainConfig,
    pad_id: int,
    progress: Callable[[int, int, float], None] | None = None,
) -> list[float]:
    """Adam on the reply tokens' cross-entropy; returns the loss of every optimizer step."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.sft.lr)
    model.train()
    losses: list[float] = []
    total = cfg.sft.epochs * -(-len(examples) // cfg.sft.batch_size)
    for _ in range(cfg.sft.epochs):
        order = torch.randperm(len(examples), generator=gen).tolist()
        for lo in range(0, len(order), cfg.sft.batch_size):
            batch = [examples[i] for i in order[lo : lo + cfg.sft.batch_size]]
            sc = score_replies(
                model, [p for p, _ in batch], [r for _, r in batch], 1.0, pad_id, with_grad=True
            )
            loss = -torch.cat(sc.logprobs).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            if progress:
                progress(len(losses), total, losses[-1])
    model.eval()
    return losses


def sft_output_dir(cfg: TrainConfig) -> Path:
    """Where the warm-started model of this config lives (reused by later runs)."""
    import hashlib
    import json

    key = json.dumps(
        [
            cfg.model.path,
            cfg.env.model_dump(),
            cfg.sft.model_dump(),
            cfg.seed,
            cfg.rollout.history_turns,
        ],
        sort_keys=True,
    )
    return Path(f"{cfg.model.path.rstrip('/')}-sft-{hashlib.sha256(key.encode()).hexdigest()[:8]}")
