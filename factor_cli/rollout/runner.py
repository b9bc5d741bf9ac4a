"""Batched multi-turn rollouts: every live environment advances together, one generate per turn.

At most ``len(pool)`` episodes are live; a slot freed by an ending episode takes the next waiting
one, and an ending episode may add follow-up episodes to the queue (a root's continuations), so
continuations play in the same batches as the roots still running. Replies are sampled from
per-episode streams (:func:`reply_seed`), so none depends on when an episode was admitted.

An :class:`Episode` records, per turn t: the prompt (context x_t) token ids, the reply token ids,
their behaviour log-probs, the executable-action mask, the action, the feedback Phi_t, reward,
done and validity, plus every observation, so any intermediate state can be restored (reset +
replay of ``actions[:t]`` checked against ``observations[:t + 1]``).

Episodes may start from a restored state (continuations): their prefix actions and observations
come from the root episode and also feed the prompt's history window. An episode cut short
records why in :attr:`Episode.error`, typed by :class:`FailureKind`.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from factor_cli.envs.base import EnvError, Outcome
from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.base import Generation, GenerationBackend
from factor_cli.policy.prompting import (
    PromptFormat,
    TurnView,
    action_token_mask,
    extract_action,
    render,
    shown_admissible,
    token_char_spans,
)


@dataclass
class Turn:
    prompt_ids: list[int]
    reply_ids: list[int]
    logprobs: list[float]
    action_mask: list[bool]
    reply_text: str
    action: str
    observation: str
    """The observation before the action (current observation of x_t)."""
    feedback: str
    """Phi_t: the environment's reply to the action."""
    reward: float
    done: bool
    valid: bool
    tagged: bool
    prompt_truncated: bool = False
    admissible: list[str] = field(default_factory=list)
    """The admissible actions the prompt showed (the teacher's prompt shows the same)."""
    allowed_ids: list[list[int]] | None = None
    """Under valid-action decoding, the token ids allowed at each reply position (the
    constrained distribution renormalises over them); None when decoding was free."""


@dataclass
class Start:
    """Where an episode begins: an instance, optionally after a recorded prefix of actions."""

    instance_id: str
    group: int = 0
    prefix_actions: list[str] = field(default_factory=list)
    prefix_observations: list[str] | None = None
    """Recorded observations o_0..o_t of the prefix, checked during the replay."""
    max_turns: int | None = None


class FailureKind(Enum):
    """Why an episode was cut short."""

    START = "start failed"
    """Reset or restore (the replay of a recorded prefix) failed: no turn was played, so a
    continuation from it yields no value target."""
    ENGINE = "engine failure"
    """The environment's engine failed during a step: the episode counts as failed."""


@dataclass(frozen=True)
class EpisodeError:
    """A failure of one episode: its kind, and the environment's message."""

    kind: FailureKind
    message: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


@dataclass
class Episode:
    start: Start
    task: str = ""
    observations: list[str] = field(default_factory=list)
    """o_0..o_n including the prefix (o_k = reply to action k - 1)."""
    turns: list[Turn] = field(default_factory=list)
    outcome: Outcome | None = None
    error: EpisodeError | None = None
    """Why the episode was cut short (engine crash, failed restore); None if it ran normally."""

    @property
    def actions(self) -> list[str]:
        return [*self.start.prefix_actions, *(t.action for t in self.turns)]

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def start_failed(self) -> bool:
        """The episode never started (:attr:`FailureKind.START`)."""
        return self.error is not None and self.error.kind is FailureKind.START

    def history(self) -> list[tuple[str, str]]:
        """(action, observation after it) pairs so far, prefix included."""
        acts = self.actions
        return [(a, self.observations[k + 1]) for k, a in enumerate(acts)]


