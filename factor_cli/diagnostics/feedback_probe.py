"""``factor diagnose feedback``'s data (the paper's Table 27): how concentrated a method's token
allocation is when its teacher sees the true feedback Phi_t, another action's (shuffled), or
none, on the same recorded actions.

For a step k whose policy was kept (checkpoint k - 1), up to ``actions`` credited actions are
drawn (:func:`.replay.draw_actions`, seeded) and their whole trajectories are played again
under that policy: each turn "generates" the recorded action's reply R(a) (the reply the
action trie gives it; :class:`ScriptedBackend`), so the episode retraces the record while the
environment supplies every observation and Phi_t again and the policy scores each reply (its
log pi_old). The teacher then scores the same replies three times:

- ``true``: Phi_t, the environment's reply to a_t (what training used);
- ``shuffled``: the Phi of another action of the replayed batch (a seeded derangement);
- ``none``: an empty feedback block (the teacher's prompt without any information).

Each gap Delta = log pi_T - log pi_old goes through the method's allocation with the step's
recorded strength (eta_0 when the teacher was off at that step) and the recorded credit, and
each action's concentration is measured: the share of rho on its top quarter of tokens
(:func:`factor_cli.credit.top_quartile_mass`) and the normalised entropy H(rho) / log L_t.
Trajectories whose replay leaves the record (an action no longer admissible) are dropped and
counted. Under free decoding a reply is rebuilt as R(a) only (no reasoning text): the numbers
then describe R(a), not the recorded reply.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from factor_cli.credit import METHODS, CreditConfig, top_quartile_mass
from factor_cli.credit.allocations import ALLOCATIONS
from factor_cli.policy.generation.base import Generation
from factor_cli.rollout.packing import pack_episodes
from factor_cli.rollout.runner import Episode, Job, RolloutRunner, Start, reply_seed
from factor_cli.rollout.teacher import teacher_logprobs

from .replay import McPlan, checkpoint_dir, draw_actions, load_checkpoint_policy, run_config
from .td_sign import Progress, per_kept_step

CONDITIONS = ("true", "shuffled", "none")
COLUMNS = ("step", "traj", "turn", "length", "condition", "strength", "wbar", "top_mass",
           "entropy", "gap_abs")  # fmt: skip
SCRIPT_SEED = 0


class ScriptedBackend:
    """A generation backend that plays a script: request i of a turn gets the reply R(a) of
    the action ``script[seeds[i]]`` (seeds name (episode, turn): :func:`reply_seed`), with
    its log-probs under the wrapped backend's policy and the constraint it was asked for.
    Everything else is the wrapped backend's."""

    def __init__(self, inner: Any, script: dict[int, str]) -> None:
        self.inner = inner
        self.script = script

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(
        self,
        prompts: Sequence[str],
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        allowed: Any = None,
        keep: Sequence[bool] | None = None,
    ) -> list[Generation]:
        if seeds is None:
            raise ValueError("a scripted backend needs the runner's per-reply seeds")
        encoded = self.inner.encode(prompts)
        tries = self.inner.tries.tries(allowed, len(prompts))
        replies = [list(self.inner.tries.reply_tokens(self.script[s])) for s in seeds]
        sets = [None if t is None else _along(t, r) for t, r in zip(tries, replies)]
        scores = self.inner.score([ids for ids, _ in encoded], replies, temperature,
                                  sets if any(s is not None for s in sets) else None)  # fmt: skip
        return [
            Generation(
                prompt_ids=list(ids),
                token_ids=reply,
                logprobs=lp.tolist(),
                text=self.inner.tokenizer.decode(reply, skip_special_tokens=True),
                finished=True,
                prompt_truncated=cut,
                allowed_ids=s,
            )
            for (ids, cut), reply, lp, s in zip(encoded, replies, scores.logprobs, sets)
        ]


def _along(trie: Any, reply: list[int]) -> list[list[int]] | None:
    """C_j along a scripted reply; None (free) when the action is no longer admissible: the
    replay then leaves the record and the trajectory is dropped."""
    try:
        return trie.allowed_along(reply)
    except ValueError:
        return None


