"""The training loop. One step (docs/design.md section 2.6) is a sequence of named phases, each
on the frozen records the earlier ones returned (:mod:`.step`):

    rollout -> teacher, value features -> continuations -> value fit -> pack -> critic
            -> credit -> update -> refresh; then the step's metrics (:mod:`.step_metrics`)

The teacher and the value features run before the continuations: with hf's prefix reuse they
score the rollout's prompts from the KV the rollout left in the cache, which continuations
played afterwards would evict (the rollout's :class:`~.step.ScoringSession` enforces it).

Every stochastic choice derives from (seed, step), so a run resumed from a checkpoint replays
the remaining steps exactly as an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from factor_cli.atomic import build_lock
from factor_cli.credit import (
    METHODS,
    CreditAssignment,
    assign_credit,
    sign_agreement,
)
from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.scoring import Scorer, model_scorer
from factor_cli.policy.model import Policy, init_tiny, load_policy, text_config
from factor_cli.policy.value_fitters import RIDGE_MAX_FEATURES, VALUE_HEADS, HeadSettings
from factor_cli.policy.value_head import TargetValueHead, ValueReplayBuffer
from factor_cli.rollout.continuations import (
    ContinuationPlan,
    ContinuationResult,
    run_continuations,
)
from factor_cli.rollout.packing import RolloutBatch, pack_episodes
from factor_cli.rollout.runner import Episode, Job, RolloutRunner, Start
from factor_cli.rollout.teacher import teacher_logprobs, teacher_prompt_texts
from factor_cli.rollout.values import (
    VALUE_FEATURES,
    monte_carlo_state_values,
    value_training_pairs,
)

from . import checkpoint
from .config import ConfigError, TrainConfig
from .critic import CriticEngine, build_critic
from .data import instances, sample_groups
from .distributed import Ranks
from .engine import Engine, Engines
from .generation import make_backend
from .prompts import prompt_format
from .step import PhaseClock, Rollout, ScoringSession, ValueFit
from .step_metrics import step_metrics
from .streams import stream_generator, stream_seed
from .update import UpdateStats, ppo_update

Progress = Callable[[str, int, int], None]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def value_feature_width(cfg: TrainConfig, model_config: Any) -> int:
    """The width of one state's value feature (``value.features``) for a model's hf config."""
    text = text_config(model_config)
    kind = VALUE_FEATURES.get(cfg.value.features)
    return kind.size(int(text.hidden_size), int(text.num_hidden_layers))


def check_value_head(cfg: TrainConfig, model_path: str) -> None:
    """Refuse, before a ledger run opens, a value head that cannot hold this model's features."""
    from transformers import AutoConfig

    if not METHODS.get(cfg.method).uses_value_head or cfg.value.head != "ridge":
        return
    width = value_feature_width(cfg, AutoConfig.from_pretrained(model_path))
    if width > RIDGE_MAX_FEATURES:
        raise ConfigError(
            f"value.head=ridge: value.features={cfg.value.features} gives {width:,} features for "
            f"{model_path} and the ridge solve holds a {width:,} x {width:,} matrix (at most "
            f"{RIDGE_MAX_FEATURES:,}); set value.head=mlp or value.features=boundary"
        )


def ensure_model(cfg: TrainConfig) -> str:
    """The model path to load, building the tiny preset there first when asked and missing."""
    path = Path(cfg.model.path)
    if cfg.model.init_tiny and not (path / "config.json").exists():
        with build_lock(path):  # concurrent jobs build it once
            if not (path / "config.json").exists():
                init_tiny(path, cfg.model.init_tiny, seed=0, overwrite=path.exists())
    return cfg.model.path


