"""Continuations that start as their root ends (``continuations.overlap``) are the episodes
that playing them after every root has ended gives, in fewer, fuller decode batches; slots
freed by ending episodes are refilled without changing any episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from factor_cli.envs import availability
from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.model import load_policy
from factor_cli.policy.prompting import PromptFormat
from factor_cli.rollout.continuations import ContinuationPlan, run_continuations
from factor_cli.rollout.runner import Episode, Job, RolloutRunner, Start

twx_missing = availability("twx")
pytestmark = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
FMT = PromptFormat(admissible=True)
# Roots of different lengths, so the first to end leave the last still running.
STARTS = [
    Start(f"coin/{i}", group=g, max_turns=2 + (g * 3 + j) % 4)
    for g, i in enumerate((3, 11))
    for j in range(3)
]
PLAN = ContinuationPlan(budget=2, per_checkpoint=2, horizon=3, seed=6)


class Counting:
    """The backend, recording the rows of every generate call."""

    def __init__(self, inner: HFGenerator) -> None:
        self.inner, self.batches = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, prompts: list[str], **kw: Any) -> Any:
        self.batches.append(len(prompts))
        return self.inner.generate(prompts, **kw)


class FakeShard:
    def __init__(self, rank: int, world: int, store: dict) -> None:
        self.rank, self.world, self.store = rank, world, store

    def all_gather(self, obj: Any) -> list[Any]:
        self.store[self.rank] = obj
        return [self.store.get(r, (([], []), (0, 0, 0))) for r in range(self.world)]


@pytest.fixture(scope="module")
def gen(tiny_model_dir: Path) -> HFGenerator:
    return HFGenerator(load_policy(str(tiny_model_dir)), max_new_tokens=12, max_context=1024)


def _same(xs: list[Episode], ys: list[Episode]) -> int:
    assert len(xs) == len(ys)
    turns = 0
    for x, y in zip(xs, ys):
        assert (x.start, x.actions, x.observations) == (y.start, y.actions, y.observations)
        for s, t in zip(x.turns, y.turns, strict=True):
            assert (s.prompt_ids, s.reply_ids) == (t.prompt_ids, t.reply_ids)
            assert float((torch.tensor(s.logprobs) - torch.tensor(t.logprobs)).abs().max()) < 1e-5
            turns += 1
    return turns


def _flat(xs: list[list[Episode]]) -> list[Episode]:
    return [ep for x in xs for ep in x]


def _jobs() -> list[Job]:
    return [Job(s, i, seed=5) for i, s in enumerate(STARTS)]


def test_overlapped_continuations_equal_continuations_played_after(gen: HFGenerator) -> None:
    counting = Counting(gen)
    with EnvPool("twx", 6 + 24) as pool:
        runner = RolloutRunner(pool, counting, FMT, max_turns=5)  # type: ignore[arg-type]
        roots = runner.run(STARTS, seed=5)
        after = run_continuations(runner, roots, "leave-one-out", 2, 2, horizon=3, seed=6)
        separate = len(counting.batches)
        steps = runner.env_steps
        counting.batches.clear()
        played, followed = runner.play(_jobs(), follow=PLAN.jobs)
        overlapped = PLAN.result(played, range(len(played)), followed, "leave-one-out")
    assert _same(roots, played) >= 12
    assert _same(after.episodes, overlapped.episodes) >= 16
    assert after.checkpoints == overlapped.checkpoints
    assert after.checkpoint_of == overlapped.checkpoint_of
    assert after.targets == overlapped.targets
    assert (after.interactions, after.replay_steps, after.failed) == (
        overlapped.interactions,
        overlapped.replay_steps,
        overlapped.failed,
    )
    assert runner.env_steps == 2 * steps
    _check_plan(roots)
    # The same replies in no more, fuller batches: while the longest root still ran (its
    # turns are the first T batches), continuations of the roots that had ended joined them.
    assert sum(counting.batches) == steps and len(counting.batches) <= separate
    longest, root_turns = max(len(r.turns) for r in roots), sum(len(r.turns) for r in roots)
    assert sum(counting.batches[:longest]) > root_turns


def test_refilled_slots_and_ranks_change_no_episode(gen: HFGenerator) -> None:
    """Two slots for 6 roots and their continuations, and two ranks, give the same episodes."""
    with EnvPool("twx", 30) as wide, EnvPool("twx", 2) as narrow:
        ref, ref_f = RolloutRunner(wide, gen, FMT, max_turns=5).play(_jobs(), follow=PLAN.jobs)
        got, got_f = RolloutRunner(narrow, gen, FMT, max_turns=5).play(_jobs(), follow=PLAN.jobs)
        assert _same(ref, got) > 0 and _same(_flat(ref_f), _flat(got_f)) > 0
        store: dict = {}
        for rank in (1, 0):  # rank 0 last: it then holds both blocks
            runner = RolloutRunner(narrow, gen, FMT, max_turns=5, shard=FakeShard(rank, 2, store))
            got, got_f = runner.play(_jobs(), follow=PLAN.jobs)
    assert _same(ref, got) > 0 and _same(_flat(ref_f), _flat(got_f)) > 0
    assert [len(f) for f in got_f] == [len(PLAN.jobs(i, r)) for i, r in enumerate(ref)]


def _check_plan(roots: list[Episode]) -> None:
    """A root's plan depends on that root alone (not on call order), every continuation
    samples from its own stream, and each starts at its checkpoint's recorded state."""
    turns = [PLAN.turns(i, r) for i, r in enumerate(roots)]
    assert [PLAN.turns(i, r) for i, r in reversed(list(enumerate(roots)))] == turns[::-1]
    jobs = [PLAN.jobs(i, r) for i, r in enumerate(roots)]
    keys = [j.key for js in jobs for j in js]
    assert len(set(keys)) == len(keys)
    for i, (r, js) in enumerate(zip(roots, jobs)):
        assert len(js) == PLAN.per_checkpoint * len(turns[i])
        for j in js:
            t = len(j.start.prefix_actions)
            assert j.start.prefix_observations == r.observations[: t + 1]
            assert j.start.max_turns == PLAN.horizon and j.temperature == PLAN.temperature
            assert not j.scored  # nothing scores a continuation's prompts: transient KV
