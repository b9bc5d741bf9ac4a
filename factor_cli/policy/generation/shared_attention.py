"""Attention over a prefix shared by every row of a batch, read once (cascade attention).

The rows of a batch of prompts often start with the same tokens: system + task for every episode
of one game, the root's history for a checkpoint's continuations. Decode attention on a CPU is
bound by memory reads (each step reads every row's keys and values), and gathering each row's
stored prefix into a batch cache is a copy of them, so the ``hf`` backend keeps such a prefix
once, K_P, V_P [1, H_kv, P, D], and each row only its own columns K_b, V_b after
it. For the queries q_b of row b the attention over the union splits exactly:

    o_b = (e^{l_P} o_P + e^{l_b} o_b') / (e^{l_P} + e^{l_b}),

where (o_P, l_P) = (softmax(q_b K_P^T s) V_P, logsumexp(q_b K_P^T s)) is attention over the
shared prefix, computed for all rows as one query block against K_P (K_P read once, not once
per row), and (o_b', l_b) the same over the row's own columns under its mask (padding, causal
order of the new tokens). Every shared token precedes every query, so the prefix needs no mask.
Outputs equal attention over the concatenated keys up to float rounding (tested within 1e-5).

The rows' own columns are left-padded to one width, and in a batch of prompts of different lengths
much of it is padding, which the kernel reads like any column. The backend orders a decode batch's
rows by prompt length, so rows with similar padding are neighbours, and a decode step's own-column
attention runs per band of neighbouring rows over the columns from the band's first attended one
(:func:`row_bands`): the padding before it, masked for every query of the band, is not read, and the
result is the same. Prefill forwards (many queries per row) showed no gain from it and attend in one
call. What both save: ``docs/benchmarks.md`` (Generation).

The model's attention modules call :func:`shared_prefix_attention` while :func:`use_shared_prefix`
is active (it switches ``config._attn_implementation`` for one prefill or decode); masks are
built as for SDPA. CPU only: it calls the CPU flash kernel, which returns the logsumexp.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

BAND_CALL_CELLS = 512
"""What one more kernel call costs, in attention cells (query x key column pairs of one row):
a band of rows is closed once the padding cells it would compute exceed this (:func:`row_bands`;
the CPU flash kernel costs ~20 us per call and ~45 ns per row-column at 4 heads of 32)."""

NAME = "factor_shared_prefix"
"""The attention implementation's registered name (``config._attn_implementation``)."""


@dataclass
class _Active:
    """The prefix of the current :func:`use_shared_prefix` block, and how many attention calls
    read it (none would mean the model did not dispatch to :func:`shared_prefix_attention`)."""

    prefix: torch.Tensor
    calls: int = 0
    mask_of: torch.Tensor | None = None
    """The bool mask :attr:`additive` and :attr:`bands` were made from: every layer of one
    forward gets the same mask object, so they are made once per forward, not per layer."""
    additive: torch.Tensor | None = None
    bands: list[tuple[int, int, int]] | None = None


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar(
    "factor_shared_prefix", default=None
)


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over the union of two disjoint key sets from each one's output [B, H, Q, D] and
    logsumexp [B, H, Q]: o = (e^{l_a} o_a + e^{l_b} o_b) / (e^{l_a} + e^{l_b})."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * (lse_a - lse).exp()[..., None] + out_b * (lse_b - lse).exp()[..., None]


def row_bands(
    allowed: torch.Tensor, call_cells: int = BAND_CALL_CELLS
) -> list[tuple[int, int, int]]:
    """Contiguous bands (r0, r1, c) of the rows of a bool mask ``allowed`` [B, 1, Q, S] (True =
    attend) that cover every row in order, where no query of rows [r0, r1) attends a column
    before c, so attention over columns [c, S) is theirs exactly.

    Greedy over the rows: a band's c is the least first attended column of its rows, and the
    band is closed before the row that would make the cells it computes in vain (columns
    [c, first attended) of each of its rows, times Q) exceed ``call_cells``, the price of one
    more kernel call. Rows ordered by length make each band's padding small."""
    b, _, q, s = allowed.shape
    attended = allowed.any(dim=2).squeeze(1)  # [B, S]: columns some query of the row reads
    # A row that reads nothing keeps its last column, so no band is ever empty of columns.
    first = torch.where(attended.any(-1), attended.int().argmax(-1), s - 1).tolist()
    bands: list[tuple[int, int, int]] = []
    r0, c, waste = 0, first[0], 0
    for r in range(1, b):
        f = first[r]
        # Cells the band would compute in vain with row r in it: its rows before c' = min(c, f)
        # and row r's own, before f.
        extra = (r - r0) * max(c - f, 0) * q + max(f - c, 0) * q
        if waste + extra > call_cells:
            bands.append((r0, r, c))
            r0, c, waste = r, f, 0
        else:
            waste, c = waste + extra, min(c, f)
    bands.append((r0, b, c))
    return bands


