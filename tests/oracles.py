"""Slow, obviously-correct loop versions of the credit equations, and random packed batches.

Everything here loops over trajectories, actions and tokens in plain Python floats, written
straight from docs/design.md section 4, so the vectorised core is checked against an independent
reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from factor_cli.credit import PackedBatch


@dataclass
class RandomBatch:
    lengths_T: list[int]  # actions per trajectory
    lengths_L: list[int]  # tokens per action
    traj_index: torch.Tensor  # [N_act]
    action_index: torch.Tensor  # [N_tok]
    group_index: torch.Tensor  # [N_traj]
    rewards: torch.Tensor  # [N_act]
    values: torch.Tensor  # [N_act]
    v0: torch.Tensor  # [N_traj]
    outcome: torch.Tensor  # [N_traj]
    credit: torch.Tensor  # [N_act]
    gap: torch.Tensor  # [N_tok]
    logp: torch.Tensor  # [N_tok]
    logp_old: torch.Tensor  # [N_tok]
    state_key: torch.Tensor  # [N_act]


def random_batch(
    seed: int,
    n_groups: int = 3,
    k: int = 4,
    max_t: int = 7,
    max_l: int = 9,
    dtype: torch.dtype = torch.float64,
    zero_credit_frac: float = 0.1,
) -> RandomBatch:
    """A random packed batch with varied lengths (including T = 1 and L = 1)."""
    g = torch.Generator().manual_seed(seed)
    n_traj = n_groups * k
    lengths_T = torch.randint(1, max_t + 1, (n_traj,), generator=g).tolist()
    lengths_T[0] = 1
    n_act = sum(lengths_T)
    lengths_L = torch.randint(1, max_l + 1, (n_act,), generator=g).tolist()
    lengths_L[0] = 1
    traj_index = torch.repeat_interleave(torch.arange(n_traj), torch.tensor(lengths_T))
    action_index = torch.repeat_interleave(torch.arange(n_act), torch.tensor(lengths_L))
    n_tok = action_index.numel()
    credit = torch.randn(n_act, generator=g, dtype=dtype)
    credit[torch.rand(n_act, generator=g) < zero_credit_frac] = 0.0
    logp_old = -torch.rand(n_tok, generator=g, dtype=dtype) * 4
    return RandomBatch(
        lengths_T=lengths_T,
        lengths_L=lengths_L,
        traj_index=traj_index,
        action_index=action_index,
        group_index=torch.arange(n_traj) // k,
        rewards=torch.randn(n_act, generator=g, dtype=dtype),
        values=torch.rand(n_act, generator=g, dtype=dtype),
        v0=torch.rand(n_traj, generator=g, dtype=dtype),
        outcome=(torch.rand(n_traj, generator=g) < 0.5).to(dtype),
        credit=credit,
        gap=torch.randn(n_tok, generator=g, dtype=dtype) * 3,
        logp=logp_old + torch.randn(n_tok, generator=g, dtype=dtype) * 0.3,
        logp_old=logp_old,
        state_key=torch.randint(0, 3, (n_act,), generator=g),
    )


def as_packed(b: RandomBatch, convention: str = "leave-one-out") -> PackedBatch:
    """``b`` as the credit core's packed batch (teacher log-probs logp_old + gap)."""
    return PackedBatch(
        action_index=b.action_index,
        logp_old=b.logp_old,
        traj_index=b.traj_index,
        group_index=b.group_index,
        outcome=b.outcome,
        convention=convention,
        logp_teacher=b.logp_old + b.gap,
        values=b.values,
        state_key=b.state_key,
    )


