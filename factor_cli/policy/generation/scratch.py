"""Reusable memory for the ``hf`` backend's short-lived KV buffers on a CPU.

Each decode batch gathers its rows' stored prompt KV into one buffer [N_layers, 2, B, H_kv, C,
D] (hundreds of MB for a rollout's decode batch), and each prefill into another. A CPU
allocation that large is a fresh ``mmap`` (glibc serves blocks of more than 32 MB no other way),
so every page is faulted in and zeroed on first touch and given back when freed: a new buffer
costs several times a refill of a reused one (``docs/benchmarks.md``, Generation).
:class:`Scratch` keeps one block per named use and hands out views of it, so a rollout pays the
page faults once instead of once per turn. CUDA's caching allocator already reuses blocks, so
the backend uses a scratch only on a CPU.

A view handed out by :meth:`Scratch.take` is valid until the next ``take`` of the same name:
callers that keep data past that point copy it (the prefix cache stores its own tensors).
"""

from __future__ import annotations

import math

import torch


class Scratch:
    """One growing block of memory per name (e.g. ``"rows"``, ``"prefix"``)."""

    def __init__(self) -> None:
        self._blocks: dict[str, torch.Tensor] = {}

    def take(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """An uninitialised tensor of ``shape``: a view of block ``name``, which is replaced by a
        larger one when it is too small (or of another dtype or device)."""
        n = math.prod(shape)
        block = self._blocks.get(name)
        if block is None or block.numel() < n or block.dtype != dtype or block.device != device:
            self._blocks.pop(name, None)  # freed before the larger block is allocated
            block = self._blocks[name] = torch.empty(n, dtype=dtype, device=device)
        return block[:n].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held by every block."""
        return sum(b.numel() * b.element_size() for b in self._blocks.values())

    def clear(self) -> None:
        """Give every block back."""
        self._blocks.clear()
