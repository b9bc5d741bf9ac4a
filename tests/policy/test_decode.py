"""The hf backend's decode loop against slow oracles on a random tiny Llama: each row decoded
alone by full forwards without any cache (greedy, the row's own Gumbel stream, valid-action
tries), whatever the batch, its padding and its compaction; the buffer cache layer against
``DynamicCache``."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import random_llama

from factor_cli.policy.generation import decode as decode_module
from factor_cli.policy.generation.constrained import TokenTrie
from factor_cli.policy.generation.decode import Sampling, buffer_cache, decode
from factor_cli.policy.generation.row_sampler import RowSeededSampler

VOCAB = 24
STOP = 1
PAD = 0
MAX_NEW = 7


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    net = random_llama(VOCAB, 128)
    with torch.no_grad():  # make the stop token likely, so rows end at different steps
        net.lm_head.weight[STOP] += 0.6 * net.lm_head.weight[2:].mean(0)
        net.lm_head.weight[STOP] *= 3.0
    return net


def _left_pad(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return ids, mask


def _prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(n)]


def _tries(seed: int, n: int) -> list[TokenTrie | None]:
    rng = random.Random(seed)
    out: list[TokenTrie | None] = []
    for _ in range(n):
        if rng.random() < 0.4:
            out.append(None)
            continue
        seqs = [
            [rng.randrange(2, VOCAB) for _ in range(rng.randint(0, 4))] + [STOP]
            for _ in range(rng.randint(1, 4))
        ]
        out.append(TokenTrie(seqs))
    return out


@torch.no_grad()
def _oracle(model, prompt, sampling, row, trie):
    """One row alone: a full forward over prompt + reply so far at every step, no cache."""
    toks: list[int] = []
    lps: list[float] = []
    for _ in range(MAX_NEW):
        z = model(input_ids=torch.tensor([prompt + toks])).logits[0, -1].float()
        allowed = None if trie is None else trie.allowed(toks)
        keep = torch.ones(VOCAB, dtype=torch.bool)
        if allowed is not None:
            keep[:] = False
            keep[allowed] = True
        tok = int(sampling.pick(z.masked_fill(~keep, float("-inf"))[None], [row])[0])
        scaled = (z / sampling.scale).masked_fill(~keep, float("-inf"))
        toks.append(tok)
        lps.append(float(torch.log_softmax(scaled, -1)[tok]))
        if tok == STOP:
            break
    return toks, lps


def _sampling(kind: str, n: int, seed: int) -> Sampling:
    if kind == "greedy":
        return Sampling(1.0, True)
    temperature = 0.7 if kind == "seeded-0.7" else 1.0
    sampler = RowSeededSampler([seed * 100 + i for i in range(n)], temperature, torch.device("cpu"))
    return Sampling(temperature, False, sampler.draw, sampler.skip)


def _forwards(replies: list[list[int]], tries: list[TokenTrie | None], skip: bool) -> int:
    """The forwards :func:`decode` needs for these replies: one per token of the longest
    without ``skip``. With it, none for tokens forced (|C_j| = 1) at the start of every reply
    (h of them, fewer than MAX_NEW) or after a reply's last choice: request b needs the
    forwards that give the logits of positions h .. p_b, its last position with a choice (the
    last of a free reply); replies forced from the start need none."""
    if not skip:
        return max(len(r) for r in replies)
    last: list[int] = []
    heads: list[int] = []
    for toks, trie in zip(replies, tries):
        sets = [[0, 1]] * len(toks) if trie is None else trie.allowed_along(toks)
        choices = [j for j, c in enumerate(sets) if len(c) > 1]
        if trie is not None and not choices and len(trie.forced([])[0]) >= len(toks):
            continue  # forced from the start
        last.append(choices[-1] if choices else len(toks) - 1)
        heads.append(len(trie.forced([])[0]) if trie is not None else 0)
    if not last:
        return 0
    h = min(*heads, MAX_NEW - 1)
    return max(p - h + 1 for p in last)


def _decode_counted(
    model, prompts, tries, sampling: Sampling, compact: float = decode_module.COMPACT_BELOW, **kw
) -> tuple[list[decode_module.Decoded], int]:
    """:func:`decode` of the left-padded ``prompts`` on a buffer cache (compaction at
    ``compact``), and the model forwards it ran."""
    ids, mask = _left_pad(prompts)
    cache = buffer_cache(model.config, ids.shape[1] + MAX_NEW - 1)
    old = decode_module.COMPACT_BELOW
    decode_module.COMPACT_BELOW = compact  # 0: never compact, 1: at every stop
    calls: list[int] = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with torch.no_grad():
            got = decode(model, ids, mask, cache, MAX_NEW, [STOP], sampling, tries, **kw)
    finally:
        decode_module.COMPACT_BELOW = old
        hook.remove()
    return got, len(calls)


def _assert_oracle_replies(model, prompts, tries, got, sampling: Sampling) -> None:
    """Reply i is request i decoded alone by :func:`_oracle` from stream i of ``sampling``:
    the same tokens, log-probs within 1e-5."""
    for row, (prompt, trie, reply) in enumerate(zip(prompts, tries, got)):
        toks, lps = _oracle(model, prompt, sampling, row, trie)
        assert reply.tokens == toks
        torch.testing.assert_close(
            torch.tensor(reply.logprobs), torch.tensor(lps), atol=1e-5, rtol=0
        )


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 6),
    kind=st.sampled_from(["greedy", "seeded-1", "seeded-0.7"]),
    constrained=st.booleans(),
    compact=st.sampled_from([0.0, 0.75, 1.0]),
    skip=st.booleans(),
)
def test_decode_equals_each_row_decoded_alone_without_a_cache(
    model, seed, n, kind, constrained, compact, skip
) -> None:
    """With ``skip_forced`` too: forced tokens skip the model and change no reply."""
    prompts = _prompts(seed, n)
    tries = _tries(seed, n) if constrained else [None] * n
    got, calls = _decode_counted(
        model, prompts, tries, _sampling(kind, n, seed), compact, skip_forced=skip
    )
    # One forward per step, and no step after the last row stopped (a stopped row that stays
    # in the batch must not count as decoding again); none for forced tokens with ``skip``.
    assert calls == _forwards([r.tokens for r in got], tries, skip)
    # Fresh streams: each row's draws start over.
    _assert_oracle_replies(model, prompts, tries, got, _sampling(kind, n, seed))
    for trie, reply in zip(tries, got):
        if trie is not None:
            assert reply.tokens in trie.sequences or len(reply.tokens) == MAX_NEW


@pytest.mark.parametrize("kind", ["greedy", "seeded-1", "seeded-0.7"])
def test_forced_tokens_skip_the_model_and_change_no_reply(model, kind: str) -> None:
    """Replies that all start with the forced token 9 and are forced to their stop after one
    choice take one forward for the whole batch; a reply with a longer forced start decodes
    the rest of it, and a reply forced from the start takes none. Each reply is the oracle's
    (the streams skip the forced start's draws), forced positions with log-prob exactly 0."""
    branchy = TokenTrie([[9, 3, 4, STOP], [9, 5, STOP], [9, 6, 7, 8, STOP]])
    tries: list[TokenTrie | None] = [
        branchy,
        branchy,
        TokenTrie([[9, 10, STOP], [9, 11, 12, STOP]]),
        TokenTrie([[9, 2, 3, STOP], [9, 2, 4, 5, STOP]]),  # forced start [9, 2]: h = 1 here
        TokenTrie([[9, 13, 14, STOP]]),  # forced from the start
    ]
    prompts = _prompts(31, len(tries))
    got, calls = _decode_counted(
        model, prompts, tries, _sampling(kind, len(tries), 5), skip_forced=True
    )
    assert calls == 2  # row 3's second token was forced but not skipped: a choice follows
    _assert_oracle_replies(model, prompts, tries, got, _sampling(kind, len(tries), 5))
    for trie, reply in zip(tries, got):
        forced = [j for j, c in enumerate(trie.allowed_along(reply.tokens)) if len(c) == 1]
        assert all(reply.logprobs[j] == 0.0 for j in forced)
    assert got[4].tokens == [9, 13, 14, STOP]


def test_trie_forced_tokens() -> None:
    trie = TokenTrie([[9, 3, 4, STOP], [9, 5, STOP], [8, 2, STOP]])
    assert trie.forced([]) == ([], False)  # a choice at once
    assert trie.forced([9]) == ([], False)
    assert trie.forced([9, 3]) == ([4, STOP], True)
    assert trie.forced([8]) == ([2, STOP], True)
    assert trie.forced([9, 5, STOP]) == ([], True)  # complete already
    assert trie.forced([7]) == ([], False)  # left the trie
    assert TokenTrie([[9, 2, 3, STOP], [9, 2, 4, STOP]]).forced([]) == ([9, 2], False)


def test_decode_from_a_filled_cache_equals_decode_from_scratch(model) -> None:
    prompts = _prompts(3, 5)
    ids, mask = _left_pad(prompts)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    greedy = Sampling(1.0, True)
    with torch.no_grad():
        scratch = decode(
            model,
            ids,
            mask,
            buffer_cache(model.config, ids.shape[1] + MAX_NEW - 1),
            MAX_NEW,
            [STOP],
            greedy,
            [None] * 5,
        )
        cache = buffer_cache(model.config, ids.shape[1] + MAX_NEW - 1)
        model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=pos[:, :-1],
            past_key_values=cache,
            use_cache=True,
        )
        filled = decode(model, ids, mask, cache, MAX_NEW, [STOP], greedy, [None] * 5)
    assert [r.tokens for r in scratch] == [r.tokens for r in filled]