def segments(index: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pos, s in enumerate(index):
        out.setdefault(s, []).append(pos)
    return out


def potential(vals: list[float], v0: float, t: int, T: int) -> float:
    """V~(x_t): v0 at t = 0, the value head for 0 < t < T, 0 from T on."""
    if t == 0:
        return v0
    if t < T:
        return vals[t]
    return 0.0


def td_oracle(rewards, values, traj_index, v0) -> list[float]:
    out = [0.0] * len(rewards)
    for i, idx in segments(traj_index.tolist()).items():
        T = len(idx)
        vals = [float(values[a]) for a in idx]
        for t, a in enumerate(idx):
            out[a] = (
                float(rewards[a])
                + potential(vals, float(v0[i]), t + 1, T)
                - potential(vals, float(v0[i]), t, T)
            )
    return out


def mc_values_oracle(returns, state_index, traj_index, v0) -> list[float]:
    """VinePPO's V-hat(x_t) on the boundary conventions: v0 at t = 0; for 0 < t < T the mean
    return of the continuations started from x_t, or, with none, V-hat of the state before."""
    out = [0.0] * len(traj_index)
    for i, idx in segments(traj_index.tolist()).items():
        for t, a in enumerate(idx):
            rs = [float(r) for r, s in zip(returns, state_index.tolist()) if s == a]
            if t == 0:
                out[a] = float(v0[i])
            elif rs:
                out[a] = sum(rs) / len(rs)
            else:
                out[a] = out[idx[t - 1]]
    return out


def n_step_oracle(rewards, values, traj_index, v0, n) -> list[float]:
    out = [0.0] * len(rewards)
    for i, idx in segments(traj_index.tolist()).items():
        T = len(idx)
        vals = [float(values[a]) for a in idx]
        for t, a in enumerate(idx):
            ret = sum(float(rewards[idx[t + m]]) for m in range(n) if t + m < T)
            out[a] = (
                ret + potential(vals, float(v0[i]), t + n, T) - potential(vals, float(v0[i]), t, T)
            )
    return out


def gae_oracle(rewards, values, traj_index, v0, lam) -> list[float]:
    delta = td_oracle(rewards, values, traj_index, v0)
    out = [0.0] * len(rewards)
    for idx in segments(traj_index.tolist()).values():
        T = len(idx)
        for t, a in enumerate(idx):
            out[a] = sum(lam**m * delta[idx[t + m]] for m in range(T - t))
    return out


def sign(x: float) -> float:
    return (x > 0) - (x < 0)


def allocation_oracle(gap, action_index, credit, eta, tau, d) -> list[float]:
    out = [0.0] * len(gap)
    for a, toks in segments(action_index.tolist()).items():
        L = len(toks)
        s = [sign(float(credit[a])) * min(max(float(gap[j]), -d), d) / tau for j in toks]
        m = max(s)
        z = sum(math.exp(x - m) for x in s)
        for j, x in zip(toks, s):
            rho = (1 - eta) / L + eta * math.exp(x - m) / z
            out[j] = L * rho
    return out


def serl_oracle(gap, action_index, advantage, alpha, lo, hi) -> list[float]:
    out = []
    for j, a in enumerate(action_index.tolist()):
        x = sign(float(advantage[a])) * float(gap[j])
        psi = min(max(math.exp(min(max(x, -20.0), 20.0)), lo), hi)
        out.append((1 - alpha) + alpha * psi)
    return out


def loss_oracle(logp, logp_old, coef, action_index, reduction, eps) -> float:
    per_tok = []
    for j in range(len(logp)):
        q = math.exp(float(logp[j]) - float(logp_old[j]))
        c = float(coef[j])
        per_tok.append(-min(q * c, min(max(q, 1 - eps), 1 + eps) * c))
    if reduction == "token-mean":
        return sum(per_tok) / len(per_tok)
    if reduction != "action-mean":
        raise ValueError(f"no oracle for reduction {reduction!r}")
    acts = segments(action_index.tolist())
    return sum(sum(per_tok[j] for j in toks) / len(toks) for toks in acts.values()) / len(acts)


def loo_oracle(outcome, group_index) -> tuple[list[float], list[float]]:
    groups = segments(group_index.tolist())
    base = [0.0] * len(outcome)
    for members in groups.values():
        for i in members:
            others = [float(outcome[j]) for j in members if j != i]
            base[i] = sum(others) / len(others)
    return [float(outcome[i]) - base[i] for i in range(len(outcome))], base


def standardize_oracle(outcome, group_index, eps=1e-8, min_std=1e-6) -> list[float]:
    out = [0.0] * len(outcome)
    for members in segments(group_index.tolist()).values():
        xs = [float(outcome[i]) for i in members]
        mu = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs))
        for i in members:
            out[i] = 0.0 if sd < min_std else (float(outcome[i]) - mu) / (sd + eps)
    return out


def gigpo_oracle(
    rewards, traj_index, group_index, state_key, a_episode, gamma, omega, norm, eps=1e-6
):
    n = len(rewards)
    trajs = segments(traj_index.tolist())
    ret = [0.0] * n
    for idx in trajs.values():
        for t, a in enumerate(idx):
            ret[a] = sum(gamma**m * float(rewards[idx[t + m]]) for m in range(len(idx) - t))
    anchors: dict[tuple[int, int], list[int]] = {}
    for a in range(n):
        key = (int(group_index[int(traj_index[a])]), int(state_key[a]))
        anchors.setdefault(key, []).append(a)
    out = [0.0] * n
    for members in anchors.values():
        xs = [ret[a] for a in members]
        mu = sum(xs) / len(xs)
        for a in members:
            if len(members) == 1:
                step = 0.0
            elif norm == "std":
                sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))
                step = (ret[a] - mu) / (sd + eps)
            else:
                step = ret[a] - mu
            out[a] = float(a_episode[int(traj_index[a])]) + omega * step
    return out


