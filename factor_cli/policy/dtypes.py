"""The weight dtypes the toolkit loads, trains and hands to vLLM: the one list of their names.

Importing this module does not import torch (config validation uses :data:`DTYPE_NAMES` at
load time, before any model exists); the torch objects are looked up on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")
"""Weight dtypes by torch's own names (``torch.<name>``), the config's ``model.dtype`` values."""

AUTO = "auto"
"""Loader-only choice: keep the dtype stored in the checkpoint's config."""


def _unsupported(what: object, allowed: tuple[str, ...]) -> ValueError:
    return ValueError(f"dtype {what!r} is not supported; use one of {', '.join(allowed)}")


def torch_dtype(name: str) -> torch.dtype:
    """``torch.<name>`` for a name in :data:`DTYPE_NAMES`; ValueError listing them otherwise."""
    if name not in DTYPE_NAMES:
        raise _unsupported(name, DTYPE_NAMES)
    import torch

    return getattr(torch, name)


def load_dtype(name: str) -> torch.dtype | str:
    """What a Hugging Face loader takes for ``name``: a torch dtype, or :data:`AUTO` as is."""
    if name == AUTO:
        return AUTO
    if name not in DTYPE_NAMES:
        raise _unsupported(name, (*DTYPE_NAMES, AUTO))
    return torch_dtype(name)


def dtype_name(dtype: torch.dtype) -> str:
    """Inverse of :func:`torch_dtype`: the name of a supported torch dtype."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise _unsupported(dtype, DTYPE_NAMES)
    return name
