"""Atomic training checkpoints: written to a temporary folder, then renamed into place.

A checkpoint holds every DeepSpeed engine of the run (the policy's, and PPO's critic's under
``critic/``; model + optimizer), the value heads and replay buffer,
every RNG state, the step, and the ledger run id; ``latest`` names the newest complete one. A run
killed mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(
    run_dir: Path,
    step: int,
    engine: Any,
    extra: dict[str, Any],
    main: bool = True,
    barrier: Callable[[], None] = lambda: None,
    keep_every: int | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``run_dir/checkpoints`` and point ``latest`` at it.
    Older checkpoints are removed except the two newest and, with ``keep_every``, those of
    steps divisible by it.

    Data-parallel ranks all call this: each writes its engine shards into the one temporary
    folder, and the ``main`` rank alone adds the state file and renames it into place.
    """
    root = run_dir / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"  # one name every rank agrees on
    if main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a run killed mid-write
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier()
    try:
        engine.save(tmp)
        barrier()
        if main:
            torch.save({**extra, "step": step, "rng": rng_state()}, tmp / "state.pt")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
    finally:
        if main and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    if not main:
        return final
    pointer = root / f".{LATEST}.tmp-{uuid.uuid4().hex[:8]}"
    pointer.write_text(json.dumps({"step": step, "dir": final.name}))
    os.replace(pointer, root / LATEST)
    for old in sorted(root.glob("step-*"))[:-2]:  # keep the two newest
        if keep_every is None or int(old.name.removeprefix("step-")) % keep_every:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / LATEST
    if not pointer.exists():
        return None
    return run_dir / "checkpoints" / json.loads(pointer.read_text())["dir"]


def load_state(directory: Path) -> dict[str, Any]:
    return torch.load(directory / "state.pt", weights_only=False)