def hgpo_oracle(
    rewards,
    traj_index,
    group_index,
    state_key,
    a_episode,
    depth,
    gamma,
    alpha,
    norm,
    base_group=False,
    eps=1e-6,
):
    """HGPO from its definition: group by (task group, last k+1 states), k = 0..depth."""
    n = len(rewards)
    trajs = segments(traj_index.tolist())
    ret, turn = [0.0] * n, [0] * n
    for idx in trajs.values():
        for t, a in enumerate(idx):
            ret[a] = sum(gamma**m * float(rewards[idx[t + m]]) for m in range(len(idx) - t))
            turn[a] = t
    groups: dict[tuple, list[int]] = {}
    for i, idx in trajs.items():
        for t, a in enumerate(idx):
            for k in range(min(depth, t) + 1):
                window = tuple(int(state_key[idx[s]]) for s in range(t - k, t + 1))
                groups.setdefault((k, int(group_index[i]), window), []).append(a)
    items: list[list[tuple[float, float]]] = [[] for _ in range(n)]  # (L, A_k) per action
    for (k, _, _), members in groups.items():
        xs = [ret[a] for a in members]
        mu = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs))
        if len(xs) < 2 or max(xs) == min(xs):
            continue
        for a in members:
            if abs(ret[a] - mu) <= 8 * 2.0**-52 * max(abs(x) for x in xs):
                continue  # a return at the group mean: advantage 0, not counted
            adv = (ret[a] - mu) / (sd + eps) if norm == "std" else ret[a] - mu
            items[a].append((k + 2.0, adv))
    out = []
    for a in range(n):
        its = list(items[a])
        base = float(a_episode[int(traj_index[a])])
        if base_group and base != 0.0:
            its.append((1.0, base))
        den = sum(length**alpha for length, _ in its)
        out.append(sum(length**alpha * x for length, x in its) / (den + eps))
    return out


def batch_global_oracle(gap, action_index, credit, eta, tau, d) -> list[float]:
    """Batch-global norm: one softmax over every token of the batch, omega = L_t rho."""
    s = [
        sign(float(credit[a])) * min(max(float(g), -d), d) / tau
        for g, a in zip(gap.tolist(), action_index.tolist())
    ]
    m = max(s)
    z = sum(math.exp(x - m) for x in s)
    acts = segments(action_index.tolist())
    return [
        (1 - eta) + eta * len(acts[a]) * math.exp(x - m) / z
        for x, a in zip(s, action_index.tolist())
    ]


def broadcast_oracle(a_seq, traj_index) -> list[float]:
    """A_t = A^seq_i on every action (GRPO, SERL, Monte-Carlo credit)."""
    return [float(a_seq[i]) for i in traj_index.tolist()]


def uniform_credit_oracle(a_seq, traj_index) -> list[float]:
    """A_t = A^seq_i / T_i (w/o TAC)."""
    trajs = segments(traj_index.tolist())
    return [float(a_seq[i]) / len(trajs[i]) for i in traj_index.tolist()]


def kl_oracle(teacher_logits, student_logits) -> float:
    """1/N_tok sum_j sum_v p_T(v) [log p_T(v) - log p_theta(v)]."""
    total = 0.0
    for zt, zs in zip(teacher_logits.tolist(), student_logits.tolist()):
        lt = [x - max(zt) for x in zt]
        ls = [x - max(zs) for x in zs]
        nt = math.log(sum(math.exp(x) for x in lt))
        ns = math.log(sum(math.exp(x) for x in ls))
        total += sum(math.exp(a - nt) * ((a - nt) - (b - ns)) for a, b in zip(lt, ls))
    return total / len(teacher_logits)


def terminal_target_oracle(convention, outcome, group, root_outcome, root_group) -> list[float]:
    """A continuation's outcome on the scale of r_{T-1}: standardised with the root group's
    mean and population std under group-standardize, unchanged otherwise."""
    if convention != "group-standardize":
        return [float(x) for x in outcome]
    out = []
    for x, g in zip(outcome.tolist(), group.tolist()):
        xs = [float(r) for r, h in zip(root_outcome, root_group.tolist()) if h == g]
        mu = sum(xs) / len(xs)
        sd = math.sqrt(sum((r - mu) ** 2 for r in xs) / len(xs))
        out.append(0.0 if sd < 1e-6 else (x - mu) / (sd + 1e-8))
    return out
