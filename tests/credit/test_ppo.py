"""PPO with a learned critic, credit side: token GAE across turns, whitening and the clipped
value loss against loop oracles; the method's registry entry; its configuration errors."""

from __future__ import annotations

import pytest
import torch
from oracles import random_batch, segments

from factor_cli.credit import (
    METHODS,
    TOKEN_ESTIMATORS,
    CreditConfig,
    PackedBatch,
    assign_credit,
    terminal_rewards,
    token_gae,
    value_loss,
    whiten,
)


def gae_oracle_tokens(rewards, token_values, action_index, traj_index, gamma, lam):
    """The token chain from its definition: per trajectory its action tokens in order, r on
    each action's last token, V = 0 past the chain, A_n = sum_l (gamma lam)^l delta_{n+l}."""
    acts = segments(action_index.tolist())
    adv = [0.0] * len(token_values)
    ret = [0.0] * len(token_values)
    for actions in segments(traj_index.tolist()).values():
        chain = [j for a in actions for j in acts[a]]
        r = [0.0] * len(chain)
        for a in actions:
            r[chain.index(acts[a][-1])] = float(rewards[a])
        v = [float(token_values[j]) for j in chain]
        delta = [r[n] + gamma * (v[n + 1] if n + 1 < len(v) else 0.0) - v[n] for n in range(len(v))]
        for n, j in enumerate(chain):
            adv[j] = sum((gamma * lam) ** m * delta[n + m] for m in range(len(chain) - n))
            ret[j] = adv[j] + v[n]
    return adv, ret


def value_loss_oracle(v, v_old, ret, action_index, reduction, clip):
    per = []
    for x, o, r in zip(v.tolist(), v_old.tolist(), ret.tolist()):
        c = o + min(max(x - o, -clip), clip)
        per.append(0.5 * max((x - r) ** 2, (c - r) ** 2))
    if reduction == "token-mean":
        return sum(per) / len(per)
    groups = segments(action_index.tolist())
    return sum(sum(per[j] for j in js) / len(js) for js in groups.values()) / len(groups)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (1.0, 0.0)])
def test_token_gae_matches_loop_oracle(seed: int, gamma: float, lam: float) -> None:
    b = random_batch(seed)
    values = b.gap / 3
    got = token_gae(b.rewards, values, b.action_index, b.traj_index, gamma, lam)
    adv, ret = gae_oracle_tokens(b.rewards, values, b.action_index, b.traj_index, gamma, lam)
    torch.testing.assert_close(got.advantages, torch.tensor(adv, dtype=torch.float64))
    torch.testing.assert_close(got.returns, torch.tensor(ret, dtype=torch.float64))


def test_last_token_of_an_action_bootstraps_from_the_next_actions_boundary() -> None:
    """Two actions of 2 and 1 tokens; lambda 0: A = delta. Token 2 (action 0's last) reads V
    at token 3 (action 1's first: the boundary after the observation); the chain ends with
    V = 0 and the terminal reward on the last action's last token."""
    v = torch.tensor([0.1, 0.4, 0.7], dtype=torch.float64)
    rewards = torch.tensor([0.0, 1.0], dtype=torch.float64)
    got = token_gae(rewards, v, torch.tensor([0, 0, 1]), torch.tensor([0, 0]), 1.0, 0.0)
    torch.testing.assert_close(got.advantages, torch.tensor([0.3, 0.3, 0.3], dtype=torch.float64))
    mc = token_gae(rewards, v, torch.tensor([0, 0, 1]), torch.tensor([0, 0]), 1.0, 1.0)
    torch.testing.assert_close(mc.advantages, 1.0 - v)  # lambda 1: Monte-Carlo return - V
    torch.testing.assert_close(mc.returns, torch.ones(3, dtype=torch.float64))


def test_chains_end_at_their_trajectory() -> None:
    b = random_batch(2)
    values = b.gap / 3
    whole = token_gae(b.rewards, values, b.action_index, b.traj_index, 1.0, 0.95).advantages
    tok_traj = b.traj_index[b.action_index]
    for i in range(b.v0.numel()):
        acts = (b.traj_index == i).nonzero().squeeze(1)
        toks = (tok_traj == i).nonzero().squeeze(1)
        alone = token_gae(
            b.rewards[acts],
            values[toks],
            b.action_index[toks] - int(acts[0]),
            torch.zeros(acts.numel(), dtype=torch.long),
        ).advantages
        torch.testing.assert_close(whole[toks], alone)


def test_whiten() -> None:
    x = torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 + 2
    w = whiten(x)
    assert abs(float(w.mean())) < 1e-12
    assert float(w.std()) == pytest.approx(1.0, abs=1e-6)
    assert float(whiten(torch.tensor([5.0]))[0]) == 0.0


