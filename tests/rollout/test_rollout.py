"""Rollouts on real environments with a real tiny model: generation, action spans, teacher,
restore, continuations and packing into the credit core's batch."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from factor_cli.credit import METHODS, assign_credit
from factor_cli.envs import availability
from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.base import Generation
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.generation.row_sampler import RowSeededSampler
from factor_cli.policy.generation.scoring import score_replies
from factor_cli.policy.model import load_policy
from factor_cli.policy.prompting import FEEDBACK_HEADER, PromptFormat, extract_action, render
from factor_cli.rollout.continuations import run_continuations, select_checkpoints
from factor_cli.rollout.packing import pack_episodes
from factor_cli.rollout.runner import FailureKind, RolloutRunner, Start
from factor_cli.rollout.teacher import teacher_logprobs, teacher_prompt_texts, turn_views

twx_missing = availability("twx")
pytestmark = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
FMT = PromptFormat(admissible=True)  # the twx default: prompts list the admissible actions


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="module")
def gen(policy) -> HFGenerator:
    return HFGenerator(policy, max_new_tokens=16, max_context=1024)


def _max_diff(gens: list[Generation], model, pad_id: int) -> float:
    sc = score_replies(
        model, [g.prompt_ids for g in gens], [g.token_ids for g in gens], 1.0, pad_id
    )
    return max(float((s - torch.tensor(g.logprobs)).abs().max()) for s, g in zip(sc.logprobs, gens))


def test_behaviour_logprobs_equal_rescore(policy, gen: HFGenerator) -> None:
    prompts = [f"You are in room {i}. Find the coin." * (1 + i) for i in range(5)]
    prompts += [prompts[0]] * 3  # repeated prompts take the shared-prefix path
    gens = gen.generate(prompts, temperature=1.0, seed=7)
    assert _max_diff(gens, policy.model, gen.pad_id) < 1e-5
    again = gen.generate(prompts, temperature=1.0, seed=7)
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]
    greedy = gen.generate(prompts[:2], greedy=True)
    assert greedy[0].token_ids == gen.generate(prompts[:1], greedy=True)[0].token_ids
    assert _max_diff(greedy, policy.model, gen.pad_id) < 1e-5


def test_temperature_logprobs_are_of_the_sampling_distribution(policy, gen: HFGenerator) -> None:
    gens = gen.generate(["Task: take the coin."] * 2, temperature=0.5, seed=1)
    sc = score_replies(
        policy.model, [g.prompt_ids for g in gens], [g.token_ids for g in gens], 0.5, gen.pad_id
    )
    for s, g in zip(sc.logprobs, gens):
        torch.testing.assert_close(s, torch.tensor(g.logprobs), atol=1e-5, rtol=0)


def test_a_checkpoints_generation_config_does_not_change_the_draw(policy, gen) -> None:
    """Replies come from softmax(z / T) itself: a repetition penalty or top-k in the model's
    generation config (real checkpoints ship them) would make the draw disagree with the
    behaviour log-probs; greedy replies stay the argmax of the raw logits."""
    config = policy.model.generation_config
    saved = (config.repetition_penalty, config.top_k)
    config.repetition_penalty, config.top_k = 50.0, 2
    try:
        prompts = [f"You are in room {i}. Find the coin." for i in range(3)]
        gens = gen.generate(prompts, greedy=True)
    finally:
        config.repetition_penalty, config.top_k = saved
    for g in gens:
        with torch.no_grad():
            z = policy.model(input_ids=torch.tensor([g.prompt_ids + g.token_ids])).logits[0]
        picks = z[len(g.prompt_ids) - 1 : -1].argmax(-1).tolist()
        assert picks == g.token_ids


def test_row_seeded_sampler_draws_from_softmax() -> None:
    """Gumbel-max with per-row streams: frequencies match softmax(z / T) (20,000 draws)."""
    z = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    for temperature in (1.0, 0.5):
        sampler = RowSeededSampler(range(20_000), temperature, torch.device("cpu"))
        picks = sampler.draw(z.expand(20_000, -1))
        freq = torch.bincount(picks, minlength=5).double() / 20_000
        expect = torch.softmax(z.double() / temperature, -1)
        assert float((freq - expect).abs().max()) < 0.012  # ~3.5 sd of the largest cell


def test_row_seeds_make_replies_independent_of_the_batch(policy, gen: HFGenerator) -> None:
    prompts = [f"You are in room {i}. Find the coin." for i in range(4)] + ["Take it."] * 3
    seeds = [11, 12, 13, 14, 15, 16, 17]
    whole = gen.generate(prompts, temperature=1.0, seeds=seeds)
    parts = gen.generate(prompts[:2], seeds=seeds[:2]) + gen.generate(prompts[2:], seeds=seeds[2:])
    alone = [gen.generate([p], seeds=[s])[0] for p, s in zip(prompts, seeds)]
    for a, b, c in zip(whole, parts, alone):
        assert a.token_ids == b.token_ids == c.token_ids
    assert len({tuple(g.token_ids) for g in whole[4:]}) > 1  # one prompt, three seeds
    assert _max_diff(whole, policy.model, gen.pad_id) < 1e-5


def test_context_limit_truncates_without_crash(policy) -> None:
    small = HFGenerator(policy, max_new_tokens=8, max_context=64)
    out = small.generate(["word " * 500, "short"], seed=0)
    assert out[0].prompt_truncated and len(out[0].prompt_ids) == 56 and not out[1].prompt_truncated
    assert all(len(g.token_ids) <= 8 for g in out)
    with pytest.raises(ValueError, match="must be <"):
        HFGenerator(policy, max_new_tokens=64, max_context=64)


@dataclass
class ScriptedGenerator:
    """Replies from a script (tokenized by the real tokenizer), log-probs from the real model."""

    policy: object
    inner: HFGenerator
    replies: dict[str, list[str]]
    calls: int = 0

    @property
    def tokenizer(self):
        return self.inner.tokenizer

    def generate(
        self, prompts, temperature=1.0, greedy=False, seed=None, seeds=None, allowed=None, keep=None
    ):
        encoded = self.inner.encode(prompts)
        outs = []
        for (ids, cut), prompt in zip(encoded, prompts):
            key = next(k for k in self.replies if k in prompt)
            text = self.replies[key][self.calls % len(self.replies[key])]
            reply = self.tokenizer.encode(text, add_special_tokens=False)
            lp = score_replies(self.policy.model, [ids], [reply], 1.0, self.inner.pad_id).logprobs[
                0
            ]
            outs.append(Generation(ids, reply, lp.tolist(), text, True, cut))
        self.calls += 1
        return outs


def test_decoded_action_tokens_equal_executed_text(policy, gen: HFGenerator) -> None:
    with EnvPool("twx", 1) as pool:
        gold = pool[0].gold_actions("coin/7")
        script = [f"Let me think.\n<action>{a}</action>" for a in gold]
        runner = RolloutRunner(
            pool, ScriptedGenerator(policy, gen, {"coin": script}), FMT, max_turns=10
        )
        (ep,) = runner.run([Start("coin/7")])
    assert ep.outcome.success and ep.actions == gold
    tok = policy.tokenizer
    for turn in ep.turns:
        action_ids = [t for t, m in zip(turn.reply_ids, turn.action_mask) if m]
        assert tok.decode(action_ids).strip() == turn.action
        assert 0 < sum(turn.action_mask) < len(turn.reply_ids)  # reasoning and tags are non-action


def test_failures_are_typed(gen: HFGenerator) -> None:
    """A failed start (unknown instance, diverging replay) and an engine dying mid-episode end
    their episodes with a typed kind; only the first two count as never started."""
    with EnvPool("twx", 3) as pool:

        def die(action: str):
            raise ConnectionResetError("simulated engine death")

        for slot in range(len(pool)):  # a slot freed by a failed start plays the next episode
            pool[slot]._step = die  # type: ignore[method-assign]
        starts = [
            Start("coin/999999999"),
            Start("coin/7", prefix_actions=["look around"], prefix_observations=["not it"]),
            Start("coin/8"),
        ]
        eps = RolloutRunner(pool, gen, FMT, max_turns=3).run(starts, seed=0)
    assert [ep.error.kind if ep.error else None for ep in eps] == [
        FailureKind.START,
        FailureKind.START,
        FailureKind.ENGINE,
    ]
    assert [ep.start_failed for ep in eps] == [True, True, False]
    assert all(ep.done and not ep.turns for ep in eps)
    assert str(eps[1].error).startswith("start failed: ") and "diverged" in eps[1].error.message
    assert str(eps[2].error).startswith("engine failure: ")
    assert "simulated engine death" in eps[2].error.message


def test_action_extraction_rules() -> None:
    assert extract_action("hmm <action> take coin </action> ok").text == "take coin"
    a = extract_action("<action>move west\nmore")
    assert a.text == "move west" and not a.tagged
    b = extract_action("\n\n  open door  \nrest")
    assert b.text == "open door" and "\n\n  open door".index("open") == b.start


@pytest.fixture(scope="module")
def roots(policy, gen: HFGenerator):
    pool = EnvPool("twx", 40, max_turns=6)  # as the trainer builds it: the episode's limit
    runner = RolloutRunner(pool, gen, FMT, max_turns=6)
    eps = runner.run([Start(f"coin/{30 + g}", group=g) for g in range(2) for _ in range(4)], seed=3)
    yield runner, eps
    pool.close()


def _trace(eps: list) -> list:
    return [(e.actions, [t.reply_ids for t in e.turns]) for e in eps]


class _FakeShard:
    """Rank ``rank`` of ``world``, all in one process: ranks run one after another and
    ``all_gather`` returns what every rank has contributed so far (the last rank sees all)."""

    def __init__(self, rank: int, world: int, store: dict) -> None:
        self.rank, self.world, self.store = rank, world, store

    def all_gather(self, obj):
        self.store[self.rank] = obj
        return [self.store.get(r, (([], []), (0, 0, 0))) for r in range(self.world)]


def test_episodes_do_not_depend_on_pool_width_or_sharding(gen: HFGenerator) -> None:
    starts = [Start(f"coin/{30 + g}", group=g) for g in range(3) for _ in range(2)]
    with EnvPool("twx", 6) as wide, EnvPool("twx", 2) as narrow:
        one = RolloutRunner(wide, gen, FMT, max_turns=4)
        ref = one.run(starts, seed=9)
        assert _trace(RolloutRunner(narrow, gen, FMT, max_turns=4).run(starts, seed=9)) == _trace(
            ref
        )
        store: dict = {}
        for rank in (1, 0):  # rank 0 last: it then holds both blocks
            runner = RolloutRunner(narrow, gen, FMT, max_turns=4, shard=_FakeShard(rank, 2, store))
            out = runner.run(starts, seed=9)
        assert _trace(out) == _trace(ref)
        assert runner.env_steps == one.env_steps


def test_roots_record_turns_and_restore_reproduces(roots) -> None:
    runner, eps = roots
    assert runner.env_steps == sum(len(e.turns) for e in eps)
    ep = max(eps, key=lambda e: len(e.turns))
    env = runner.pool[0]
    t = len(ep.turns) // 2
    obs = env.restore(ep.start.instance_id, ep.actions[:t], ep.observations[: t + 1])
    assert env.normalize(obs) == env.normalize(ep.observations[t])
    for turn, view in zip(ep.turns, turn_views(ep)):
        assert view.observation == turn.observation
        assert list(view.admissible) == turn.admissible
    # A turn records the admissible actions of its state (coin's lists are under the caps).
    assert env.valid_actions() == ep.turns[t].admissible
    assert all(e.turns[0].admissible for e in eps)


def test_teacher_differs_only_by_feedback(policy, gen: HFGenerator, roots) -> None:
    _, eps = roots
    tok = policy.tokenizer
    teacher_texts = teacher_prompt_texts(FMT, tok, eps)
    k = 0
    for ep in eps:
        for view, turn in zip(turn_views(ep), ep.turns):
            student = render(FMT, view, tok)
            assert gen.encode([student])[0][0] == turn.prompt_ids
            assert f"Admissible actions: [{', '.join(turn.admissible)}]" in student
            block = "\n\n" + FEEDBACK_HEADER + turn.feedback.strip()
            assert block in teacher_texts[k]
            assert teacher_texts[k].replace(block, "", 1) == student
            k += 1
    lt = teacher_logprobs(gen.score, tok, FMT, eps, gen.encode)
    student_lp = [t.logprobs for ep in eps for t in ep.turns]
    assert [len(x) for x in lt] == [len(x) for x in student_lp]
    assert any(abs(a - b) > 1e-4 for x, y in zip(lt, student_lp) for a, b in zip(x, y))


def test_checkpoint_rule_interior() -> None:
    rng = random.Random(0)
    assert select_checkpoints(1, 2, rng, "interior") == []
    assert select_checkpoints(2, 2, rng, "interior") == [1]
    assert select_checkpoints(3, 2, rng, "interior") == [1]
    for t_total in range(4, 40):
        for _ in range(5):
            first, second = select_checkpoints(t_total, 2, rng, "interior")
            assert 1 <= first <= t_total // 2 < second <= t_total - 1
    assert len(select_checkpoints(30, 4, rng, "interior")) == 4


def test_checkpoint_rule_paper_is_the_default_and_covers_its_support() -> None:
    """One draw uniformly among the first floor(T/2) actions {0..floor(T/2)-1}, one among the
    rest, for T >= 4; the midpoint for T < 4 (x_0 for T = 1): every state of each half is
    reachable, x_0 included."""
    rng = random.Random(0)
    assert select_checkpoints(1, 2, rng) == [0]
    assert select_checkpoints(2, 2, rng) == [1] and select_checkpoints(3, 2, rng) == [1]
    for t_total in range(4, 25):
        half = t_total // 2
        seen: list[set[int]] = [set(), set()]
        for _ in range(40 * t_total):
            first, second = select_checkpoints(t_total, 2, rng)
            assert 0 <= first < half <= second <= t_total - 1
            seen[0].add(first)
            seen[1].add(second)
        assert seen == [set(range(half)), set(range(half, t_total))]
    four = select_checkpoints(30, 4, rng)
    assert (
        len(four) == 4
        and [lo <= t < hi for t, lo, hi in zip(four, (0, 7, 15, 22), (7, 15, 22, 30))] == [True] * 4
    )
    with pytest.raises(ValueError, match="unknown checkpoint support 'middle'"):
        select_checkpoints(5, 2, rng, "middle")


def test_checkpoint_rule_every_is_each_interior_state() -> None:
    """Monte-Carlo values (vineppo, factor-mc): every x_t with 0 < t < T, whatever B."""
    rng = random.Random(0)
    for budget in (1, 2, 5):
        for t_total in range(1, 20):
            assert select_checkpoints(t_total, budget, rng, "every") == list(range(1, t_total))


def test_monte_carlo_values_from_every_interior_state(roots) -> None:
    """K continuations from each interior state of every root, each on a reply stream of its
    own; V-hat(x_t) is the mean of their targets, V~(x_0) at each first action."""
    from factor_cli.credit import CONVENTIONS
    from factor_cli.rollout.continuations import ContinuationPlan
    from factor_cli.rollout.values import monte_carlo_state_values

    runner, eps = roots
    plan = ContinuationPlan(budget=2, per_checkpoint=2, horizon=2, seed=4, support="every")
    keys = [job.key for r, e in enumerate(eps) for job in plan.jobs(r, e)]
    assert len(keys) == len(set(keys)) == 2 * sum(len(e.turns) - 1 for e in eps)
    res = run_continuations(runner, eps, "leave-one-out", 2, 2, horizon=2, seed=4, support="every")
    interior = [(r, t) for r, e in enumerate(eps) for t in range(1, len(e.turns))]
    assert [(cp.episode, cp.turn) for cp in res.checkpoints] == interior
    values, counts = monte_carlo_state_values(eps, res, "leave-one-out")
    outcome = torch.tensor([e.outcome.outcome for e in eps], dtype=torch.float64)
    v0 = CONVENTIONS.get("leave-one-out")(outcome, torch.tensor([e.start.group for e in eps])).v0
    row = 0
    for r, e in enumerate(eps):
        assert float(values[row]) == pytest.approx(float(v0[r])) and int(counts[row]) == 0
        for t in range(1, len(e.turns)):
            targets = [
                y
                for c, y, cont in zip(res.checkpoint_of, res.targets, res.episodes)
                if (res.checkpoints[c].episode, res.checkpoints[c].turn) == (r, t)
                and not cont.start_failed
            ]
            assert int(counts[row + t]) == len(targets) == 2
            assert float(values[row + t]) == pytest.approx(sum(targets) / len(targets))
        row += len(e.turns)


def test_continuations_counts_targets_and_restore(roots) -> None:
    runner, eps = roots
    res = run_continuations(
        runner, eps, "leave-one-out", budget=2, per_checkpoint=3, horizon=4, seed=5
    )
    expected = sum(len(select_checkpoints(len(e.turns), 2, random.Random(0))) for e in eps)
    assert len(res.checkpoints) == expected and len(res.episodes) == 3 * expected
    assert res.failed == 0 and len(res.targets) == len(res.episodes)
    assert res.interactions == sum(len(c.turns) for c in res.episodes)
    for c, cont in zip(res.checkpoint_of, res.episodes):
        cp = res.checkpoints[c]
        root = eps[cp.episode]
        assert cont.observations[: cp.turn + 1] == root.observations[: cp.turn + 1]
        assert cont.actions[: cp.turn] == root.actions[: cp.turn]
        assert 1 <= len(cont.turns) <= 4
    assert all(0.0 <= t <= 1.0 for t in res.targets)
    # The target scale per convention: tests/test_advantage.py (credit.terminal_targets).


def test_a_continuation_ends_where_its_episode_would(roots) -> None:
    """From x_t a continuation plays at most min(horizon, limit - t) turns: the episode's turn
    limit binds it as it bound the root ("or until the environment terminates"), so a target
    is the return the state can still reach, not a win within ``horizon`` more turns."""
    runner, eps = roots
    res = run_continuations(runner, eps, "leave-one-out", budget=2, per_checkpoint=3,
                            horizon=10, seed=5)  # fmt: skip
    ends = [res.checkpoints[c].turn + len(cont.turns) for c, cont in
            zip(res.checkpoint_of, res.episodes)]  # fmt: skip
    assert max(ends) == runner.max_turns == 6  # the limit binds some, and none passes it
    cut = [cont for cont in res.episodes if len(cont.actions) == 6 and not cont.outcome.success]
    assert cut, "no continuation reached the limit: the test would not see the bug"


def test_the_pool_enforces_the_turn_limit_across_a_restore(roots) -> None:
    """A restored prefix counts toward the limit: after t replayed actions, limit - t remain."""
    _, eps = roots
    ep = max(eps, key=lambda e: len(e.turns))
    with EnvPool("twx", 1, max_turns=3) as limited, EnvPool("twx", 1) as default:
        for pool in (limited, default):
            pool[0].restore(ep.start.instance_id, ep.actions[:2], ep.observations[:3])
        step = limited[0].step(ep.turns[2].admissible[0])
        assert step.done and (step.info.get("truncated") or limited[0].success)
        assert not default[0].step(ep.turns[2].admissible[0]).done or default[0].success
    settings = SimpleNamespace(name="twx", max_turns=3, options={})
    with EnvPool.of(settings, 1) as pool:  # how training and the replays open theirs
        assert pool[0].max_turns == 3


def test_packed_batch_feeds_every_method(policy, gen: HFGenerator, roots) -> None:
    _, eps = roots
    lt = teacher_logprobs(gen.score, policy.tokenizer, FMT, eps, gen.encode)
    n_act = sum(len(e.turns) for e in eps)
    rb = pack_episodes(eps, "leave-one-out", values=torch.rand(n_act), logp_teacher=lt)
    b = rb.batch
    assert b.num_trajectories == len(eps) and b.num_actions == n_act
    assert b.num_tokens + rb.na_logp_old.numel() == sum(
        len(t.reply_ids) for e in eps for t in e.turns
    )
    b = replace(b, token_values=torch.rand(b.num_tokens))  # PPO's critic values (trainer's)
    for method in METHODS:
        out = assign_credit(b, method, 20, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(out.coef).all()


@pytest.mark.skipif(availability("scienceworld") is not None, reason="scienceworld unavailable")
def test_scienceworld_rollout_and_restore(gen: HFGenerator) -> None:
    with EnvPool("scienceworld", 2) as pool:
        runner = RolloutRunner(pool, gen, FMT, max_turns=3)
        eps = runner.run([Start("melt/L0/4", group=0), Start("melt/L0/4", group=0)], seed=1)
        assert all(len(e.turns) == 3 and e.error is None for e in eps)
        res = run_continuations(runner, eps, "raw", budget=2, per_checkpoint=1, horizon=2, seed=0)
        assert res.failed == 0 and len(res.episodes) == 2
        for c, cont in zip(res.checkpoint_of, res.episodes):
            cp = res.checkpoints[c]
            root = eps[cp.episode]
            env = pool[0]
            assert [env.normalize(o) for o in cont.observations[: cp.turn + 1]] == [
                env.normalize(o) for o in root.observations[: cp.turn + 1]
            ]


def test_cached_scoring_equals_the_model_forward(policy) -> None:
    """The hf backend's scorer starts from its prefix cache (the rollout's prompts): the
    teacher's log-probs and the value head's boundary states equal a plain forward's."""
    from factor_cli.policy.generation.scoring import model_scorer
    from factor_cli.rollout.values import boundary_features

    own = HFGenerator(policy, max_new_tokens=16, max_context=1024, batch_size=7)
    runner = RolloutRunner(EnvPool("twx", 8), own, FMT, max_turns=4)
    played = runner.run([Start(f"coin/{40 + g}", group=g) for g in range(2) for _ in range(4)], 5)
    runner.pool.close()
    plain = model_scorer(policy.model, own.pad_id)
    before = own.score_reused_tokens
    got = teacher_logprobs(own.score, policy.tokenizer, FMT, played, own.encode)
    want = teacher_logprobs(plain, policy.tokenizer, FMT, played, own.encode)
    assert own.score_reused_tokens > before  # the student prompts' KV were reused
    for a, b in zip(got, want):
        assert a == pytest.approx(b, abs=1e-5)
    # The update's KL teacher: the logits at every reply position (masked to C_j), as well.
    tprompts = [ids for ids, _ in own.encode(teacher_prompt_texts(FMT, policy.tokenizer, played))]
    replies = [t.reply_ids for ep in played for t in ep.turns]
    # Every other reply as if constrained: C_j = {y_j, 3, 5}.
    allowed = [None if i % 2 else [sorted({y, 3, 5}) for y in r] for i, r in enumerate(replies)]
    cached = own.score(tprompts, replies, 1.0, allowed, return_logits=True).logits
    direct = plain(tprompts, replies, 1.0, allowed, return_logits=True).logits
    assert cached is not None and direct is not None and len(cached) == len(replies)
    for x, y in zip(cached, direct):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    prompts = [t.prompt_ids for ep in played for t in ep.turns]
    torch.testing.assert_close(
        boundary_features(own.score, prompts),
        boundary_features(plain, prompts),
        atol=1e-5,
        rtol=1e-5,
    )
    # A prompt of which the cache holds only a short head.
    fresh = [[*prompts[0][:5], 7, 8, 9]]
    torch.testing.assert_close(
        boundary_features(own.score, fresh), boundary_features(plain, fresh), atol=1e-5, rtol=1e-5
    )