def reply_seed(seed: int, episode: int, turn: int) -> int:
    """The sampling seed of one reply: a hash of (run seed, episode index, turn)."""
    digest = hashlib.blake2b(f"{seed}:{episode}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Shard(Protocol):
    """This process's place among data-parallel ranks, and a way to share Python objects."""

    rank: int
    world: int

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order (a collective: every rank must call it)."""
        ...


@dataclass(frozen=True)
class Job:
    """One episode to play: where it starts, and the stream its replies are sampled from."""

    start: Start
    key: int
    """The episode's index in its sampling stream: turn t samples with reply_seed(seed, key, t)."""
    seed: int = 0
    temperature: float = 1.0
    greedy: bool = False
    scored: bool = True
    """Later passes (the teacher, the value head) read its prompts; False (a continuation) lets
    the backend's prefix cache evict them first."""


FollowUp = Callable[[int, Episode], Sequence[Job]]
"""Called when the episode of job i has ended; the jobs it returns join the same loop."""


@dataclass
class _Live:
    job: Job
    episode: Episode
    index: int
    """The index of the job given to :meth:`play` that this is, or whose follow-up it is."""
    followup: bool = False


class RolloutRunner:
    """Runs episodes on a pool of environments with one batched generate per turn."""

    def __init__(
        self,
        pool: EnvPool,
        generator: GenerationBackend,
        fmt: PromptFormat,
        max_turns: int,
        shard: Shard | None = None,
        constrain: bool = False,
    ) -> None:
        """``constrain``: decode each reply as one of the current admissible actions
        (valid-action decoding, :meth:`GenerationBackend.generate`'s ``allowed``)."""
        self.pool, self.backend, self.fmt, self.max_turns = pool, generator, fmt, max_turns
        self.shard = shard
        self.constrain = constrain
        self.tokenizer = generator.tokenizer
        self.env_steps = 0
        self.replay_steps = 0
        self.generated_tokens = 0
        self._action_tokens: dict[str, int] = {}

    def run(
        self,
        starts: Sequence[Start],
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int = 0,
        on_turn: Callable[[int, int], None] | None = None,
    ) -> list[Episode]:
        """Play every start to the end (:meth:`play`); start i samples turn t from its own
        stream, seeded by (seed, i, t) (:func:`reply_seed`)."""
        jobs = [Job(s, i, seed, temperature, greedy) for i, s in enumerate(starts)]
        return self.play(jobs, on_turn=on_turn)[0]

    def play(
        self,
        jobs: Sequence[Job],
        follow: FollowUp | None = None,
        on_turn: Callable[[int, int], None] | None = None,
    ) -> tuple[list[Episode], list[list[Episode]]]:
        """Play every job to the end, at most ``len(pool)`` episodes at once: a slot freed by an
        ending episode takes the next waiting one, and every turn of the live episodes that
        sample alike is one batched generate.

        Returns (the episode of each job, in order; the follow-up episodes of each job).
        ``follow(i, episode)``, called when the episode of job i ends, returns jobs that join
        the loop (FACTOR's continuations of a root, played while the other roots still run);
        follow-ups have none of their own. An episode's replies depend only on its job
        (:func:`reply_seed`), not on the pool width, the other episodes or when it was
        admitted. With a ``shard`` (data-parallel ranks) each rank plays one contiguous block
        of the jobs and every rank gets all the episodes back, in order, as one process
        playing them all would produce them. ``on_turn(finished, total)`` is called after
        every turn for progress display (``total`` grows as follow-ups join).
        """
        if self.shard is not None and self.shard.world > 1:
            return self._play_sharded(jobs, follow, on_turn)
        return self._play_local(jobs, follow, on_turn)

    def _play_local(
        self,
        jobs: Sequence[Job],
        follow: FollowUp | None,
        on_turn: Callable[[int, int], None] | None,
    ) -> tuple[list[Episode], list[list[Episode]]]:
        episodes = [Episode(start=j.start) for j in jobs]
        followed: list[list[Episode]] = [[] for _ in jobs]
        waiting = deque(_Live(j, ep, i) for i, (j, ep) in enumerate(zip(jobs, episodes)))
        live: dict[int, _Live] = {}
        free = list(range(len(self.pool)))  # a heap: the lowest free slot is taken first
        counts = [0, len(jobs)]  # finished, total

        def end(slot: int) -> None:
            item = live.pop(slot)
            heapq.heappush(free, slot)
            counts[0] += 1
            if follow is not None and not item.followup:
                for job in follow(item.index, item.episode):
                    ep = Episode(start=job.start)
                    followed[item.index].append(ep)
                    waiting.append(_Live(job, ep, item.index, followup=True))
                    counts[1] += 1

        while waiting or live:
            while waiting and free:
                slot = heapq.heappop(free)
                item = waiting.popleft()
                live[slot] = item
                self._begin(slot, item.episode)
                if item.episode.done:  # the start failed: no turn to play
                    end(slot)
            if live:
                self._turn(live)
                for slot in [s for s, item in live.items() if item.episode.done]:
                    end(slot)
            if on_turn is not None:
                on_turn(counts[0], counts[1])
        return episodes, followed

    def _play_sharded(
        self,
        jobs: Sequence[Job],
        follow: FollowUp | None,
        on_turn: Callable[[int, int], None] | None,
    ) -> tuple[list[Episode], list[list[Episode]]]:
        shard = self.shard
        assert shard is not None
        chunk = -(-len(jobs) // shard.world)
        lo, hi = min(len(jobs), shard.rank * chunk), min(len(jobs), (shard.rank + 1) * chunk)
        counters = (self.env_steps, self.replay_steps, self.generated_tokens)
        local = None if follow is None else (lambda i, ep: follow(lo + i, ep))
        mine = self._play_local(jobs[lo:hi], local, on_turn)
        delta = (
            self.env_steps - counters[0],
            self.replay_steps - counters[1],
            self.generated_tokens - counters[2],
        )
        parts = shard.all_gather((mine, delta))
        # Every rank counts the whole job's steps, as one process would have.
        self.env_steps = counters[0] + sum(d[0] for _, d in parts)
        self.replay_steps = counters[1] + sum(d[1] for _, d in parts)
        self.generated_tokens = counters[2] + sum(d[2] for _, d in parts)
        return (
            [ep for (eps, _), _ in parts for ep in eps],
            [f for (_, fs), _ in parts for f in fs],
        )

    def _begin(self, slot: int, ep: Episode) -> None:
        s = ep.start
        try:
            if s.prefix_actions:
                self.pool.restore(slot, s.instance_id, s.prefix_actions, s.prefix_observations)
                self.replay_steps += len(s.prefix_actions)
                env = self.pool[slot]
                ep.observations = list(env.observations)
            else:
                ep.observations = [self.pool.reset(slot, s.instance_id)]
            ep.task = self.pool[slot].task_description()
        except EnvError as exc:
            ep.error = EpisodeError(FailureKind.START, str(exc))
            ep.outcome = Outcome(0.0, False, 0.0, 0, 0)

    def _turn(self, live: dict[int, _Live]) -> None:
        """One turn of every live episode: one generate per way of sampling (in practice one)."""
        groups: dict[tuple[float, bool], list[int]] = {}
        for slot in sorted(live):
            job = live[slot].job
            groups.setdefault((job.temperature, job.greedy), []).append(slot)
        for (temperature, greedy), slots in groups.items():
            eps = [live[s].episode for s in slots]
            admissible = [self._admissible(s) for s in slots]
            views = [
                TurnView(ep.task, ep.history(), ep.observations[-1], shown, ep.observations[0])
                for ep, (shown, _) in zip(eps, admissible)
            ]
            prompts = [render(self.fmt, v, self.tokenizer) for v in views]
            seeds = [
                reply_seed(live[s].job.seed, live[s].job.key, len(live[s].episode.turns))
                for s in slots
            ]
            allowed = [every for _, every in admissible] if self.constrain else None
            keep = [live[s].job.scored for s in slots]
            gens = self.backend.generate(
                prompts,
                temperature=temperature,
                greedy=greedy,
                seeds=seeds,
                allowed=allowed,
                keep=keep,
            )
            for slot, ep, gen, (shown, _) in zip(slots, eps, gens, admissible):
                self._advance(slot, ep, gen, list(shown))

    def _admissible(self, slot: int) -> tuple[tuple[str, ...], list[str] | None]:
        """(the admissible actions the prompt shows, all of them when decoding is constrained
        to them, else None); the environment is asked only when either needs them."""
        if not (self.fmt.admissible or self.constrain):
            return (), None
        every = self.pool[slot].valid_actions()
        shown = shown_admissible(self.fmt, every, self._count_tokens)
        return shown, (every or None) if self.constrain else None

    def _count_tokens(self, text: str) -> int:
        # Every turn of every episode lists mostly the same actions: encode each once.
        n = self._action_tokens.get(text)
        if n is None:
            n = len(self.tokenizer.encode(text, add_special_tokens=False))
            self._action_tokens[text] = n
        return n

    def _advance(self, slot: int, ep: Episode, g: Generation, admissible: list[str]) -> None:
        # Offsets and the action both come from the decode that keeps special tokens, so the
        # character span and the token spans refer to the same string.
        text, spans = token_char_spans(self.tokenizer, g.token_ids)
        span = extract_action(text)
        mask = action_token_mask(spans, span)
        self.generated_tokens += len(g.token_ids)
        try:
            step = self.pool.step(slot, span.text)
        except EnvError as exc:
            ep.error = EpisodeError(FailureKind.ENGINE, str(exc))
            ep.outcome = Outcome(0.0, False, 0.0, 0, len(ep.turns))  # a lost episode counts failed
            return
        self.env_steps += 1
        ep.observations.append(step.observation)
        ep.turns.append(
            Turn(
                prompt_ids=list(g.prompt_ids),
                reply_ids=list(g.token_ids),
                logprobs=list(g.logprobs),
                action_mask=mask,
                reply_text=g.text,
                action=span.text,
                observation=ep.observations[-2],
                feedback=step.observation,
                reward=step.reward,
                done=step.done,
                valid=step.valid,
                tagged=span.tagged,
                prompt_truncated=g.prompt_truncated,
                admissible=admissible,
                allowed_ids=g.allowed_ids,
            )
        )
        limit = ep.start.max_turns or self.max_turns
        if step.done or len(ep.turns) >= limit:
            ep.outcome = self.pool[slot].outcome()
