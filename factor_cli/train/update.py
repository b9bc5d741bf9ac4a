"""The PPO update on a packed rollout batch: L = L_act + L_non-act + lambda_k L^SERL_act.

Actions are split into mini-batches (``optim.minibatches``) and each mini-batch into
micro-batches of at most ``optim.micro_batch_actions`` actions for the forward passes. Every term
is normalised by its global count in the mini-batch (actions for action-mean, action tokens for
token-mean and the KL, non-action tokens for the non-action branch), so the split never changes
the update. Log-probs are recomputed at the rollout temperature, as they were sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from factor_cli.credit import CreditAssignment, action_kl, non_action_loss, policy_loss
from factor_cli.policy.generation import score_replies
from factor_cli.rollout.packing import RolloutBatch

from .config import TrainConfig
from .engine import Engine


@dataclass
class UpdateStats:
    loss: float = 0.0
    action_loss: float = 0.0
    non_action_loss: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0
    clip_fraction: float = 0.0
    approx_kl: float = 0.0


def _split(n: int, parts: int) -> list[list[int]]:
    size = -(-n // parts)
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def ppo_update(
    engine: Engine,
    rb: RolloutBatch,
    credit: CreditAssignment,
    cfg: TrainConfig,
    pad_id: int,
    teacher_prompts: Sequence[Sequence[int]] | None,
    generator: torch.Generator,
) -> UpdateStats:
    """One PPO phase (``ppo_epochs`` x ``minibatches``); returns averaged statistics."""
    b = rb.batch
    n_act = b.num_actions
    temperature = cfg.rollout.temperature
    # Per action: the slice of packed action tokens, and its reply's non-action tokens.
    act_tokens = [[] for _ in range(n_act)]
    for j, a in enumerate(b.action_index.tolist()):
        act_tokens[a].append(j)
    na_offsets, k = [], 0
    for mask in rb.action_masks:
        na_offsets.append(k)
        k += sum(1 for m in mask if not m)
    stats, n_updates = UpdateStats(), 0
    for _ in range(cfg.optim.ppo_epochs):
        order = torch.randperm(n_act, generator=generator).tolist()
        for mb in _split(n_act, cfg.optim.minibatches):
            actions = [order[i] for i in mb]
            s = _minibatch(
                engine,
                rb,
                credit,
                cfg,
                pad_id,
                teacher_prompts,
                actions,
                act_tokens,
                na_offsets,
                temperature,
            )
            for f in ("loss", "action_loss", "non_action_loss", "kl", "clip_fraction", "approx_kl"):
                setattr(stats, f, getattr(stats, f) + getattr(s, f))
            stats.grad_norm += engine.step()
            n_updates += 1
    for f in (
        "loss",
        "action_loss",
        "non_action_loss",
        "kl",
        "grad_norm",
        "clip_fraction",
        "approx_kl",
    ):
        setattr(stats, f, getattr(stats, f) / max(n_updates, 1))
    return stats


def _minibatch(
    engine, rb, credit, cfg, pad_id, teacher_prompts, actions, act_tokens, na_offsets, temperature
) -> UpdateStats:
    b = rb.batch
    n_tok = sum(len(act_tokens[a]) for a in actions)
    n_na = sum(sum(1 for m in rb.action_masks[a] if not m) for a in actions)
    unit = len(actions) if credit.reduction == "action-mean" else n_tok
    # Data parallel: every rank holds the whole rollout batch and takes its share of the
    # mini-batch; the counts above stay global and DeepSpeed sums the ranks' gradients.
    mine = actions[engine.rank :: engine.world_size]
    size = cfg.optim.micro_batch_actions
    # Every rank runs the same number of micro-batches (from the largest share), padding with
    # empty ones: ZeRO-3 gathers weights in each forward, a collective all ranks must join.
    share = -(-len(actions) // engine.world_size)
    n_micro = max(1, -(-share // size))
    micro = [mine[i * size : (i + 1) * size] for i in range(n_micro)]
    out = UpdateStats()
    clipped = 0.0
    for m, acts in enumerate(micro):
        if not acts:  # nothing here for this rank: a zero-loss forward keeps it in step
            dummy = score_replies(engine.model, [[pad_id]], [[pad_id]], 1.0, pad_id, True)
            if credit.kl_coef > 0 and teacher_prompts is not None:  # the teacher's forward too
                score_replies(engine.module, [[pad_id]], [[pad_id]], 1.0, pad_id)
            engine.backward(dummy.logprobs[0].sum() * 0.0, boundary=m == len(micro) - 1)
            continue
        sc = score_replies(
            engine.model,
            [rb.prompts[a] for a in acts],
            [rb.replies[a] for a in acts],
            temperature,
            pad_id,
            with_grad=True,
            return_logits=credit.kl_coef > 0,
        )
        logp, logp_old, coef, index, na_new, na_old, na_traj = [], [], [], [], [], [], []
        student_logits = []
        for local, (a, lp) in enumerate(zip(acts, sc.logprobs)):
            mask = torch.tensor(rb.action_masks[a], device=lp.device)
            logp.append(lp[mask])
            idx = torch.tensor(act_tokens[a])
            logp_old.append(b.logp_old[idx])
            coef.append(credit.coef[idx])
            index.append(torch.full((len(idx),), local, dtype=torch.long))
            if (~mask).any():
                na_new.append(lp[~mask])
                lo = na_offsets[a]
                na_old.append(rb.na_logp_old[lo : lo + int((~mask).sum())])
                na_traj.append(
                    torch.full((int((~mask).sum()),), int(b.traj_index[a]), dtype=torch.long)
                )
            if sc.logits is not None:
                student_logits.append(sc.logits[local][mask])
        # The batch lives on the CPU; the scores on the model's device (and in its float type).
        logp_t = torch.cat(logp)
        dev = logp_t.device
        logp_old_t = torch.cat(logp_old).to(logp_t)
        act_loss = policy_loss(
            logp_t,
            logp_old_t,
            torch.cat(coef).to(logp_t),
            torch.cat(index).to(dev),
            credit.reduction,
            cfg.optim.clip_eps,
            normalizer=unit,
        )
        loss = act_loss
        if na_new:
            na = non_action_loss(
                torch.cat(na_new),
                torch.cat(na_old).to(logp_t),
                torch.cat(na_traj).to(dev),
                credit.a_seq.to(logp_t),
                cfg.optim.clip_eps,
                normalizer=max(n_na, 1),
            )
            loss = loss + na
            out.non_action_loss += float(na.detach())
        if credit.kl_coef > 0 and teacher_prompts is not None:
            with torch.no_grad():
                tsc = score_replies(
                    engine.module,
                    [teacher_prompts[a] for a in acts],
                    [rb.replies[a] for a in acts],
                    temperature,
                    pad_id,
                    return_logits=True,
                )
            t_logits = torch.cat(
                [z[torch.tensor(rb.action_masks[a], device=dev)] for z, a in zip(tsc.logits, acts)]
            )
            kl = action_kl(t_logits, torch.cat(student_logits), normalizer=n_tok)
            loss = loss + credit.kl_coef * kl
            out.kl += float(kl.detach())
        engine.backward(loss, boundary=m == len(micro) - 1)
        ratio = torch.exp(logp_t.detach() - logp_old_t)
        clipped += float(((ratio - 1).abs() > cfg.optim.clip_eps).float().sum())
        out.approx_kl += float((logp_old_t - logp_t.detach()).sum()) / max(n_tok, 1)
        out.action_loss += float(act_loss.detach())
        out.loss += float(loss.detach())
    out.clip_fraction = clipped / max(n_tok, 1)
    if engine.world_size > 1:  # each rank saw a share: the statistics are their sums
        fields = ("loss", "action_loss", "non_action_loss", "kl", "clip_fraction", "approx_kl")
        # On the module's device: NCCL reduces CUDA tensors only, gloo takes CPU ones.
        device = next(engine.module.parameters()).device
        vec = torch.tensor([getattr(out, f) for f in fields], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(vec)
        for f, v in zip(fields, vec.tolist()):
            setattr(out, f, v)
    return out