def replay_trajectories(
    cfg: Any, backend: Any, plays: list[tuple[str, int, list[str]]], on_turn: Any = None
) -> list[Episode | None]:
    """Each (instance, group, actions) played again by its script, scored by ``backend``
    (the checkpoint policy's); None where the replay did not retrace the recorded actions."""
    from factor_cli.envs.pool import EnvPool
    from factor_cli.train.prompts import prompt_format

    script = {reply_seed(SCRIPT_SEED, e, t): a
              for e, (_, _, acts) in enumerate(plays) for t, a in enumerate(acts)}  # fmt: skip
    jobs = [Job(Start(inst, group, [], None, len(acts)), e, SCRIPT_SEED, cfg.rollout.temperature)
            for e, (inst, group, acts) in enumerate(plays)]  # fmt: skip
    with EnvPool.of(cfg.env, min(len(jobs), 64)) as pool:
        runner = RolloutRunner(pool, ScriptedBackend(backend, script), prompt_format(cfg),
                               max(len(a) for _, _, a in plays),
                               constrain=cfg.rollout.valid_action_decoding)  # fmt: skip
        episodes, _ = runner.play(jobs, on_turn=on_turn)
    return [ep if ep.actions == acts else None for ep, (_, _, acts) in zip(episodes, plays)]


def with_feedback(episodes: list[Episode], condition: str, seed: int) -> list[Episode]:
    """Copies of ``episodes`` whose turns carry the feedback of ``condition``."""
    turns = [tn for ep in episodes for tn in ep.turns]
    if condition == "true":
        return episodes
    if condition == "none":
        given = [""] * len(turns)
    else:  # a seeded cyclic shift over a shuffled order: no action keeps its own Phi
        perm = list(range(len(turns)))
        random.Random(f"feedback:{seed}").shuffle(perm)
        given = [""] * len(turns)
        for i, t in enumerate(perm):
            given[t] = turns[perm[(i + 1) % len(perm)]].feedback
    out, i = [], 0
    for ep in episodes:
        copy_ep = copy.copy(ep)
        copy_ep.turns = [dataclasses.replace(tn, feedback=given[i + t])
                         for t, tn in enumerate(ep.turns)]  # fmt: skip
        i += len(ep.turns)
        out.append(copy_ep)
    return out


@dataclasses.dataclass
class ReplayedStep:
    """A kept step's drawn trajectories played again under its policy (module docstring)."""

    cfg: Any
    policy: Any
    backend: Any
    """The policy's generation backend: it replayed the step, and its prefix cache still
    holds the replay's prompts for the teacher and any continuations; :meth:`close` it."""
    episodes: list[Episode]
    rows: pd.DataFrame
    """The action records of the replayed trajectories, in packing order (traj, turn)."""
    strength: float
    """The step's recorded eta_k (eta_0 where the teacher was off)."""
    dropped: int
    """Drawn trajectories whose replay left the record."""
    drawn: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    """(traj, turn) of the drawn actions whose trajectories were replayed."""

    def close(self) -> None:
        self.backend.close()


def replay_step(
    run_dir: Path, step_actions: pd.DataFrame, plan: McPlan, on_turn: Any = None
) -> ReplayedStep | None:
    """The trajectories of the actions :func:`.replay.draw_actions` draws from one step,
    replayed by script under the policy of checkpoint k - 1; None when the step credited no
    action (every group's outcomes agreed), so nothing is drawn."""
    from factor_cli.train.generation import make_backend

    k = int(step_actions["step"].iloc[0])
    chosen = draw_actions(step_actions, plan)
    if chosen.empty:
        return None
    trajs = sorted(chosen["traj"].unique().tolist())
    rows = step_actions[step_actions["traj"].isin(trajs)].sort_values(["traj", "turn"])
    plays = [(str(g["instance"].iloc[0]), int(g["group"].iloc[0]), g["action"].astype(str).tolist())
             for _, g in rows.groupby("traj", sort=True)]  # fmt: skip
    ckpt = checkpoint_dir(run_dir, k - 1)
    cfg = run_config(ckpt)
    policy = load_checkpoint_policy(run_dir, ckpt, cfg)
    backend = make_backend(cfg.rollout, policy)
    try:
        replayed = replay_trajectories(cfg, backend, plays, on_turn)
    except BaseException:
        backend.close()
        raise
    kept = [(t, ep) for t, ep in zip(trajs, replayed) if ep is not None]
    if not kept:
        backend.close()
        raise ValueError(f"step {k}: no trajectory's replay retraced its record")
    recorded = float(step_actions["strength"].iloc[0]) if "strength" in step_actions else 0.0
    return ReplayedStep(
        cfg, policy, backend, [ep for _, ep in kept],
        rows[rows["traj"].isin([t for t, _ in kept])].reset_index(drop=True),
        recorded if recorded > 0 else CreditConfig().eta_0, len(trajs) - len(kept),
        {(int(t), int(u)) for t, u in zip(chosen["traj"], chosen["turn"])},
    )  # fmt: skip


