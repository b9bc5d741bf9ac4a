"""Named random streams of a training run: one seed per (run seed, step, stream).

Each stochastic phase of a step draws from its own stream, so one phase's draws never shift
another's: the credit shuffles of TokenShuffled / CreditShuffled / td-shuffled consume their own
generator, and the PPO mini-batch order is the same for every method at a given seed (it would
otherwise depend on how many numbers the method's credit drew, confounding ablations). Seeds
depend only on (seed, step), so a run resumed at step k replays the uninterrupted run's draws.

The rollout, continuation, value and credit streams keep the seeds the trainer has always used
(``seed * multiplier + step``); ``minibatch`` is the newest.
"""

from __future__ import annotations

import torch

from factor_cli.registry import Registry

STREAMS: Registry[int] = Registry("random stream")
"""Stream name -> its seed multiplier. Streams are separate generators, so none can shift
another's draws even where two seeds coincide (seed 0 seeds every stream with the step)."""
STREAMS.add("rollout", 10_007)
STREAMS.add("continuations", 20_011)
STREAMS.add("value", 30_011)
STREAMS.add("credit", 40_009)
STREAMS.add("minibatch", 50_021)


def stream_seed(seed: int, step: int, stream: str) -> int:
    """The seed of ``stream`` at training step ``step`` (1-based) of a run seeded ``seed``."""
    return seed * STREAMS.get(stream) + step


def stream_generator(seed: int, step: int, stream: str) -> torch.Generator:
    """A fresh CPU generator seeded with :func:`stream_seed`."""
    return torch.Generator().manual_seed(stream_seed(seed, step, stream))