def test_buffer_layers_give_the_dynamic_cache_forward_and_refuse_overflow(model) -> None:
    from transformers import DynamicCache

    ids = torch.tensor([_prompts(5, 1)[0] * 2, _prompts(6, 1)[0] * 2])[:, :8]
    step = torch.tensor([[5], [6]])
    with torch.no_grad():
        dyn = DynamicCache(config=model.config)
        a = model(input_ids=ids, past_key_values=dyn, use_cache=True).logits
        a2 = model(input_ids=step, past_key_values=dyn, use_cache=True).logits
        buf = buffer_cache(model.config, 9)
        b = model(input_ids=ids, past_key_values=buf, use_cache=True).logits
        b2 = model(input_ids=step, past_key_values=buf, use_cache=True).logits
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        torch.testing.assert_close(a2, b2, atol=1e-6, rtol=0)
        assert buf.get_seq_length() == 9
        with pytest.raises(RuntimeError, match="KV buffer full"):
            model(input_ids=step, past_key_values=buf, use_cache=True)


def test_a_sliding_window_model_decodes_on_its_own_cache() -> None:
    """Layers that keep other state than every position's KV (a sliding window) get their own
    ``DynamicCache``: greedy decoding still equals the cache-free oracle, past the window."""
    from transformers.cache_utils import DynamicLayer

    net = random_llama(VOCAB, 128, seed=1, arch="Mistral", sliding_window=4)
    prompts = _prompts(11, 4)
    ids, mask = _left_pad(prompts)
    cache = buffer_cache(net.config, ids.shape[1] + MAX_NEW - 1)
    assert any(type(layer) is not DynamicLayer for layer in cache.layers)  # not replaced
    with pytest.raises(ValueError, match="full-attention"):
        buffer_cache(net.config, 8, torch.zeros(2, 2, 1, 2, 8, 16), 3)
    greedy = Sampling(1.0, True)
    with torch.no_grad():
        got = decode(net, ids, mask, cache, MAX_NEW, [STOP], greedy, [None] * 4)
    for row, (prompt, reply) in enumerate(zip(prompts, got)):
        assert reply.tokens == _oracle(net, prompt, greedy, row, None)[0]