def allocation_weights(
    step: ReplayedStep, method: str, conditions: Sequence[str], seed: int
) -> dict[str, tuple[Any, torch.Tensor]]:
    """Per feedback condition: the packed batch of the replayed episodes (with that
    condition's teacher log-probs) and the method's allocation omega [N_tok] on it, under the
    recorded credit and the step's strength."""
    from factor_cli.train.prompts import prompt_format

    scorer = step.backend
    alloc = ALLOCATIONS.get(METHODS.get(method).allocation)
    credit = torch.tensor(step.rows["credit"].to_numpy(), dtype=torch.float64)
    out = {}
    for condition in conditions:
        eps = with_feedback(step.episodes, condition, seed)
        teacher = teacher_logprobs(scorer.score, step.policy.tokenizer, prompt_format(step.cfg),
                                   eps, scorer.encode, step.cfg.rollout.temperature)  # fmt: skip
        rb = pack_episodes(eps, "raw", logp_teacher=teacher, dtype=torch.float64)
        idx = rb.batch.action_index.long()
        weight = alloc(rb.batch.gap, idx, credit, step.strength, CreditConfig(), None, check=False)
        out[condition] = (rb, weight)
    return out


def concentration(rb: Any, weight: torch.Tensor) -> pd.DataFrame:
    """Per action (packing order): its token count, the mean weight w-bar_t, the allocation's
    top-quartile mass, the normalised entropy H(rho) / log L_t (NaN for one token) and the
    mean |Delta|."""
    b = rb.batch
    idx = b.action_index.long()
    n = b.num_actions
    top = top_quartile_mass(weight, idx, n)
    rho = weight / torch.zeros(n, dtype=weight.dtype).index_add(0, idx, weight)[idx]
    ent = torch.zeros(n, dtype=weight.dtype).index_add(
        0, idx, -torch.where(rho > 0, rho * rho.log(), torch.zeros_like(rho))
    )
    lengths = b.lengths.double()
    norm = torch.where(lengths > 1, ent / lengths.log().clamp_min(1e-12), torch.nan)
    gap_abs = torch.zeros(n, dtype=weight.dtype).index_add(0, idx, b.gap.abs()) / lengths
    wbar = torch.zeros(n, dtype=weight.dtype).index_add(0, idx, weight) / lengths
    columns = {"length": b.lengths, "wbar": wbar, "top_mass": top, "entropy": norm,
               "gap_abs": gap_abs}  # fmt: skip
    return pd.DataFrame({name: t.tolist() for name, t in columns.items()})


def feedback_rows(
    run_dir: Path, step_actions: pd.DataFrame, method: str, plan: McPlan, on_turn: Any = None
) -> pd.DataFrame:
    """One step's drawn trajectories replayed and scored under every condition (:data:`COLUMNS`
    rows, one per action and condition; ``dropped`` in ``attrs``)."""
    step = replay_step(run_dir, step_actions, plan, on_turn)
    if step is None:
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        weights = allocation_weights(step, method, CONDITIONS, plan.seed)
    finally:
        step.close()
    frames = []
    for condition, (rb, weight) in weights.items():
        frames.append(concentration(rb, weight).assign(
            step=int(step_actions["step"].iloc[0]), traj=step.rows["traj"].to_numpy(),
            turn=step.rows["turn"].to_numpy(), condition=condition, strength=step.strength,
        ))  # fmt: skip
    out = pd.concat(frames, ignore_index=True)[list(COLUMNS)]
    out.attrs["dropped"] = step.dropped
    return out


def feedback_estimates(
    actions: pd.DataFrame, runs: pd.DataFrame, plan: McPlan, cache: Path, progress: Progress
) -> pd.DataFrame:
    """:func:`feedback_rows` of every replayable step of ``runs`` (each must have a teacher),
    cached per (run, step) (:func:`.td_sign.per_kept_step`)."""
    return per_kept_step(actions, runs, plan, cache, progress, feedback_rows, teacher=True)
