"""The PPO update on a packed rollout batch: L = L_act + L_non-act + lambda_k L^SERL_act.

Actions are split into mini-batches (``optim.minibatches``) and each mini-batch into
micro-batches of at most ``optim.micro_batch_actions`` actions for the forward passes. The loss
of a micro-batch is ``credit.objective`` itself (the function the credit tests check), with every
term normalised by its global count in the mini-batch (actions for action-mean, action tokens for
token-mean and the KL, non-action tokens for the non-action branch), so the split never changes
the update. Log-probs are recomputed at the rollout temperature, as they were sampled, and
under valid-action decoding over the same allowed token sets (``rb.allowed_ids``):
log pi^C_theta(y) = z[y]/T - logsumexp_{v in C} z[v]/T, the distribution ``logp_old`` was drawn
from, so q = 1 at the behaviour weights. The SERL KL then compares the teacher's and the
student's distributions masked to the same sets.

Shared prefixes (``optim.share_prefixes``, default on): each action's forward runs over its whole
prompt, and a micro-batch's prompts share most of their tokens (system text, a group's task and
first observation, a trajectory's earlier turns). The forward goes through the micro-batch's
radix tree (:mod:`factor_cli.policy.generation.shared_prefix`), each shared prefix encoded once;
the mini-batch's actions are split into micro-batches in packing order so related actions land
together. Chosen by measurement over the alternatives the issue named: on the smoke batch (24
actions) removing padding alone (length buckets) cuts 14,088 encoded tokens to 10,483, the tree
to 4,615 (fwd + bwd 2.3-2.7x faster), and one sequence per trajectory needs append-only prompts,
which the default sliding history window is not. The loss and gradients are the padded
forward's up to float rounding (``tests/policy/test_shared_prefix.py``). Under ZeRO-3 across
ranks the padded forward is used: the tree's forward count depends on the actions a rank holds.

One micro-batch is three parts: :func:`gather` (forward passes, then the objective's inputs cut
out of the packed batch), ``credit.objective`` (the loss) and :func:`padding_step` (the zero-loss
forward of a rank with nothing left, which keeps ZeRO-3's collectives in step). A method with
a critic (PPO) also runs :func:`critic_backward` on the same micro-batch, or
:func:`critic_padding_step`, through the critic's own engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from itertools import accumulate

import torch

from factor_cli.credit import (
    ActionTokens,
    CreditAssignment,
    DistillTokens,
    NonActionTokens,
    Normalizers,
    Objective,
    objective,
    value_loss,
    whiten,
)
from factor_cli.policy.generation import score_replies
from factor_cli.policy.generation.scoring import Scorer
from factor_cli.rollout.packing import RolloutBatch

from .config import TrainConfig
from .critic import CriticEngine
from .engine import Engine


@dataclass
class UpdateStats:
    """Statistics of the update: per mini-batch the sums over its micro-batches (and ranks);
    for the whole PPO phase their mean over the optimiser steps."""

    loss: float = 0.0
    action_loss: float = 0.0
    non_action_loss: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0
    clip_fraction: float = 0.0
    approx_kl: float = 0.0
    critic_loss: float = 0.0
    critic_grad_norm: float = 0.0

    def add(self, other: UpdateStats) -> UpdateStats:
        """Field-wise ``self += other``; returns self."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def mean(self, count: int) -> UpdateStats:
        """Every field divided by ``count`` (at least 1): the average of ``count`` additions."""
        n = max(count, 1)
        return UpdateStats(**{f.name: getattr(self, f.name) / n for f in fields(self)})

    def all_reduce(self, device: torch.device) -> UpdateStats:
        """Sum every field over the data-parallel ranks (a collective); returns the sums."""
        names = [f.name for f in fields(self)]
        vec = torch.tensor([getattr(self, n) for n in names], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(vec)
        return UpdateStats(**dict(zip(names, vec.tolist())))


@dataclass(frozen=True)
class Layout:
    """Where each action's pieces sit in the packed rollout batch (computed once per update)."""

    tokens: list[torch.Tensor]
    """Per action, the positions of its action tokens among the packed tokens."""
    na_start: list[int]
    """Per action, the offset of its non-action tokens in ``rb.na_logp_old``."""
    na_count: list[int]
    """Per action, how many non-action tokens its reply has."""

    @classmethod
    def of(cls, rb: RolloutBatch) -> Layout:
        act_tokens: list[list[int]] = [[] for _ in range(rb.batch.num_actions)]
        for j, a in enumerate(rb.batch.action_index.tolist()):
            act_tokens[a].append(j)
        counts = [sum(1 for m in mask if not m) for mask in rb.action_masks]
        starts = list(accumulate(counts, initial=0))[:-1]
        return cls([torch.tensor(t) for t in act_tokens], starts, counts)


@dataclass(frozen=True)
class UpdateContext:
    """What every mini-batch of one PPO phase shares."""

    engine: Engine
    rb: RolloutBatch
    credit: CreditAssignment
    cfg: TrainConfig
    pad_id: int
    teacher_prompts: Sequence[Sequence[int]] | None
    """Per action, the teacher's prompt ids (context with Phi_t); None without a KL term."""
    layout: Layout
    critic: CriticEngine | None = None
    """PPO's critic (methods with ``critic=True``) in its own engine, trained on the policy's
    micro-batches; else None."""
    teacher_scorer: Scorer | None = None
    """Scores under the rollout's weights from what the backend already encoded (hf's prefix
    cache: the teacher's prompt is the student's plus the feedback block, so only that block
    and the reply are computed). Used for the KL teacher's logits until this phase's first
    optimiser step, after which the weights differ; None: the engine's module always."""

    @property
    def share_prefixes(self) -> bool:
        """Whether forwards go through the micro-batch's radix tree (``optim.share_prefixes``).
        Not under ZeRO-3 across ranks: there every forward is a collective every rank must
        join, and ranks holding different actions would build trees of different sizes."""
        multi_rank_zero3 = self.engine.zero_stage == 3 and self.engine.world_size > 1
        return self.cfg.optim.share_prefixes and not multi_rank_zero3

    @property
    def with_kl(self) -> bool:
        """Whether the SERL KL term is computed (a positive lambda_k and teacher prompts)."""
        return self.credit.kl_coef > 0 and self.teacher_prompts is not None


@dataclass(frozen=True)
class MicroInputs:
    """The objective's inputs for one micro-batch, on the model's device."""

    action: ActionTokens
    non_action: NonActionTokens | None
    distill: DistillTokens | None


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
    critic: CriticEngine | None = None,
    teacher_scorer: Scorer | None = None,
) -> UpdateStats:
    """One PPO phase (``ppo_epochs`` x ``minibatches``); returns averaged statistics.

    ``generator`` draws the mini-batch permutation of each epoch and nothing else: the trainer
    gives it a stream of its own, so the order does not depend on the method's other draws.
    ``critic``: trained on the same micro-batches, with its own optimiser step after each
    mini-batch (its engine's, as the policy's). ``teacher_scorer``: see
    :attr:`UpdateContext.teacher_scorer` (the first mini-batch only).
    """
    layout = Layout.of(rb)
    ctx = UpdateContext(
        engine, rb, credit, cfg, pad_id, teacher_prompts, layout, critic, teacher_scorer
    )
    n_act = rb.batch.num_actions
    total, n_updates = UpdateStats(), 0
    for _ in range(cfg.optim.ppo_epochs):
        order = torch.randperm(n_act, generator=generator).tolist()
        for mb in _split(n_act, cfg.optim.minibatches):
            stats = minibatch_step(ctx, [order[i] for i in mb])
            ctx = replace(ctx, teacher_scorer=None)  # the step below changes the weights
            stats.grad_norm = engine.step()
            if critic is not None:
                stats.critic_grad_norm = critic.step()
            total.add(stats)
            n_updates += 1
    return total.mean(n_updates)