def test_prompt_mean_features_match_a_loop_oracle(policy, roots) -> None:
    """value.features=prompt_mean: every layer's hidden state averaged over the prompt's tokens,
    concatenated; batched with padding it equals each prompt's own unpadded forward."""
    from factor_cli.rollout.values import VALUE_FEATURES, prompt_mean_features

    _, eps = roots
    prompts = [t.prompt_ids for e in eps for t in e.turns][:7]
    got = prompt_mean_features(policy.model, prompts, pad_id=0, batch_size=3)
    cfg = policy.model.config
    assert got.shape == (len(prompts), (cfg.num_hidden_layers + 1) * cfg.hidden_size)
    assert (
        VALUE_FEATURES.get("prompt_mean").size(cfg.hidden_size, cfg.num_hidden_layers)
        == (got.shape[1])
    )
    with torch.no_grad():
        for row, p in zip(got, prompts):
            out = policy.model(input_ids=torch.tensor([p]), output_hidden_states=True)
            want = torch.cat([h[0].mean(0) for h in out.hidden_states])
            torch.testing.assert_close(row, want, atol=1e-5, rtol=1e-5)
    was = policy.model.training
    policy.model.train()  # the forward runs in eval mode and hands the model back as it was
    prompt_mean_features(policy.model, prompts[:1])
    assert policy.model.training
    policy.model.train(was)
    with pytest.raises(ValueError, match="at least one token"):
        prompt_mean_features(policy.model, [[]])