@dataclass
class StepRecord:
    """What one step played and computed, for its transcripts and diagnostic records: the root
    episodes (in packing order), the packed batch, the method's credit, the V(x_t) per action
    credit read (V_target, or the Monte-Carlo V-hat; None when the method reads none), and the
    continuations (None without them)."""

    roots: list[Episode]
    batch: RolloutBatch
    credit: CreditAssignment
    values: torch.Tensor | None
    continuations: ContinuationResult | None = None


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    record: StepRecord | None = None


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        model_path: str | None = None,
        progress: Progress | None = None,
        ranks: Ranks | None = None,
    ) -> None:
        self.cfg = cfg
        self.spec = METHODS.get(cfg.method)
        self.progress = progress or (lambda phase, i, n: None)
        seed_everything(cfg.seed)
        self.policy: Policy = load_policy(
            model_path or ensure_model(cfg), cfg.model.dtype, cfg.model.device
        )
        # PPO's critic, iff the method trains one; its model is built before the engine may
        # partition the policy's weights (the default critic copies them), then trained in an
        # engine of its own.
        critic = build_critic(cfg, self.policy) if self.spec.critic else None
        self.engine = Engine(self.policy.model, cfg)
        self.policy.model = self.engine.module
        self.critic: CriticEngine | None = None if critic is None else CriticEngine(critic, cfg)
        self.engines = Engines(self.engine, *([self.critic] if self.critic else []))
        # Value features and teacher scores are computed on every rank over the gathered batch
        # (not sharded): every rank then runs the same forwards, as ZeRO-3 requires.
        self.ranks = ranks or Ranks()
        if self.ranks.world > 1 and cfg.engine.zero_stage == 3 and cfg.rollout.backend == "hf":
            raise ConfigError(
                "engine.zero_stage=3 over several processes needs rollout.backend=vllm: hf "
                "generation runs a different number of forward passes on each rank, and ZeRO-3 "
                "gathers its partitioned weights in every one (use zero_stage 0-2 or vllm)"
            )
        self.shard = self.ranks if self.ranks.world > 1 else None
        self.backend = make_backend(cfg.rollout, self.policy)
        self.pad_id = self.backend.pad_id
        self.fmt = prompt_format(cfg)
        self.features = VALUE_FEATURES.get(cfg.value.features)
        width = value_feature_width(cfg, self.policy.model.config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 1)
            v = cfg.value
            settings = HeadSettings(v.hidden, v.lr, v.epochs, v.batch_size, v.standardize)
            self.value_fitter = VALUE_HEADS.get(v.head)(width, settings)
            self.heads = TargetValueHead(self.value_fitter.head, v.tau)
        self.buffer = ValueReplayBuffer(cfg.value.replay_steps)
        self.train_pool = instances(cfg, "train")
        n_root = cfg.rollout.groups * cfg.rollout.k
        # B checkpoints' worth of continuations per root at once (a Monte-Carlo method's plan
        # has up to T - 1; the rest wait for a free slot: the episodes do not depend on it).
        n_cont = n_root * cfg.continuations.budget * self._plan(1).per_checkpoint
        if not self.spec.continuations:
            n_cont = 0
        # Overlapped, the continuations of the first roots to end play beside the last roots.
        size = n_root + n_cont if cfg.continuations.overlap else max(n_root, n_cont)
        size = -(-size // self.ranks.world)  # each rank plays its block of the episodes
        self.pool = EnvPool.of(cfg.env, size)
        self.max_turns = cfg.env.max_turns or self.pool[0].max_turns
        self.runner = RolloutRunner(
            self.pool,
            self.backend,
            self.fmt,
            self.max_turns,
            shard=self.shard,
            constrain=cfg.rollout.valid_action_decoding,
        )
        self.step = 0

    # -- phases -----------------------------------------------------------------------------
    def phase_rollout(self, k: int) -> Rollout:
        """The root episodes of step k (the usable ones, :meth:`_usable`), with
        ``continuations.overlap`` every root's continuations (started as each root ends:
        :class:`ContinuationPlan`), and the scoring session over their prompts."""
        cfg = self.cfg
        picks = sample_groups(self.train_pool, cfg.rollout.groups, cfg.seed, k)
        starts = [
            Start(p.instance_id, group=g) for g, p in enumerate(picks) for _ in range(cfg.rollout.k)
        ]
        seed = stream_seed(cfg.seed, k, "rollout")
        jobs = [Job(s, i, seed, cfg.rollout.temperature) for i, s in enumerate(starts)]
        plan = self._plan(k) if self.spec.continuations and cfg.continuations.overlap else None
        self.policy.model.eval()
        played, followed = self.runner.play(
            jobs,
            follow=None if plan is None else plan.jobs,
            on_turn=lambda i, n: self.progress("rollout", i, n),
        )
        keys = self._usable(played)
        cached = self._rollout_scorer()
        session = ScoringSession(cached or self._model_scorer(), cached is not None)
        return Rollout(
            k,
            [played[i] for i in keys],
            keys,
            None if plan is None else followed,
            sum(e.error is not None for e in played),
            session,
        )

    def _plan(self, k: int) -> ContinuationPlan:
        """Step k's continuations: FACTOR's B checkpoints x M per root, or for Monte-Carlo
        values (``MethodSpec.values``) K from every interior state."""
        c = self.cfg.continuations
        seed = stream_seed(self.cfg.seed, k, "continuations")
        if self.spec.values == "mc":
            return ContinuationPlan(c.budget, c.per_state, c.horizon, c.temperature, seed, "every")
        return ContinuationPlan(
            c.budget, c.per_checkpoint, c.horizon, c.temperature, seed, c.support
        )

    def phase_continuations(self, rollout: Rollout) -> ContinuationResult | None:
        """The continuations of the usable roots: the ones the rollout played (with overlap),
        else played now, which evicts the rollout's prompts from the prefix cache (the
        session closes)."""
        if not self.spec.continuations:
            return None
        plan = self._plan(rollout.step)
        roots, keys = rollout.roots, rollout.keys
        if rollout.followed is not None:
            followed = rollout.followed
            return plan.result(roots, keys, [followed[i] for i in keys], self._convention())
        rollout.session.close("the continuations played after the rollout")
        return run_continuations(
            self.runner,
            roots,
            self._convention(),
            plan.budget,
            plan.per_checkpoint,
            plan.horizon,
            plan.temperature,
            seed=plan.seed,
            on_turn=lambda i, n: self.progress("continuations", i, n),
            support=plan.support,
            keys=keys,
        )

    def phase_features(self, rollout: Rollout) -> torch.Tensor | None:
        """The value head's feature of every root state (packing order); None without a head."""
        if not self.spec.uses_value_head:  # GRPO, SERL, GiGPO, mc, vineppo: no head to feed
            return None
        prompts = [t.prompt_ids for e in rollout.roots for t in e.turns]
        return self.features.compute(rollout.session.scorer, self.policy.model, prompts,
                                     self.pad_id)  # fmt: skip

    def phase_value(
        self, rollout: Rollout, cont: ContinuationResult | None, feats: torch.Tensor | None
    ) -> ValueFit:
        """Fit the online head on the replay buffer, update the target, and read V_target
        (after this step's value update and EMA) at the root states' features ``feats``; for
        Monte-Carlo values, the continuations' mean return at each state instead."""
        if self.spec.values == "mc":
            return self._monte_carlo_values(rollout, cont)
        if feats is None:
            return ValueFit(None)
        out: dict[str, float] = {}
        if cont is not None and cont.episodes:
            x, y = value_training_pairs(feats, rollout.roots, cont)
            if len(y):
                # Calibration of what credit reads (the target head) on targets it has not
                # been fitted on yet; value_mse below is the online head's training loss.
                out["value_target_mse"] = float(((self.heads.values(x) - y) ** 2).mean())
                self.buffer.add(rollout.step, x, y)
                gen = stream_generator(self.cfg.seed, rollout.step, "value")
                out["value_mse"] = self.value_fitter.fit(self.buffer, gen)
                self.heads.update()
                out["td_sign_agreement"] = self._sign_agreement(rollout.roots, feats, cont)
        return ValueFit(self.heads.values(feats), out)

    def value_warmup(self) -> dict[str, float]:
        """The value warm-up (``value.warmup_rollouts`` = R): before the first policy update, R
        rollouts of the starting policy with their continuations (streams of steps -1..-R, so no
        training step's draws repeat) fill the replay buffer as step 0; the online head fits
        them for ``value.warmup_epochs`` passes and the target head is set to it (no Polyak lag
        behind a random init). The policy does not move. Returns the warm-up's metrics ({} when
        there is none)."""
        rollouts = self.cfg.value.warmup_rollouts
        if not rollouts or not (self.spec.uses_value_head and self.spec.continuations):
            return {}
        t0, targets = time.perf_counter(), 0
        for j in range(1, rollouts + 1):
            rollout = self.phase_rollout(-j)
            feats = self.phase_features(rollout)
            cont = self.phase_continuations(rollout)
            self.phase_refresh(rollout)  # nothing moved; frees the rollout's prefix cache
            if feats is None or cont is None or not cont.episodes:
                continue
            x, y = value_training_pairs(feats, rollout.roots, cont)
            self.buffer.add(0, x, y)
            targets += len(y)
            self.progress("value warm-up", j, rollouts)
        if not targets:
            return {}
        gen = stream_generator(self.cfg.seed, 0, "value")
        mse = self.value_fitter.fit(self.buffer, gen, self.cfg.value.warmup_epochs)
        self.heads.target.load_state_dict(self.heads.online.state_dict())
        return {"value_warmup_targets": float(targets), "value_warmup_mse": mse,
                "time_value_warmup": time.perf_counter() - t0}  # fmt: skip

    def _monte_carlo_values(self, rollout: Rollout, cont: ContinuationResult | None) -> ValueFit:
        """V-hat(x_t) of every root state (VinePPO's values, no value head), and how many
        interior states no continuation estimated (they take the state before's value)."""
        if cont is None:
            raise RuntimeError(f"method {self.cfg.method!r}: Monte-Carlo values need continuations")
        values, counts = monte_carlo_state_values(rollout.roots, cont, self._convention())
        interior = sum(len(e.turns) - 1 for e in rollout.roots)
        return ValueFit(
            values.float(),
            {
                "mc_states": float(interior),
                "mc_states_unestimated": float(interior - int((counts > 0).sum())),
            },
        )

    def _sign_agreement(
        self, roots: list[Episode], feats: torch.Tensor, cont: ContinuationResult
    ) -> float:
        """Agreement of sign(V_target(x_t) - V~(x_0)) with sign(mean MC target at x_t - V~(x_0))."""
        from factor_cli.credit import CONVENTIONS

        outcome = torch.tensor([e.outcome.outcome if e.outcome else 0.0 for e in roots])
        group = torch.tensor([e.start.group for e in roots])
        v0 = CONVENTIONS.get(self._convention())(outcome, group).v0
        offsets = np.cumsum([0] + [len(e.turns) for e in roots])
        mc: dict[int, list[float]] = {}
        for c, t in zip(cont.checkpoint_of, cont.targets):
            mc.setdefault(c, []).append(t)
        pred, ref = [], []
        for c, ts in mc.items():
            cp = cont.checkpoints[c]
            row = int(offsets[cp.episode]) + cp.turn
            pred.append(float(self.heads.values(feats[row : row + 1])[0]) - float(v0[cp.episode]))
            ref.append(sum(ts) / len(ts) - float(v0[cp.episode]))
        return sign_agreement(torch.tensor(pred), torch.tensor(ref))

    @torch.no_grad()
    def phase_critic(self, rb: RolloutBatch) -> RolloutBatch:
        """The critic's V before every action token (``PackedBatch.token_values``), computed
        under this step's critic before the update; micro-batched like the update."""
        if self.critic is None:
            return rb
        self.critic.module.eval()
        size = self.cfg.optim.micro_batch_actions
        per_action: list[torch.Tensor] = []
        for lo in range(0, rb.batch.num_actions, size):
            acts = range(lo, min(lo + size, rb.batch.num_actions))
            vals = self.critic.values(
                [rb.prompts[a] for a in acts], [rb.replies[a] for a in acts], self.pad_id
            )
            for a, v in zip(acts, vals):
                per_action.append(v[torch.tensor(rb.action_masks[a], device=v.device)].cpu())
        values = torch.cat(per_action).to(rb.batch.logp_old.dtype)
        rb.batch = dataclasses.replace(rb.batch, token_values=values).validate()
        return rb

    def phase_teacher(self, rollout: Rollout) -> list[list[float]] | None:
        """The feedback-conditioned teacher's log-probs of every reply token (None for a
        method without a teacher), scored through the rollout's session."""
        if not self.spec.uses_teacher:
            return None
        return teacher_logprobs(
            rollout.session.scorer,
            self.policy.tokenizer,
            self.fmt,
            rollout.roots,
            self.backend.encode,
            self.cfg.rollout.temperature,
        )

    def phase_pack(
        self, rollout: Rollout, value: ValueFit, teacher: list[list[float]] | None
    ) -> RolloutBatch:
        """The packed batch of the usable roots, with V_target and the teacher's log-probs."""
        return pack_episodes(
            rollout.roots, self._convention(), values=value.values, logp_teacher=teacher
        )

    def _model_scorer(self) -> Scorer:
        """The trainer model's scoring pass (no gradient, current weights): the radix-tree
        forward over the batch with ``rollout.prefix_reuse`` (the same on every rank: every
        rank scores the gathered batch, as ZeRO-3 needs as many forwards on each), else the
        plain padded forward."""
        return model_scorer(
            self.policy.model, self.pad_id, share_prefixes=self.cfg.rollout.prefix_reuse
        )

    def _rollout_scorer(self) -> Scorer | None:
        """The backend's scorer from its prefix cache (hf, ``rollout.prefix_reuse``), which the
        update may use while the weights are still the rollout's; None otherwise."""
        if self.cfg.rollout.prefix_reuse and not self.backend.copies_weights:
            return self.backend.score
        return None

    def phase_credit(self, k: int, rb: RolloutBatch) -> CreditAssignment:
        """Token coefficients of the method at step k; the shuffled ablations draw from the
        credit stream, never from the mini-batch order's."""
        gen = stream_generator(self.cfg.seed, k, "credit")
        return assign_credit(rb.batch, self.cfg.method, k, self.cfg.credit, self.cfg.reduction, gen)

    def teacher_prompts(self, rollout: Rollout, credit: CreditAssignment) -> list[list[int]] | None:
        """The teacher's prompt ids of every action, for the KL term (None when its
        coefficient is 0 this step)."""
        if credit.kl_coef <= 0:
            return None
        texts = teacher_prompt_texts(self.fmt, self.policy.tokenizer, rollout.roots)
        return [ids for ids, _ in self.backend.encode(texts)]

    def phase_update(
        self,
        k: int,
        rb: RolloutBatch,
        credit: CreditAssignment,
        teacher_prompts: list[list[int]] | None,
    ) -> UpdateStats:
        """The PPO phase; its mini-batch order comes from a stream of its own, so it is the
        same for every method at a given seed and step."""
        self.policy.model.train()
        if self.critic is not None:
            self.critic.module.train()
        stats = ppo_update(
            self.engine,
            rb,
            credit,
            self.cfg,
            self.pad_id,
            teacher_prompts,
            stream_generator(self.cfg.seed, k, "minibatch"),
            self.critic,
            self._rollout_scorer(),
        )
        self.policy.model.eval()
        if self.critic is not None:
            self.critic.module.eval()
        return stats

    def phase_refresh(self, rollout: Rollout) -> None:
        """Hand the updated weights to the backend. vLLM holds its own copy and loads the new
        ones; hf samples with the trainer's module, so gathering ZeRO-3's partitions for it
        would be a wasted copy, and its prefix KV cache (stale now) is dropped: the rollout's
        scoring session closes."""
        if self.backend.copies_weights:
            with self.engine.full_parameters() as module:
                self.backend.refresh(module)
        else:
            self.backend.refresh()
        rollout.session.close("the refresh after the update")

    def _usable(self, roots: list[Episode]) -> list[int]:
        """The indices of the episodes that can enter the batch. An episode lost before its
        first action (engine crash, failed start) has no action to credit; it is dropped (and
        counted in ``episodes_lost``), and a leave-one-out group left with one member is
        dropped whole."""
        kept = [i for i, e in enumerate(roots) if e.turns]
        if self._convention() == "leave-one-out":
            size: dict[int, int] = {}
            for i in kept:
                size[roots[i].start.group] = size.get(roots[i].start.group, 0) + 1
            kept = [i for i in kept if size[roots[i].start.group] >= 2]
        if not kept:
            raise RuntimeError("every episode of this step was lost; see the crash log")
        return kept

    def _convention(self) -> str:
        return self.pool[0].spec.convention

    # -- one step ---------------------------------------------------------------------------
    def train_step(self) -> StepResult:
        """One step: the phases in order, each on what the earlier ones returned. The teacher
        and the value features score before the continuations, through the rollout's session
        (:mod:`.step`)."""
        clock, k = PhaseClock(), self.step + 1
        rollout = clock.time("rollout", lambda: self.phase_rollout(k))
        teacher = clock.time("teacher", lambda: self.phase_teacher(rollout))
        feats = clock.time("value", lambda: self.phase_features(rollout))
        cont = clock.time("continuations", lambda: self.phase_continuations(rollout))
        value = clock.time("value", lambda: self.phase_value(rollout, cont, feats))
        packed = self.phase_pack(rollout, value, teacher)
        rb = clock.time("critic", lambda: self.phase_critic(packed))
        credit = self.phase_credit(k, rb)
        prompts = self.teacher_prompts(rollout, credit)
        stats = clock.time("update", lambda: self.phase_update(k, rb, credit, prompts))
        self.phase_refresh(rollout)
        self.step = k
        metrics = step_metrics(rollout, rb, cont, value, credit, stats, clock.times,
                               self.critic is not None, self.backend.last_logprob_gap)  # fmt: skip
        return StepResult(k, metrics, StepRecord(rollout.roots, rb, credit, value.values, cont))

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, run_dir: Path, run_id: str | None) -> Path:
        extra = {
            "heads": self.heads.state_dict(),
            "value_opt": self.value_fitter.state_dict(),
            "buffer": self.buffer.state_dict(),
            "run_id": run_id,
            "config": self.cfg.model_dump(mode="json"),
        }
        # Every engine (policy, critic) writes its model and optimizer shards into the folder.
        return checkpoint.save(
            run_dir,
            self.step,
            self.engines,
            extra,
            self.ranks.main,
            self.ranks.barrier,
            keep_every=self.cfg.checkpoint_keep_every,
        )

    def load(self, directory: Path) -> dict[str, Any]:
        self.engines.load(directory)
        state = checkpoint.load_state(directory)
        self.heads.load_state_dict(state["heads"])
        self.value_fitter.load_state_dict(state["value_opt"])
        self.buffer.load_state_dict(state["buffer"])
        checkpoint.set_rng_state(state["rng"])
        self.step = int(state["step"])
        return state

    def close(self) -> None:
        """Shut the environments and the generation backend (vLLM's engine processes) down."""
        self.pool.close()
        self.backend.close()