def test_decoding_ends_when_the_last_row_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row that stopped and stays in the batch (no compaction) decodes on, and may draw
    other tokens after its stop: it is still done. A scripted model stops each row at absolute
    position 3 and writes token 5 everywhere else."""
    from types import SimpleNamespace

    from transformers import DynamicCache

    class Scripted(torch.nn.Module):
        def forward(
            self, input_ids: torch.Tensor, position_ids: torch.Tensor, **_: object
        ) -> SimpleNamespace:
            z = torch.zeros(input_ids.shape[0], 1, VOCAB)
            z[:, 0, 5] = 1.0
            z[position_ids[:, -1] == 3, 0, STOP] = 2.0
            return SimpleNamespace(logits=z)

    monkeypatch.setattr(decode_module, "COMPACT_BELOW", 0.0)
    prompts = [[3] * n for n in (1, 2, 3, 4)]  # stops after 4, 3, 2 and 1 tokens
    ids, mask = _left_pad(prompts)
    net, calls = Scripted(), []
    net.register_forward_hook(lambda *_: calls.append(1))
    got = decode(net, ids, mask, DynamicCache(), MAX_NEW, [STOP], Sampling(1.0, True), [None] * 4)
    assert [r.tokens for r in got] == [[5, 5, 5, STOP], [5, 5, STOP], [5, STOP], [STOP]]
    assert len(calls) == 4


# -- requests that share a row (duplicates.duplicate_rows) ------------------------------------
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    owners=st.lists(st.integers(0, 2), min_size=1, max_size=8),
    kind=st.sampled_from(["greedy", "seeded-1", "seeded-0.7"]),
    constrained=st.booleans(),
    compact=st.sampled_from([0.0, 0.75, 1.0]),
    buffered=st.booleans(),
    skip=st.booleans(),
)
def test_requests_sharing_a_row_get_the_replies_each_gets_alone(
    model, seed, owners, kind, constrained, compact, buffered, skip
) -> None:
    """``members``: request i decodes on the row of prompt ``owners[i]`` with every other
    request of that prompt, from its own stream and under its own allowed replies; each reply
    equals the cache-free oracle of the request alone, however the draws split the rows
    (copies appended to the buffers, or reselected on a plain ``DynamicCache``) and whatever
    compaction does; with ``skip_forced``, whichever requests leave their rows early."""
    from transformers import DynamicCache

    distinct = sorted(set(owners))
    prompts = _prompts(seed, 3)
    n = len(owners)
    tries = _tries(seed, n) if constrained else [None] * n
    members = [[i for i, o in enumerate(owners) if o == d] for d in distinct]
    ids, mask = _left_pad([prompts[d] for d in distinct])
    cache = buffer_cache(model.config, ids.shape[1] + MAX_NEW - 1) if buffered else DynamicCache()
    old = decode_module.COMPACT_BELOW
    decode_module.COMPACT_BELOW = compact
    try:
        with torch.no_grad():
            got = decode(
                model,
                ids,
                mask,
                cache,
                MAX_NEW,
                [STOP],
                _sampling(kind, n, seed),
                tries,
                members=members,
                skip_forced=skip,
            )
    finally:
        decode_module.COMPACT_BELOW = old
    assert len(got) == n
    oracle_sampling = _sampling(kind, n, seed)
    for i, (owner, reply) in enumerate(zip(owners, got)):
        toks, lps = _oracle(model, prompts[owner], oracle_sampling, i, tries[i])
        assert reply.tokens == toks
        torch.testing.assert_close(
            torch.tensor(reply.logprobs), torch.tensor(lps), atol=1e-5, rtol=0
        )


def test_a_shared_row_splits_where_its_requests_draw_apart(model) -> None:
    """Six requests of one prompt on one row: their seeded draws part (the split path runs),
    the buffers grow by copies of the row, and every reply is the request's own."""
    prompt = _prompts(21, 1)[0]
    ids, mask = _left_pad([prompt])
    cache = buffer_cache(model.config, ids.shape[1] + MAX_NEW - 1)
    sampling = _sampling("seeded-1", 6, 4)
    with torch.no_grad():
        got = decode(
            model, ids, mask, cache, MAX_NEW, [STOP], sampling, [None] * 6, members=[range(6)]
        )
    assert len({tuple(r.tokens) for r in got}) > 1  # the row split
    oracle_sampling = _sampling("seeded-1", 6, 4)
    for i, reply in enumerate(got):
        assert reply.tokens == _oracle(model, prompt, oracle_sampling, i, None)[0]