def normalizers(ctx: UpdateContext, actions: Sequence[int]) -> Normalizers:
    """The mini-batch's global counts: N_act, N_tok (action tokens) and N_na."""
    return Normalizers(
        actions=len(actions),
        action_tokens=sum(len(ctx.layout.tokens[a]) for a in actions),
        non_action_tokens=sum(ctx.layout.na_count[a] for a in actions),
    )


def micro_batches(actions: Sequence[int], rank: int, world: int, size: int) -> list[list[int]]:
    """This rank's micro-batches of a mini-batch, padded with empty ones to the common count.

    Data parallel: every rank holds the whole rollout batch and takes its share (every
    ``world``-th action); DeepSpeed sums the ranks' gradients. Every rank runs as many
    micro-batches as the largest share needs: ZeRO-3 gathers weights in each forward, a
    collective all ranks must join.
    """
    mine = list(actions[rank::world])
    share = -(-len(actions) // world)
    n_micro = max(1, -(-share // size))
    return [mine[i * size : (i + 1) * size] for i in range(n_micro)]


def minibatch_step(ctx: UpdateContext, actions: Sequence[int]) -> UpdateStats:
    """Forward and backward every micro-batch of one mini-batch (no optimiser step)."""
    engine, optim = ctx.engine, ctx.cfg.optim
    norm = normalizers(ctx, actions)
    if ctx.credit.whiten:
        ctx = whitened(ctx, actions)
    if ctx.share_prefixes:  # packing order: a trajectory's turns, then its group's, adjacent
        actions = sorted(actions)
    micro = micro_batches(actions, engine.rank, engine.world_size, optim.micro_batch_actions)
    out = UpdateStats()
    for m, acts in enumerate(micro):
        boundary = m == len(micro) - 1
        if not acts:  # nothing here for this rank: a zero-loss forward keeps it in step
            padding_step(ctx, boundary)
            if ctx.critic is not None:
                critic_padding_step(ctx.critic, ctx.pad_id, boundary)
            continue
        inputs = gather(ctx, acts)
        obj = objective(
            inputs.action,
            ctx.credit.reduction,
            optim.clip_eps,
            inputs.non_action,
            inputs.distill,
            ctx.credit.kl_coef,
            norm,
        )
        engine.backward(obj.total, boundary=boundary)
        out.add(micro_stats(obj, inputs.action, optim.clip_eps, norm))
        if ctx.critic is not None:
            out.critic_loss += critic_backward(ctx, acts, norm, boundary)
    if engine.world_size > 1:  # each rank saw a share: the statistics are their sums
        # On the module's device: NCCL reduces CUDA tensors only, gloo takes CPU ones.
        out = out.all_reduce(next(engine.module.parameters()).device)
    return out


def whitened(ctx: UpdateContext, actions: Sequence[int]) -> UpdateContext:
    """The context with the coefficients of this mini-batch's action tokens whitened
    (``credit.ppo.whiten``): verl's per-batch advantage whitening, here per PPO mini-batch.
    Every rank holds the whole batch and the same mini-batch, so all whiten alike."""
    idx = torch.cat([ctx.layout.tokens[a] for a in actions])
    coef = ctx.credit.coef.clone()
    coef[idx] = whiten(coef[idx])
    return replace(ctx, credit=replace(ctx.credit, coef=coef))


def critic_backward(
    ctx: UpdateContext, acts: Sequence[int], norm: Normalizers, boundary: bool
) -> float:
    """The clipped critic loss of one micro-batch (``credit.ppo.value_loss``, normalised by
    the mini-batch's global count under the protocol's reduction), backpropagated through the
    critic's engine (``boundary``: the mini-batch's last micro-batch); returns the loss."""
    rb, credit, layout = ctx.rb, ctx.credit, ctx.layout
    if ctx.critic is None or credit.returns is None or credit.token_values is None:
        raise ValueError("the critic loss needs a critic and a critic method's returns and values")
    vals = ctx.critic.train_values(
        [rb.prompts[a] for a in acts], [rb.replies[a] for a in acts], ctx.pad_id
    )
    new, idx, local = [], [], []
    for i, (a, v) in enumerate(zip(acts, vals)):
        new.append(v[torch.tensor(rb.action_masks[a], device=v.device)])
        idx.append(layout.tokens[a])
        local.append(torch.full((len(layout.tokens[a]),), i, dtype=torch.long))
    v = torch.cat(new)
    tok = torch.cat(idx)
    unit = norm.actions if credit.reduction == "action-mean" else norm.action_tokens
    loss = value_loss(
        v,
        credit.token_values[tok].to(v),
        credit.returns[tok].to(v),
        torch.cat(local).to(v.device),
        credit.reduction,
        ctx.cfg.credit.ppo_value_clip,
        normalizer=unit,
    )
    ctx.critic.backward(loss, boundary=boundary)
    return float(loss.detach())


def critic_padding_step(critic: CriticEngine, pad_id: int, boundary: bool) -> None:
    """The critic's zero-loss forward and backward on one pad token, for a rank with nothing
    left: it still joins the critic's ZeRO-3 gathers and its gradient reduction."""
    (v,) = critic.train_values([[pad_id]], [[pad_id]], pad_id)
    critic.backward(v.sum() * 0.0, boundary=boundary)


def gather(ctx: UpdateContext, acts: Sequence[int]) -> MicroInputs:
    """Score the micro-batch's replies (with gradient; the teacher's without) and cut the
    objective's inputs out of the packed batch. The packed batch lives on the CPU, the scores
    on the model's device and in its float type: the inputs follow the scores."""
    rb, credit, layout = ctx.rb, ctx.credit, ctx.layout
    temperature = ctx.cfg.rollout.temperature
    sc = score_replies(
        ctx.engine.wrapped_module,
        [rb.prompts[a] for a in acts],
        [rb.replies[a] for a in acts],
        temperature,
        ctx.pad_id,
        with_grad=True,
        return_logits=ctx.with_kl,
        allowed=_allowed(rb, acts),
        share_prefixes=ctx.share_prefixes,
    )
    logp, logp_old, coef, index, na_new, na_old, na_traj, student = [], [], [], [], [], [], [], []
    for local, (a, lp) in enumerate(zip(acts, sc.logprobs)):
        mask = torch.tensor(rb.action_masks[a], device=lp.device)
        idx = layout.tokens[a]
        logp.append(lp[mask])
        logp_old.append(rb.batch.logp_old[idx])
        coef.append(credit.coef[idx])
        index.append(torch.full((len(idx),), local, dtype=torch.long))
        if layout.na_count[a]:
            lo, n = layout.na_start[a], layout.na_count[a]
            na_new.append(lp[~mask])
            na_old.append(rb.na_logp_old[lo : lo + n])
            na_traj.append(torch.full((n,), int(rb.batch.traj_index[a]), dtype=torch.long))
        if sc.logits is not None:
            student.append(sc.logits[local][mask])
    logp_t = torch.cat(logp)
    dev = logp_t.device
    action = ActionTokens(
        logp_t,
        torch.cat(logp_old).to(logp_t),
        torch.cat(coef).to(logp_t),
        torch.cat(index).to(dev),
    )
    non_action = None
    if na_new:
        non_action = NonActionTokens(
            torch.cat(na_new),
            torch.cat(na_old).to(logp_t),
            torch.cat(na_traj).to(dev),
            credit.a_seq.to(logp_t),
        )
    distill = None
    if ctx.with_kl:
        distill = DistillTokens(_teacher_logits(ctx, acts, dev), torch.cat(student))
    return MicroInputs(action, non_action, distill)


def _allowed(rb: RolloutBatch, acts: Sequence[int]) -> list[list[list[int]] | None] | None:
    """The micro-batch's allowed token sets per reply position (None: all free)."""
    return None if rb.allowed_ids is None else [rb.allowed_ids[a] for a in acts]


@torch.no_grad()
def _teacher_logits(ctx: UpdateContext, acts: Sequence[int], dev: torch.device) -> torch.Tensor:
    """The teacher's next-token logits at the action tokens, [N_tok, V] (no gradient): from
    the teacher scorer while the weights are the rollout's, else a forward of the module."""
    rb = ctx.rb
    prompts = [ctx.teacher_prompts[a] for a in acts]  # type: ignore[index]  (with_kl: not None)
    replies = [rb.replies[a] for a in acts]
    temperature = ctx.cfg.rollout.temperature
    if ctx.teacher_scorer is not None and ctx.share_prefixes:
        tsc = ctx.teacher_scorer(
            prompts, replies, temperature, _allowed(rb, acts), return_logits=True
        )
    else:
        tsc = score_replies(
            ctx.engine.module,
            prompts,
            replies,
            temperature,
            ctx.pad_id,
            return_logits=True,
            allowed=_allowed(rb, acts),
            share_prefixes=ctx.share_prefixes,
        )
    return torch.cat(
        [z[torch.tensor(rb.action_masks[a], device=dev)] for z, a in zip(tsc.logits, acts)]
    )


def padding_step(ctx: UpdateContext, boundary: bool) -> None:
    """A zero-loss forward and backward on one pad token (and the teacher's forward when the
    KL term runs): a rank whose share is used up still joins every ZeRO-3 gather."""
    pad = [[ctx.pad_id]]
    dummy = score_replies(ctx.engine.wrapped_module, pad, pad, 1.0, ctx.pad_id, True)
    if ctx.with_kl:
        score_replies(ctx.engine.module, pad, pad, 1.0, ctx.pad_id)
    ctx.engine.backward(dummy.logprobs[0].sum() * 0.0, boundary=boundary)


def micro_stats(
    obj: Objective, action: ActionTokens, clip_eps: float, norm: Normalizers
) -> UpdateStats:
    """One micro-batch's share of the mini-batch statistics (fractions of the global N_tok)."""
    n_tok = max(norm.action_tokens or 0, 1)
    logp = action.logp.detach()
    ratio = torch.exp(logp - action.logp_old)
    clipped = float(((ratio - 1).abs() > clip_eps).float().sum())
    return UpdateStats(
        loss=float(obj.total.detach()),
        action_loss=float(obj.action.detach()),
        non_action_loss=float(obj.non_action.detach()),
        kl=float(obj.kl.detach()),
        clip_fraction=clipped / n_tok,
        approx_kl=float((action.logp_old - logp).sum()) / n_tok,
    )
