"""Data-parallel ranks: which process is rank 0, and how Python objects travel between ranks.

Under ``torchrun --nproc_per_node N -m factor_cli train`` every rank runs the whole job.
Rollouts, continuations and evaluation episodes are sharded: each rank plays one block of them
(:class:`factor_cli.rollout.runner.RolloutRunner` with ``shard``) and all ranks all-gather the
episodes, so every rank then holds the same batch, fits the same value head and computes the
same credit; the PPO update splits each mini-batch across ranks and DeepSpeed sums their
gradients. Rank 0 alone writes: the ledger run, ``metrics.jsonl``, checkpoint metadata, the final
model and the eval items; the other ranks learn the run id from it. Objects travel over a gloo
group, whatever backend the engine trains with (NCCL on GPUs).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch

from .engine import prepare_distributed_env, world

T = TypeVar("T")
WAIT = timedelta(hours=12)


def init_distributed(device: str) -> None:
    """Join torchrun's process group, or make this process a world of one."""
    prepare_distributed_env(device)
    import deepspeed

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        deepspeed.init_distributed(verbose=False)


class Ranks:
    """This process among the data-parallel ranks (a :class:`~factor_cli.rollout.runner.Shard`)."""

    def __init__(self) -> None:
        self.rank, self.world = world()
        self._group = None
        if self.world > 1:  # a collective: every rank creates its Ranks at the same point
            # Long timeout: the other ranks wait here while rank 0 alone runs the SFT warm start.
            self._group = torch.distributed.new_group(backend="gloo", timeout=WAIT)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier(group=self._group)

    def first(self, fn: Callable[[], T]) -> T:
        """``fn()`` on rank 0 (e.g. building a model directory), its result on every rank."""
        return self.broadcast(fn() if self.main else None)  # type: ignore[arg-type]
