"""The teacher-student gap before RL: does the hindsight teacher read what the feedback says?

On held-out plays (eval instances, never in the warm start's gold data), every action's reply
y_t is scored by the student and by the teacher under three feedback conditions c (the
conditions of ``factor diagnose feedback``: the true Phi_t, another action's Phi (a seeded
derangement over the plays' actions), an empty block):

    g^c_t = sum_j [ log pi_T(y_{t,j} | x_t, Phi^c_t, y_{t,<j}) - log pi(y_{t,j} | x_t, y_{t,<j}) ]

the log-likelihood the realised action gains when the feedback is in the prompt. A teacher that
reads the feedback gives its own action more likelihood with the true Phi than with another
action's: g^true - g^shuffled > 0. Equal gains mean the teacher reacts to a feedback block
being there, not to what it says, and HTA's and SERL's multipliers then carry no information.

Two sources of plays, each over the same seeded draw of eval instances:

- ``gold``: the environment's gold plan, replayed by script
  (:func:`.feedback_probe.replay_trajectories`);
- ``sampled``: the policy's own plays at the rollout temperature (the actions RL credits).

Under valid-action decoding both passes are renormalised over the allowed token sets of the
turn (as the teacher is in training), so a forced token adds 0. Scores come from the model, not
from the generation records, so student and teacher are measured by one function.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from factor_cli.policy.prompting import render
from factor_cli.rollout.continuations import outcome_of
from factor_cli.rollout.runner import Episode, Job, RolloutRunner, Start
from factor_cli.rollout.teacher import reply_logprobs, teacher_prompt_texts, turn_views

from .feedback_probe import CONDITIONS, replay_trajectories, with_feedback

COLUMNS = ("source", "play", "instance", "outcome", "turn", "tokens", "student", *CONDITIONS)
"""One row per action: its play's outcome G, its reply's token count, the student's
log-likelihood and the gain g^c_t of each condition."""
SOURCES = ("gold", "sampled")


@dataclass(frozen=True)
class GapPlan:
    """What the gap is measured on."""

    plays: int = 32
    """Eval instances drawn (seeded); each gives one gold and one sampled play."""
    seed: int = 0


def eval_instances(cfg: Any, plan: GapPlan) -> list[str]:
    """``plan.plays`` distinct eval instances of the config's games, drawn with ``plan.seed``."""
    from factor_cli.train.data import instances

    pool = sorted(i.instance_id for i in instances(cfg, "eval"))
    return random.Random(f"teacher-gap:{plan.seed}").sample(pool, min(plan.plays, len(pool)))


def gold_plays(cfg: Any, ids: Sequence[str]) -> list[tuple[str, int, list[str]]]:
    """(instance, group 0, gold plan cut at the turn limit) of each instance."""
    from factor_cli.envs import make_env

    limit = int(cfg.env.max_turns or 0) or 10**9
    with make_env(cfg.env.name, **cfg.env.options) as env:
        return [(i, 0, list(env.gold_actions(i))[:limit]) for i in ids]


def sampled_plays(cfg: Any, backend: Any, ids: Sequence[str], seed: int) -> list[Episode]:
    """One play of each instance by the policy at the rollout temperature."""
    from factor_cli.envs.pool import EnvPool
    from factor_cli.train.prompts import prompt_format

    turns = int(cfg.env.max_turns or 0) or 50
    jobs = [Job(Start(i, 0, [], None, turns), e, seed, cfg.rollout.temperature)
            for e, i in enumerate(ids)]  # fmt: skip
    with EnvPool.of(cfg.env, min(len(jobs), 64)) as pool:
        runner = RolloutRunner(pool, backend, prompt_format(cfg), turns,
                               constrain=cfg.rollout.valid_action_decoding)  # fmt: skip
        episodes, _ = runner.play(jobs)
    return episodes