def test_values_and_continuation_targets(policy, gen: HFGenerator, roots) -> None:
    from factor_cli.policy.value_head import TargetValueHead, ValueHead
    from factor_cli.rollout.values import boundary_features, value_training_pairs

    runner, eps = roots
    hidden = policy.model.config.hidden_size
    heads = TargetValueHead(ValueHead(hidden, 32))
    feats = boundary_features(gen.score, [t.prompt_ids for e in eps for t in e.turns], 5)
    values = heads.values(feats)
    n_act = sum(len(e.turns) for e in eps)
    assert values.shape == (n_act,) and feats.shape == (n_act, hidden)
    # Batching does not change a feature: one prompt alone gives the same vector.
    one = boundary_features(gen.score, [eps[0].turns[0].prompt_ids])
    torch.testing.assert_close(one[0], feats[0], atol=1e-5, rtol=1e-5)
    res = run_continuations(
        runner, eps, "leave-one-out", budget=2, per_checkpoint=2, horizon=2, seed=9
    )
    x, y = value_training_pairs(feats, eps, res)
    assert x.shape == (len(res.episodes), hidden) and y.shape == (len(res.episodes),)
    first = res.checkpoints[res.checkpoint_of[0]]
    row = sum(len(e.turns) for e in eps[: first.episode]) + first.turn
    torch.testing.assert_close(x[0], feats[row])
