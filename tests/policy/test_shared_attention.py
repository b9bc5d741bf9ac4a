"""Decode attention over a prefix shared by every row (``shared_attention``) against plain
attention over the concatenated keys: random shapes, padding, several new tokens, grouped
key-value heads; the prefix cache's offset gather; the hf backend's replies with it on and off."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig

from factor_cli.policy.generation import shared_attention
from factor_cli.policy.generation.prefix_cache import PrefixCache
from factor_cli.policy.generation.shared_attention import (
    NAME,
    merge_attention,
    row_bands,
    shared_prefix_attention,
    use_shared_prefix,
)

TOL = 1e-5


def _oracle(q, k_p, v_p, k, v, allowed, scale):
    """softmax over [prefix; row] keys: the prefix visible to every query, the row's columns
    where ``allowed`` [B, 1, Q, S] says so (loops, no kernel)."""
    b, h, _, _ = q.shape
    groups = h // k.shape[1]
    out = torch.empty_like(q)
    for i in range(b):
        for j in range(h):
            kk = torch.cat([k_p[0, j // groups], k[i, j // groups]])
            vv = torch.cat([v_p[0, j // groups], v[i, j // groups]])
            s = q[i, j] @ kk.T * scale  # [Q, P + S]
            seen = torch.cat(
                [torch.ones(s.shape[0], k_p.shape[2], dtype=torch.bool), allowed[i, 0]], 1
            )
            out[i, j] = torch.softmax(s.masked_fill(~seen, float("-inf")), -1) @ vv
    return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    b=st.integers(1, 5),
    kv_heads=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 2]),
    q_len=st.integers(1, 4),
    p=st.integers(1, 9),
    extra=st.integers(0, 6),
    masked=st.booleans(),
)
def test_attention_over_a_shared_prefix_equals_attention_over_the_concatenation(
    seed: int, b: int, kv_heads: int, groups: int, q_len: int, p: int, extra: int, masked: bool
) -> None:
    g = torch.Generator().manual_seed(seed)
    d, h = 8, kv_heads * groups
    s = q_len + extra  # the rows' own columns: older ones, then the Q new tokens
    q = torch.randn(b, h, q_len, d, generator=g)
    k, v = torch.randn(2, b, kv_heads, s, d, generator=g)
    prefix = torch.randn(1, 2, 1, kv_heads, p, d, generator=g)  # one layer
    causal = torch.ones(q_len, s, dtype=torch.bool).tril(s - q_len)
    allowed = causal[None, None].repeat(b, 1, 1, 1)
    for i in range(b):  # left padding: each row may miss some of its oldest columns
        allowed[i, 0, :, : int(torch.randint(0, extra + 1, (1,), generator=g))] = False
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=groups, is_causal=True)
    model = SimpleNamespace(config=LlamaConfig(attn_implementation="sdpa"))
    with use_shared_prefix(model, prefix):
        assert model.config._attn_implementation == NAME
        mask = allowed if masked or q_len == 1 else None
        if mask is None:  # no mask given: the new tokens see all older ones, each other causally
            allowed = causal[None, None].repeat(b, 1, 1, 1)
        got, _ = shared_prefix_attention(module, q, k, v, mask, scaling=d**-0.5)
    assert model.config._attn_implementation == "sdpa"
    want = _oracle(q, prefix[0, 0], prefix[0, 1], k, v, allowed, d**-0.5)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=TOL, rtol=0)


@given(
    pads=st.lists(st.integers(0, 15), min_size=1, max_size=20),
    q_len=st.integers(1, 3),
    cells=st.sampled_from([0, 4, 16, 10_000]),
)
def test_row_bands_cover_the_rows_in_order_and_skip_only_unread_columns(
    pads: list[int], q_len: int, cells: int
) -> None:
    """Bands are contiguous and cover rows 0..B-1 once, in order; no query of a band's rows
    attends a column before the band's c, and every band keeps a column (a row that reads
    none counts as reading its last); the cells a band computes in vain stay within the price
    of a call, unless the band is one row."""
    s = 12 + q_len
    allowed = torch.ones(len(pads), 1, q_len, s, dtype=torch.bool).tril(s - q_len)
    for i, pad in enumerate(pads):
        allowed[i, ..., :pad] = False
    pads = [min(pad, s - 1) for pad in pads]  # the first column each row reads (or its last)
    bands = row_bands(allowed, cells)
    assert bands[0][0] == 0 and bands[-1][1] == len(pads)
    for (_, end, _), (start, _, _) in itertools.pairwise(bands):
        assert end == start
    for r0, r1, c in bands:
        assert r0 < r1
        assert not allowed[r0:r1, ..., :c].any()
        waste = sum((pads[r] - c) * q_len for r in range(r0, r1))
        assert waste <= cells or r1 - r0 == 1
    assert all(c < s for _, _, c in bands)
    if cells == 0:  # no padding computed at all: every band starts at its rows' first column
        assert all(pads[r] == c for r0, r1, c in bands for r in range(r0, r1))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(2, 9), p=st.integers(1, 6))
def test_decode_attention_by_bands_equals_attention_over_the_concatenation(
    seed: int, b: int, p: int
) -> None:
    """One query per row, rows of very different padding (sorted and not): attention run per
    band (every band forced by a call price of 0 cells) equals the loop oracle."""
    g = torch.Generator().manual_seed(seed)
    d, h, s = 8, 2, 16
    q = torch.randn(b, h, 1, d, generator=g)
    k, v = torch.randn(2, b, h, s, d, generator=g)
    prefix = torch.randn(1, 2, 1, h, p, d, generator=g)
    pads = torch.randint(0, s, (b,), generator=g).tolist()
    allowed = torch.ones(b, 1, 1, s, dtype=torch.bool)
    for i, pad in enumerate(pads):
        allowed[i, ..., :pad] = False
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=1, is_causal=True)
    model = SimpleNamespace(config=LlamaConfig(attn_implementation="sdpa"))
    seen: list[list[tuple[int, int, int]]] = []
    forced = shared_attention.row_bands

    def every_band(mask: torch.Tensor, call_cells: int = 0) -> list[tuple[int, int, int]]:
        seen.append(forced(mask, 0))
        return seen[-1]

    shared_attention.row_bands = every_band
    try:
        with use_shared_prefix(model, prefix):
            got, _ = shared_prefix_attention(module, q, k, v, allowed, scaling=d**-0.5)
    finally:
        shared_attention.row_bands = forced
    assert seen and len(seen[0]) >= len(set(pads)) > 0
    want = _oracle(q, prefix[0, 0], prefix[0, 1], k, v, allowed, d**-0.5)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=TOL, rtol=0)


def test_a_block_no_attention_layer_read_is_refused() -> None:
    model = SimpleNamespace(config=LlamaConfig(attn_implementation="sdpa"))
    refused = pytest.raises(RuntimeError, match="no attention layer read the shared prefix")
    with refused, use_shared_prefix(model, torch.zeros(1, 2, 1, 1, 3, 4)):
        pass
    assert model.config._attn_implementation == "sdpa"


def test_merge_of_two_halves_is_softmax_over_both() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 3, 1, 4, generator=g), torch.randn(2, 3, 10, 4, generator=g), None
    v = torch.randn(2, 3, 10, 4, generator=g)
    halves = []
    for lo, hi in ((0, 6), (6, 10)):
        scores = q @ k[..., lo:hi, :].transpose(-1, -2)
        halves += [torch.softmax(scores, -1) @ v[..., lo:hi, :], scores.logsumexp(-1)]
    want = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(merge_attention(*halves), want, atol=TOL, rtol=0)


def test_outside_the_block_it_is_plain_sdpa() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 3, 4, generator=g) for _ in range(3))
    module = SimpleNamespace(layer_idx=0, num_key_value_groups=1, is_causal=True)
    got, _ = shared_prefix_attention(module, q, k, v, None, scaling=0.5)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=TOL, rtol=0)


@pytest.mark.parametrize("start", [0, 1, 3, 4, 6])
def test_gather_from_an_offset_reads_those_tokens(start: int) -> None:
    cache = PrefixCache(capacity=100)
    full = torch.arange(2 * 2 * 1 * 9 * 3, dtype=torch.float32).reshape(2, 2, 1, 9, 3)
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 0, 0]
    cache.insert(a, full, 0)
    cache.insert(b, torch.zeros(2, 2, 1, 2, 3), 4)  # splits a's edge after 4 tokens
    m = cache.match(a)
    assert len(m.pieces) == 2
    n = 9 - start
    out = torch.full((2, 2, 1, n, 3), -1.0)
    cache.gather(m, n, out, start)
    torch.testing.assert_close(out, full[..., start:, :], rtol=0, atol=0)
    with pytest.raises(ValueError, match="cached"):
        cache.gather(m, n + 1, torch.zeros(2, 2, 1, n + 1, 3), start)


def test_backend_replies_are_the_same_with_the_prefix_held_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hf backend with and without the shared prefix: same replies (seeded and greedy),
    log-probs within 1e-5, and the prefix was really held apart, in decoding and in the
    prefill of the new observations."""
    from factor_cli.policy.generation import hf, prefix_reuse
    from factor_cli.policy.model import load_policy

    entered: list[int] = []

    def counting(model, prefix):
        entered.append(prefix.shape[-2])
        return use_shared_prefix(model, prefix)

    monkeypatch.setattr(hf, "use_shared_prefix", counting)  # decoding
    monkeypatch.setattr(prefix_reuse, "use_shared_prefix", counting)  # prefill
    policy = load_policy(str(tiny_model_dir))
    on = hf.HFGenerator(policy, max_new_tokens=12, max_context=512)
    off = hf.HFGenerator(policy, max_new_tokens=12, max_context=512, shared_prefix_min=None)
    task = "Task: Your task is to search the environment and find the coin. Then take it."
    rooms = ["kitchen", "pantry", "corridor with a key holder", "backyard", "living room"]
    for greedy, turn in ((False, 0), (True, 1)):  # the second turn finds the task stored
        prompts = [f"{task}\nObservation {turn}: You are in the {r}. " + "A door. " * j
                   for j, r in enumerate(rooms)]  # fmt: skip
        entered.clear()
        a = on.generate(prompts, greedy=greedy, seeds=list(range(5)))
        b = off.generate(prompts, greedy=greedy, seeds=list(range(5)))
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.prompt_ids == y.prompt_ids
            gap = (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max()
            assert float(gap) < TOL
        # Decoding, and the prefill of the rows: at turn 0 the task is prefilled once first
        # (a stem: stems.shared_stems), at turn 1 it is stored already.
        assert len(entered) >= 2
        assert min(entered) > 16
    assert on.shared_prefix_tokens > 2 * 5 * 16 and off.shared_prefix_tokens == 0