@pytest.mark.parametrize("reduction", ["token-mean", "action-mean"])
@pytest.mark.parametrize("seed", range(3))
def test_value_loss_matches_oracle(reduction: str, seed: int) -> None:
    b = random_batch(seed)
    g = torch.Generator().manual_seed(seed)
    v_old = torch.randn(b.action_index.numel(), generator=g, dtype=torch.float64)
    v = v_old + torch.randn(v_old.shape, generator=g, dtype=torch.float64)
    ret = torch.randn(v_old.shape, generator=g, dtype=torch.float64)
    got = value_loss(v, v_old, ret, b.action_index, reduction, clip=0.5)
    want = value_loss_oracle(v, v_old, ret, b.action_index, reduction, 0.5)
    assert float(got) == pytest.approx(want, abs=1e-10)


def test_value_clipping_by_hand() -> None:
    """V_old = 0, c = 0.5: V = 2 toward R = 3 takes the clipped term (0.5 - 3)^2 / 2; V = 2
    past R = 1.8 too, (0.5 - 1.8)^2 / 2; inside the clip range the plain term."""
    old = torch.zeros(1, dtype=torch.float64)
    idx = torch.zeros(1, dtype=torch.long)

    def loss(v: float, r: float) -> float:
        vt, rt = torch.tensor([v], dtype=torch.float64), torch.tensor([r], dtype=torch.float64)
        return float(value_loss(vt, old, rt, idx, "token-mean", 0.5))

    assert loss(2.0, 3.0) == pytest.approx(0.5 * 2.5**2)
    assert loss(2.0, 1.8) == pytest.approx(0.5 * 1.3**2)
    assert loss(0.2, 1.0) == pytest.approx(0.5 * 0.8**2)


def _packed(seed: int, token_values: bool = True) -> PackedBatch:
    b = random_batch(seed)
    return PackedBatch(
        b.action_index,
        b.logp_old,
        b.traj_index,
        b.group_index,
        b.outcome,
        token_values=b.gap / 3 if token_values else None,
    )


@pytest.mark.parametrize("whiten_flag", [True, False])
def test_assign_credit_gives_token_gae_on_the_terminal_reward(whiten_flag: bool) -> None:
    batch = _packed(4)
    cfg = CreditConfig(ppo_lambda=0.9, ppo_whiten=whiten_flag)
    out = assign_credit(batch, "ppo", 3, cfg, reduction="token-mean")
    # Leave-one-out: r_{T-1} = G_i on the last action.
    rewards = terminal_rewards(batch.outcome, batch.traj_index)
    adv, ret = gae_oracle_tokens(
        rewards, batch.token_values, batch.action_index, batch.traj_index, 1.0, 0.9
    )
    torch.testing.assert_close(out.coef, torch.tensor(adv, dtype=torch.float64))
    torch.testing.assert_close(out.returns, torch.tensor(ret, dtype=torch.float64))
    assert out.token_values is batch.token_values
    assert (out.whiten, out.kl_coef, out.reduction) == (whiten_flag, 0.0, "token-mean")
    assert bool((out.weight == 1).all())


def test_missing_token_values_is_one_line_error() -> None:
    with pytest.raises(ValueError, match="token_values is missing: critic-gae credit") as err:
        assign_credit(_packed(0, token_values=False), "ppo", 1)
    assert "\n" not in str(err.value)


def test_only_ppo_trains_a_critic() -> None:
    critic = [name for name in METHODS.names() if METHODS.get(name).critic]
    assert critic == ["ppo"]
    spec = METHODS.get("ppo")
    assert (spec.uses_value_head, spec.uses_teacher, spec.continuations) == (False, False, False)
    assert spec.estimator in TOKEN_ESTIMATORS.names()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ppo_lambda", 1.5),
        ("ppo_gamma", -0.1),
        ("ppo_value_clip", 0.0),
        ("ppo_whiten", "yes"),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"credit.{field} = ") as err:
        CreditConfig(**{field: value})
    assert "\n" not in str(err.value)


def test_function_defaults_are_credit_config() -> None:
    import inspect

    cfg = CreditConfig()
    gae = inspect.signature(token_gae).parameters
    assert (
        (gae["gamma"].default, gae["lam"].default)
        == (cfg.ppo_gamma, cfg.ppo_lambda)
        == (
            1.0,
            0.95,
        )
    )
    assert inspect.signature(value_loss).parameters["clip"].default == cfg.ppo_value_clip == 0.5
    assert cfg.ppo_whiten is True