def _banded_flash(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    bands: list[tuple[int, int, int]] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_flash` per band of rows over the band's columns [c, S), concatenated; one call
    when there is a single band from column 0 (or no bands)."""
    if not bands or (len(bands) == 1 and bands[0][2] == 0):
        return _flash(query, key, value, mask, scale)
    parts = [
        _flash(
            query[r0:r1],
            key[r0:r1, :, c:],
            value[r0:r1, :, c:],
            None if mask is None else mask[r0:r1, ..., c:],
            scale,
        )
        for r0, r1, c in bands
    ]
    return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts])


def _flash(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q k^T s + mask) v, logsumexp(q k^T s + mask)) through the CPU flash kernel
    (additive float ``mask``, or None)."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return op(query, key, value, attn_mask=mask, scale=scale)


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face attention function: query [B, H, Q, D] over the shared prefix of this layer
    (:func:`use_shared_prefix`) and the rows' own key, value [B, H_kv, S, D] under
    ``attention_mask`` (bool [B, 1, Q, S], True = attend, or None); returns [B, Q, H, D]. Plain
    SDPA outside :func:`use_shared_prefix`."""
    active = _ACTIVE.get()
    if active is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    active.calls += 1
    k_p, v_p = active.prefix[module.layer_idx]  # [1, H_kv, P, D] each
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value, k_p, v_p = (repeat_kv(t, groups) for t in (key, value, k_p, v_p))
    b, h, q, d = query.shape
    scale = float(scaling) if scaling is not None else d**-0.5
    if attention_mask is None and q > 1:  # the new tokens see each other causally
        s = key.shape[-2]
        attention_mask = torch.ones(q, s, dtype=torch.bool, device=query.device).tril(s - q)
        attention_mask = attention_mask[None, None]
    if attention_mask is not None and active.mask_of is not attention_mask:
        add = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        add.masked_fill_(~attention_mask, float("-inf"))
        banded = q == 1 and attention_mask.shape[0] == b and attention_mask.shape[1] == 1
        active.mask_of, active.additive = attention_mask, add
        active.bands = row_bands(attention_mask) if banded else None
    add = None if attention_mask is None else active.additive
    bands = None if attention_mask is None else active.bands
    out_r, lse_r = _banded_flash(query, key, value, add, scale, bands)
    # Every row's queries form one block against the prefix: K_P, V_P are read once.
    block = query.transpose(0, 1).reshape(1, h, b * q, d)
    out_p, lse_p = _flash(block, k_p, v_p, None, scale)
    out_p = out_p.reshape(h, b, q, d).transpose(0, 1)
    lse_p = lse_p.reshape(h, b, q).transpose(0, 1)
    out = merge_attention(out_r, lse_r, out_p, lse_p.to(lse_r.dtype))
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, shared_prefix_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


@contextmanager
def use_shared_prefix(model: torch.nn.Module, prefix: torch.Tensor) -> Iterator[None]:
    """Within the block, ``model``'s attention layers attend to ``prefix`` [N_layers, 2, 1, H_kv,
    P, D] (layer l's keys and values of P tokens at positions 0..P-1) before each row's own
    cache; position ids of the rows' tokens must count from P.

    Raises:
        RuntimeError: the block ran without any attention layer reading the prefix (a model
            whose layers do not dispatch through the config switched here): its outputs lack
            the prefix and must not be used.
    """
    config = model.config
    get_text = getattr(config, "get_text_config", None)
    configs = list({id(c): c for c in (config, get_text() if get_text else config)}.values())
    before = [c._attn_implementation for c in configs]
    active = _Active(prefix)
    token = _ACTIVE.set(active)
    for c in configs:  # this config only, not its other sub-configs
        c._attn_implementation = {"": NAME}
    try:
        yield
    finally:
        for c, b in zip(configs, before):
            c._attn_implementation = {"": b}
        _ACTIVE.reset(token)
    if active.calls == 0:
        raise RuntimeError(
            f"{type(model).__name__}: no attention layer read the shared prefix; decode this "
            "model with shared_prefix_min=None"
        )