def gains(
    cfg: Any, backend: Any, tokenizer: Any, episodes: list[Episode], seed: int
) -> pd.DataFrame:
    """The rows (:data:`COLUMNS`, ``source`` left blank) of every action of ``episodes``."""
    from factor_cli.train.prompts import prompt_format

    fmt = prompt_format(cfg)
    replies = [t.reply_ids for ep in episodes for t in ep.turns]
    allowed = [t.allowed_ids for ep in episodes for t in ep.turns]

    def total(texts: list[str]) -> list[float]:
        lps = reply_logprobs(backend.score, backend.encode, texts, replies, allowed,
                             cfg.rollout.temperature)  # fmt: skip
        return [float(sum(lp)) for lp in lps]

    student = total([render(fmt, v, tokenizer) for ep in episodes for v in turn_views(ep)])
    teacher = {c: total(teacher_prompt_texts(fmt, tokenizer, with_feedback(episodes, c, seed)))
               for c in CONDITIONS}  # fmt: skip
    rows = [(p, ep.start.instance_id, outcome_of(ep), t, len(tn.reply_ids))
            for p, ep in enumerate(episodes) for t, tn in enumerate(ep.turns)]  # fmt: skip
    frame = pd.DataFrame(rows, columns=["play", "instance", "outcome", "turn", "tokens"])
    frame["student"] = student
    for c in CONDITIONS:
        frame[c] = [g - s for g, s in zip(teacher[c], student)]
    return frame.assign(source="")[list(COLUMNS)]


def teacher_gap_rows(
    cfg: Any, policy: Any, plan: GapPlan, progress: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """:func:`gains` of the gold and the sampled plays of :func:`eval_instances` under
    ``policy`` (module docstring); ``attrs["dropped"]``: gold plays whose replay did not retrace
    the plan (an action the constrained decoder could not emit)."""
    from factor_cli.train.generation import make_backend

    ids = eval_instances(cfg, plan)
    backend = make_backend(cfg.rollout, policy)
    say = progress or (lambda _: None)
    try:
        say("gold plays")
        replayed = replay_trajectories(cfg, backend, gold_plays(cfg, ids))
        gold = [ep for ep in replayed if ep is not None]
        say("sampled plays")
        sampled = sampled_plays(cfg, backend, ids, plan.seed)
        say("scoring")
        frames = [gains(cfg, backend, policy.tokenizer, eps, plan.seed).assign(source=name)
                  for name, eps in zip(SOURCES, (gold, sampled)) if eps]  # fmt: skip
    finally:
        backend.close()
    out = pd.concat(frames, ignore_index=True)
    out.attrs["dropped"] = len(replayed) - len(gold)
    return out


def start_model(run_dir: Path) -> tuple[Any, str]:
    """(config, model folder) a training run started RL from: its warm start (the SFT folder
    of its config) or its base model; FileNotFoundError when that folder is not here."""
    from factor_cli.train.sft import sft_output_dir

    from .replay import run_config

    kept = sorted((run_dir / "checkpoints").glob("step-*"))
    if not kept:
        raise FileNotFoundError(f"{run_dir}: no checkpoint to read the run's config from")
    cfg = run_config(kept[-1])
    path = sft_output_dir(cfg) if cfg.sft.enabled else Path(cfg.model.path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{run_dir.name}: its start model {path} is not here (relative paths resolve from "
            "the folder the run was trained in); run `factor sft` with its config to rebuild it"
        )
    return cfg, str(path)


def start_gap_estimates(
    runs: pd.DataFrame, plan: GapPlan, cache: Path, progress: Callable[[str], None] | None = None
) -> pd.DataFrame:
    """:func:`teacher_gap_rows` of each run's start model (:func:`start_model`), with the runs'
    method, env and seed; cached per (run, plan) under ``cache``, written whole."""
    from factor_cli.atomic import atomic_target
    from factor_cli.policy.model import load_policy

    frames = []
    for run in runs.itertuples(index=False):
        path = cache / f"{run.run_id}-teacher-gap-p{plan.plays}-s{plan.seed}.csv"
        if path.exists():
            rows = pd.read_csv(path)
        else:
            cfg, model = start_model(Path(run.run_dir))
            policy = load_policy(model, cfg.model.dtype, cfg.model.device)
            rows = teacher_gap_rows(cfg, policy, plan, progress)
            cache.mkdir(parents=True, exist_ok=True)
            with atomic_target(path) as tmp:
                rows.to_csv(tmp, index=False)
        frames.append(rows.assign(run_id=run.run_id, method=run.method, env=run.env,
                                  seed=run.seed))  # fmt: skip
    return pd.concat(frames, ignore_index=True)
