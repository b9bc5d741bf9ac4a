"""``factor diagnose token-perturb``'s data (the paper's Fig. 5C, Tables 15-16): does the return
depend more on the tokens the allocation puts its mass on?

For a step k whose policy was kept, the trajectories of up to ``actions`` drawn credited actions
are replayed by script under checkpoint k - 1 (:func:`.feedback_probe.replay_step`), and the
method's allocation rho of each drawn action is recomputed with the true feedback. For an
action of L_t >= 2 action tokens, the ceil(L_t / 4) tokens of highest rho (``top``) and, apart,
those of lowest rho (``bottom``) are each replaced by a token drawn uniformly from the
vocabulary (seeded; never a stop token, never the token it replaces), or, with
``McPlan.replace = "admissible"``, from the tokens of the actions admissible in x_t (so that a
direction can become another direction and the perturbed action can still be played). The
perturbed reply's action a' is played from the restored x_t, and ``samples`` continuations under
the same policy (the continuations' temperature and horizon) follow it; as many follow the
recorded a_t from x_{t+1} (or its recorded return G when a_t ended the episode):

    Delta G_q = mean G(x_t, a'_q, ...) - mean G(x_t, a_t, ...),   q in {top, bottom}

A perturbed action is what the environment makes of the perturbed text: usually an action it
does not accept (``valid`` False: not among the admissible actions the prompt listed), which
TextWorldExpress answers without changing the state, so the episode loses a turn. Such actions
are counted, never dropped: a perturbation that breaks the action is exactly the damage being
measured. An action whose two quartiles decode to the recorded action again is kept too (its
Delta G is noise around 0).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from factor_cli.policy.generation.base import stop_token_ids
from factor_cli.policy.prompting import extract_action
from factor_cli.rollout.continuations import outcome_of
from factor_cli.rollout.runner import Job, RolloutRunner, Start

from .feedback_probe import allocation_weights, replay_step
from .replay import McPlan, ends_episode
from .td_sign import Progress, per_kept_step

COLUMNS = ("step", "traj", "turn", "credit", "length", "quartile", "action", "perturbed",
           "valid", "g_base", "g_perturbed", "delta", "samples")  # fmt: skip
QUARTILES = ("top", "bottom")


def quartile_positions(rho: torch.Tensor, which: str) -> list[int]:
    """Positions of an action's ceil(L / 4) highest (``top``) or lowest (``bottom``) rho; ties
    by position (stable)."""
    q = math.ceil(len(rho) / 4)
    order = torch.sort(rho, descending=which == "top", stable=True).indices
    return sorted(order[:q].tolist())


def perturb(
    reply: Sequence[int],
    positions: Sequence[int],
    vocab: int | Sequence[int],
    stops: set[int],
    rng: random.Random,
) -> list[int]:
    """``reply`` with each token at ``positions`` replaced by a uniform draw over ``vocab`` (a
    vocabulary size: every id below it; or the candidate ids) less the stop tokens and the
    token it replaces; a position with no candidate left keeps its token."""
    out = list(reply)
    for j in positions:
        if isinstance(vocab, int):  # rejection sampling: the draws of every cached estimate
            while True:
                tok = rng.randrange(vocab)
                if tok not in stops and tok != out[j]:
                    break
        else:
            pool = [t for t in vocab if t not in stops and t != out[j]]
            tok = rng.choice(pool) if pool else out[j]
        out[j] = tok
    return out


def admissible_tokens(tokenizer: Any, admissible: Sequence[str]) -> list[int]:
    """The distinct token ids of the admissible actions, each encoded alone and after a space
    (a BPE token differs at the start of a word), sorted."""
    ids: set[int] = set()
    for action in admissible:
        for text in (action, f" {action}"):
            ids.update(tokenizer.encode(text, add_special_tokens=False))
    return sorted(ids)


def _perturbed_actions(step: Any, method: str, plan: McPlan) -> list[dict[str, Any]]:
    """Per drawn action of >= 2 action tokens and quartile: the perturbed action text."""
    (rb, weight), = allocation_weights(step, method, ["true"], plan.seed).values()  # fmt: skip
    tok = step.policy.tokenizer
    stops = set(stop_token_ids(tok))
    idx = rb.batch.action_index.long()
    rng = random.Random(f"token-perturb:{plan.seed}:{int(step.rows['step'].iloc[0])}")
    out = []
    for a, row in enumerate(step.rows.itertuples(index=False)):
        if (int(row.traj), int(row.turn)) not in step.drawn:
            continue
        mask = rb.action_masks[a]
        action_pos = [j for j, m in enumerate(mask) if m]  # reply positions of action tokens
        if len(action_pos) < 2:
            continue
        rho = weight[idx == a]
        episode, t = rb.turn_of_action[a]
        turn = step.episodes[episode].turns[t]
        pool = len(tok) if plan.replace == "vocab" else admissible_tokens(tok, turn.admissible)
        for quartile in QUARTILES:
            where = [action_pos[j] for j in quartile_positions(rho, quartile)]
            reply = perturb(rb.replies[a], where, pool, stops, rng)
            text = extract_action(tok.decode(reply, skip_special_tokens=True)).text
            out.append({"traj": int(row.traj), "turn": int(row.turn), "credit": row.credit,
                        "length": len(action_pos), "quartile": quartile, "action": row.action,
                        "perturbed": text, "valid": text in turn.admissible})  # fmt: skip
    return out


def perturb_rows(
    run_dir: Path, step_actions: pd.DataFrame, method: str, plan: McPlan, on_turn: Any = None
) -> pd.DataFrame:
    """One step's perturbations played out (:data:`COLUMNS`, one row per action and
    quartile)."""
    step = replay_step(run_dir, step_actions, plan, on_turn)
    if step is None:  # the step credited no action: nothing drawn
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        return _play_out(step, int(step_actions["step"].iloc[0]), method, plan, on_turn)
    finally:
        step.close()


def _play_out(step: Any, k: int, method: str, plan: McPlan, on_turn: Any) -> pd.DataFrame:
    """Each drawn action's perturbations and the recorded action played out with the replay's
    backend, as :func:`perturb_rows` says."""
    from factor_cli.envs.pool import EnvPool
    from factor_cli.train.prompts import prompt_format

    cfg = step.cfg
    horizon, temp = cfg.continuations.horizon, cfg.continuations.temperature
    max_turns = int(cfg.env.max_turns or 0) or 10**9
    cases = _perturbed_actions(step, method, plan)
    plays = {t: g["action"].astype(str).tolist() for t, g in step.rows.groupby("traj")}
    first = step.rows.groupby("traj").first()
    n = plan.samples
    # Per drawn action: n plays after a_t (shared by its quartiles), then n after each a'_q.
    actions = list(dict.fromkeys((c["traj"], c["turn"]) for c in cases))
    lasts = {key: [plays[key[0]][key[1]]] for key in actions}
    for c in cases:
        lasts[(c["traj"], c["turn"])].append(c["perturbed"])
    records = step.rows.set_index(["traj", "turn"])
    ended = {key: ends_episode(pd.Series({**records.loc[key].to_dict(), "turn": key[1]}),
                               max_turns) for key in actions}  # fmt: skip
    jobs: list[Job] = []
    slot: dict[tuple[int, int, int], int] = {}  # (traj, turn, side) -> first job index
    for traj, turn in actions:
        where = first.loc[traj]
        for side, last in enumerate(lasts[(traj, turn)]):
            if side == 0 and ended[(traj, turn)]:  # a_t ended it: G is the recorded return
                continue
            start = Start(str(where["instance"]), int(where["group"]),
                          [*plays[traj][:turn], last], None, horizon)  # fmt: skip
            slot[(traj, turn, side)] = len(jobs)
            jobs += [Job(start, len(jobs) + s, plan.seed, temp, scored=False) for s in range(n)]
    with EnvPool.of(cfg.env, min(max(len(jobs), 1), 64)) as pool:
        runner = RolloutRunner(pool, step.backend, prompt_format(cfg), horizon,
                               constrain=cfg.rollout.valid_action_decoding)  # fmt: skip
        episodes, _ = runner.play(jobs, on_turn=on_turn) if jobs else ([], [])
    side_of: dict[tuple[int, int], int] = {}
    rows = []
    for case in cases:
        key = (case["traj"], case["turn"])
        side_of[key] = side_of.get(key, 0) + 1
        lo = slot[(*key, side_of[key])]
        pert = episodes[lo : lo + n]
        if ended[key]:
            g_base = float(records.loc[key, "outcome"])
        else:
            lo = slot[(*key, 0)]
            g_base = sum(map(outcome_of, episodes[lo : lo + n])) / n
        g_pert = sum(map(outcome_of, pert)) / n
        rows.append({"step": k, **case, "g_base": g_base,
                     "g_perturbed": g_pert, "delta": g_pert - g_base, "samples": n})  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))


def perturb_estimates(
    actions: pd.DataFrame, runs: pd.DataFrame, plan: McPlan, cache: Path, progress: Progress
) -> pd.DataFrame:
    """:func:`perturb_rows` of every replayable step of ``runs`` (each must have a teacher),
    cached per (run, step) (:func:`.td_sign.per_kept_step`)."""
    return per_kept_step(actions, runs, plan, cache, progress, perturb_rows, teacher=True)
