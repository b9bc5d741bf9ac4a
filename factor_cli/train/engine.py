"""The training engine: DeepSpeed, on GPUs and on the CPU alike.

On a CPU DeepSpeed runs with ``DS_ACCELERATOR=cpu`` and the gloo backend. A single process is a
world of one whose process group lives on an in-process store (no port to race for); its first
use JIT-compiles a communication op, cached in the project-local ``.torch_extensions``.
Multi-process runs use ``torchrun --nproc_per_node N -m factor_cli train ...``, which sets the
torch.distributed variables and the group's rendezvous.

Several engines: a method with a learned critic (PPO) trains two models, each in an
:class:`Engine` of its own built by this same code (ZeRO stage, precision and offload from
``engine.*``; learning rate, gradient clip and checkpoint tag per engine); :class:`Engines` saves
and loads them together into one checkpoint folder.

Micro-batches: the caller marks which backward ends an optimizer step
(:meth:`Engine.backward` with ``boundary``), so a mini-batch may hold any number of micro-batches;
losses are normalised by the mini-batch's global count, so the split never changes the update.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .config import TrainConfig

EXTENSIONS_DIR = Path(__file__).resolve().parents[2] / ".torch_extensions"


def prepare_distributed_env(device: str) -> None:
    """Environment DeepSpeed needs, and a process group. Under a launcher (torchrun) its
    variables and group are kept; a standalone process becomes a world of one whose group
    lives on an in-process store. No port is involved: picking a free port and binding it later
    raced with every other process on the machine (two runners of a study, each with its cells,
    lost cells to EADDRINUSE), and a parent's inherited MASTER_PORT would still be bound."""
    if not device.startswith("cuda"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    launched = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ
    if launched or not torch.distributed.is_available():
        return
    if torch.distributed.is_initialized():
        return  # this process already runs its own world of one
    # DeepSpeed looks for these before it sees the group exists (without them it tries mpi4py);
    # the group below never reads MASTER_ADDR/PORT, so an inherited port is harmless.
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    torch.distributed.init_process_group(
        backend="nccl" if device.startswith("cuda") else "gloo",
        store=torch.distributed.HashStore(),
        rank=0,
        world_size=1,
    )


def world() -> tuple[int, int]:
    """(rank, world size) of this process."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def ds_config(cfg: TrainConfig, grad_clip: float | None = None) -> dict[str, Any]:
    """The DeepSpeed config of ``cfg.engine``; ``grad_clip`` overrides ``optim.grad_clip``."""
    zero: dict[str, Any] = {"stage": cfg.engine.zero_stage}
    if cfg.engine.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    conf: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.optim.grad_clip if grad_clip is None else grad_clip,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if cfg.engine.precision == "bf16":
        conf["bf16"] = {"enabled": True}
    elif cfg.engine.precision == "fp16":
        conf["fp16"] = {"enabled": True}
    if cfg.engine.offload_optimizer:
        conf["optimizer"] = {"type": "Adam", "params": {"lr": cfg.optim.lr}}
    return conf


class Engine:
    """A DeepSpeed engine around a trained model (the policy, or PPO's critic) with explicit
    optimizer-step boundaries.

    ``lr`` and ``grad_clip`` default to ``optim.lr`` / ``optim.grad_clip`` (the policy's);
    ``tag`` names its folder inside a checkpoint, distinct for each engine of one run.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainConfig,
        lr: float | None = None,
        grad_clip: float | None = None,
        tag: str = "engine",
    ) -> None:
        prepare_distributed_env(cfg.model.device)
        import deepspeed
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel("WARNING")
        conf = ds_config(cfg, grad_clip)
        optimizer = None
        if "optimizer" not in conf:
            optimizer = torch.optim.Adam(model.parameters(), lr=lr or cfg.optim.lr)
        else:
            conf["optimizer"]["params"]["lr"] = lr or cfg.optim.lr
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=conf, dist_init_required=True
        )
        self.rank, self.world_size = world()
        self.zero_stage = cfg.engine.zero_stage
        self.tag = tag

    @property
    def module(self) -> torch.nn.Module:
        """The bare model: for reading weights and for forward passes outside the update."""
        return self.engine.module

    @property
    def wrapped_module(self) -> torch.nn.Module:
        """The model as the update must call it: through DeepSpeed's forward, whose bookkeeping
        tells ZeRO-3 that a new micro-batch begins (else each backward overwrites the gradient
        accumulated so far instead of adding to it; measured: ZeRO-3 losses drifted from ZeRO-0
        whenever a mini-batch held more than one micro-batch)."""
        return self.engine

    def backward(self, loss: torch.Tensor, boundary: bool) -> None:
        """Accumulate ``loss``'s gradient; ``boundary`` marks the last micro-batch of a step."""
        self.engine.set_gradient_accumulation_boundary(boundary)
        # DeepSpeed averages gradients over ranks; the loss is already globally normalised.
        self.engine.backward(loss * self.world_size)

    def step(self) -> float:
        """Optimizer step (clip, Adam); returns the pre-clip gradient norm when known."""
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @contextmanager
    def full_parameters(self) -> Iterator[torch.nn.Module]:
        """The module with every parameter whole on every rank, for reading the weights (saving
        a model, refreshing vLLM). ZeRO-3 partitions parameters across ranks, so they are
        gathered for the duration; the other stages hold them whole already."""
        if self.zero_stage != 3:
            yield self.module
            return
        import deepspeed

        params = list(self.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            yield self.module

    def save_pretrained(self, directory: Path, tokenizer: Any) -> None:
        """A Hugging Face model directory of the current weights (rank 0 writes it)."""
        with self.full_parameters() as module:
            if self.rank == 0:
                state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
                module.save_pretrained(directory, state_dict=state)
                tokenizer.save_pretrained(directory)

    def save(self, directory: Path) -> None:
        """Model and optimizer state (every rank its shards) under ``directory / tag``."""
        self.engine.save_checkpoint(str(directory), tag=self.tag, save_latest=False)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag=self.tag)
        if path is None:
            raise FileNotFoundError(f"{directory}: no DeepSpeed engine checkpoint {self.tag!r}")


class Engines:
    """The engines of one run (the policy's, and the critic's when the method has one), saved
    into and loaded from one checkpoint folder, each under its own tag."""

    def __init__(self, *engines: Engine) -> None:
        tags = [e.tag for e in engines]
        if len(set(tags)) != len(tags):
            raise ValueError(f"engines of one checkpoint need distinct tags, got {tags}")
        self.engines = engines

    def save(self, directory: Path) -> None:
        for e in self.engines:
            e.save(directory)

    def load(self, directory: Path) -> None:
        for e in self.engines:
            e.load(directory)