def test_a_request_that_ends_leaves_its_row_without_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two requests on one row draw apart where one of them stops: it leaves the row, and the
    other goes on in it, so no row is copied. A scripted model: token 5 first, then 4 above
    the stop token above 9; request 0 may only write 5 then the stop or 9."""
    from types import SimpleNamespace

    from transformers import DynamicCache

    class Scripted(torch.nn.Module):
        def forward(
            self, input_ids: torch.Tensor, position_ids: torch.Tensor, **_: object
        ) -> SimpleNamespace:
            z = torch.zeros(input_ids.shape[0], 1, VOCAB)
            first = position_ids[:, -1] == 0
            z[first, 0, 5] = 3.0
            z[~first, 0, 4], z[~first, 0, STOP], z[~first, 0, 9] = 3.0, 2.0, 1.0
            return SimpleNamespace(logits=z)

    copies: list[list[int]] = []
    monkeypatch.setattr(decode_module, "append_rows", lambda *a: copies.append(list(a[2])))
    ids, mask = _left_pad([[3]])
    tries = [TokenTrie([[5, STOP], [5, 9, STOP]]), None]
    got = decode(
        Scripted(),
        ids,
        mask,
        DynamicCache(),
        MAX_NEW,
        [STOP],
        Sampling(1.0, True),
        tries,
        members=[[0, 1]],
    )
    assert got[0].tokens == [5, STOP]
    assert got[1].tokens == [5] + [4] * (MAX_NEW - 1)
    assert copies == []


def test_split_keeps_the_first_requests_token_and_copies_the_rest_in_order() -> None:
    groups = [[0, 3, 4], [1, 2], [], [5, 6]]
    drawn = {b: (t, -1.0) for b, t in {0: 7, 3: 8, 4: 7, 1: 9, 2: 9, 5: 1, 6: 2}.items()}
    kept, copies, tokens = decode_module._split(groups, drawn, STOP)
    # Row 0 keeps requests 0 and 4 (token 7) and request 3 leaves for a copy of row 0 (token
    # 8); row 1 agrees; row 2 has no requests left (idle token); row 3 splits as row 0 did.
    assert kept == [[0, 4], [1, 2], [], [5], [3], [6]]
    assert copies == [0, 3]
    assert tokens == [7, 9, STOP, 1, 8, 2]


def test_buffer_rows_are_appended_as_copies_and_grow_once(model) -> None:
    ids = torch.tensor([[2, 3, 4], [5, 6, 7]])
    step = torch.tensor([[8], [9], [10]])
    with torch.no_grad():
        buf = buffer_cache(model.config, 6)
        model(input_ids=ids, past_key_values=buf, use_cache=True)
        before = [(lay.keys.clone(), lay.values.clone()) for lay in buf.layers]
        decode_module.append_rows(buf, 2, [1], room=4)  # grows to 4 rows: one copy
        layer = buf.layers[0]
        assert layer.rows == 3 and layer._k.shape[0] == 4
        for lay, (k, v) in zip(buf.layers, before):
            torch.testing.assert_close(lay.keys, torch.cat([k, k[1:]]), atol=0, rtol=0)
            torch.testing.assert_close(lay.values, torch.cat([v, v[1:]]), atol=0, rtol=0)
        spare = layer._k
        decode_module.append_rows(buf, 3, [0], room=4)  # into the spare row
        assert buf.layers[0]._k is spare and buf.layers[0].rows == 4
        # The copies decode as their rows do.
        step4 = torch.cat([step, step[:1]])
        out = model(input_ids=step4, past_key_values=buf, use_cache=True).logits
        dyn_ids = torch.cat([ids, ids[1:], ids[:1]])
        ref = model(input_ids=torch.cat([dyn_ids, step4], 1)).logits[:, -1:]
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
