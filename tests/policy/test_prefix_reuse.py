"""Prefix KV reuse in the hf backend: the radix-tree cache on its own (exact answers on small
cases), then reuse on vs off over real multi-turn TWX rollouts with the tiny model (K sibling
trajectories per group, continuations from restored states, free and valid-action decoding):
identical replies, log-probs within 1e-5, a bounded cache, dropped on refresh, and counters
that show the reuse happened."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from factor_cli.envs import availability
from factor_cli.envs.pool import EnvPool
from factor_cli.policy.generation.backends import BACKENDS
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.generation.prefix_cache import PrefixCache, kv_bytes_per_token
from factor_cli.policy.generation.scratch import Scratch
from factor_cli.policy.prompting import PromptFormat
from factor_cli.rollout.continuations import run_continuations
from factor_cli.rollout.runner import Episode, RolloutRunner, Start

twx_missing = availability("twx")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
TOL = 1e-5
APPEND_ONLY = PromptFormat(admissible=True, history_turns=50)  # the whole episode in the prompt
WINDOW = PromptFormat(admissible=True)  # the default: a sliding window of 2 turns


# -- the cache on its own ----------------------------------------------------------------------
def _kv(tokens: list[int]) -> torch.Tensor:
    """A fake KV [N_layers=2, 2, H=1, n, D=3] whose every entry names its token and position,
    so a wrong gather (token, order or column) shows in the numbers."""
    n = len(tokens)
    t = torch.tensor(tokens, dtype=torch.float32)[:, None] + 0.001 * torch.arange(n)[:, None]
    base = t.expand(n, 3)
    return torch.stack([torch.stack([base, base + 100]), torch.stack([base + 200, base + 300])])[
        :, :, None
    ]


def _stored(cache: PrefixCache, seq: list[int]) -> torch.Tensor:
    m = cache.match(seq)
    out = torch.zeros(2, 2, 1, m.length, 3)
    cache.gather(m, m.length, out)
    return out


def test_match_insert_split_and_gather_are_exact() -> None:
    cache = PrefixCache(capacity=100)
    a = [1, 2, 3, 4, 5]
    cache.insert(a, _kv(a), 0)
    assert cache.match(a).length == 5 and cache.match([1, 2, 9]).length == 2
    assert cache.match([7]).length == 0 and cache.tokens == 5
    b = [1, 2, 3, 8, 9, 10]  # shares [1, 2, 3]: the edge splits, only [8, 9, 10] is new
    m = cache.match(b)
    assert m.length == 3
    cache.insert(b, _kv(b)[..., 3:, :], 3)
    assert cache.tokens == 8
    torch.testing.assert_close(_stored(cache, a), _kv(a), rtol=0, atol=0)
    torch.testing.assert_close(_stored(cache, b), _kv(b), rtol=0, atol=0)
    cache.insert(a[:3], _kv(a[:3]), 0)  # already stored: nothing added
    assert cache.tokens == 8
    partial = torch.zeros(2, 2, 1, 4, 3)
    cache.gather(cache.match(b), 4, partial)  # the first n tokens of a match
    torch.testing.assert_close(partial, _kv(b)[..., :4, :], rtol=0, atol=0)


def test_insert_and_gather_refuse_what_is_not_there() -> None:
    cache = PrefixCache(capacity=100)
    with pytest.raises(ValueError, match="3 tokens were to be cached already, 0 are"):
        cache.insert([1, 2, 3, 4], _kv([4]), 3)
    with pytest.raises(ValueError, match="kv holds 1 tokens for 2"):
        cache.insert([1, 2], _kv([2]), 0)
    with pytest.raises(ValueError, match="only 0 tokens are cached, 1 asked"):
        cache.gather(cache.match([1]), 1, torch.zeros(2, 2, 1, 1, 3))
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        PrefixCache(-1)


def test_eviction_drops_least_recently_used_leaves_first() -> None:
    cache = PrefixCache(capacity=7)
    old, mid, new = [1, 2, 3], [1, 2, 4, 5], [6, 7, 8]
    for seq in (old, mid, new):
        cache.insert(seq, _kv(seq), 0)
    assert cache.tokens == 8  # edges [1, 2] -> {[3], [4, 5]}, [6, 7, 8]
    cache.match(old)  # old is now more recent than mid
    assert cache.evict() == 2  # mid's own leaf [4, 5] goes; the shared [1, 2] stays
    assert cache.tokens == 6 and cache.evicted == 2
    assert cache.match(mid).length == 2 and cache.match(old).length == 3
    cache.capacity = 3
    cache.match(old)
    assert cache.evict() == 3  # new (least recent) goes, then nothing more is needed...
    assert cache.match(new).length == 0 and cache.match(old).length == 3
    cache.capacity = 0
    cache.evict()  # ...and a parent left childless becomes a leaf and goes too
    assert cache.tokens == 0 and not cache.root.children
    cache.insert(old, _kv(old), 0)
    cache.clear()
    assert cache.tokens == 0 and cache.match(old).length == 0


def test_transient_leaves_are_evicted_before_lasting_ones() -> None:
    """A continuation's prompts (transient) go before a root's, however recent; a lasting
    insert through a transient node makes it lasting, and a split keeps the flag."""
    cache = PrefixCache(capacity=100)
    root, cont, later = [1, 2, 3], [1, 2, 3, 4, 5], [9, 8]
    cache.insert(root, _kv(root), 0)
    cache.insert(cont, _kv(cont)[..., 3:, :], 3, transient=True)  # after the root: more recent
    cache.insert(later, _kv(later), 0)
    cache.match(cont)
    cache.capacity = 5
    assert cache.evict() == 2  # cont's own [4, 5], the most recently used, goes first
    assert cache.match(root).length == 3 and cache.match(later).length == 2
    # A transient edge that a lasting prompt then shares becomes lasting up to the split.
    cache.capacity = 100
    cache.insert([7, 7, 7, 7], _kv([7, 7, 7, 7]), 0, transient=True)
    cache.insert([7, 7, 1], _kv([7, 7, 1])[..., 2:, :], 2)
    upper = cache.root.children[7]
    assert upper.tokens == (7, 7) and not upper.transient
    assert upper.children[7].transient and not upper.children[1].transient
    cache.capacity = cache.tokens - 2
    assert cache.evict() == 2 and cache.match([7, 7, 7, 7]).length == 2
    assert cache.match([7, 7, 1]).length == 3 and cache.match(root).length == 3


def test_a_handed_over_kv_is_stored_without_a_copy_only_when_stored_whole() -> None:
    cache = PrefixCache(capacity=100)
    a = [1, 2, 3]
    kv = _kv(a)
    cache.insert(a, kv, 0, handed_over=True)
    assert cache.root.children[1].kv is kv  # the caller's tensor, not a copy
    b = [1, 2, 3, 4, 5]
    longer = _kv(b)[..., 3:, :].contiguous()
    cache.insert(b, longer, 3, handed_over=True)
    assert cache.root.children[1].children[4].kv is longer
    # An earlier row stored part of it: only the rest is kept, as a copy (no view that would
    # hold the caller's whole tensor).
    c = [1, 2, 3, 4, 5, 6]
    kv_c = _kv(c)[..., 3:, :].contiguous()
    cache.insert(c, kv_c, 3, handed_over=True)
    leaf = cache.root.children[1].children[4].children[6]
    assert leaf.kv._base is None and leaf.kv.data_ptr() != kv_c.data_ptr()
    torch.testing.assert_close(_stored(cache, c), _kv(c), rtol=0, atol=0)
    # Not handed over: always a copy.
    d = [9, 9]
    kv_d = _kv(d)
    cache.insert(d, kv_d, 0)
    assert cache.root.children[9].kv.data_ptr() != kv_d.data_ptr()


def test_scratch_reuses_its_block_and_grows_when_too_small() -> None:
    scratch = Scratch()
    cpu = torch.device("cpu")
    big = scratch.take("rows", (4, 5), torch.float32, cpu)
    small = scratch.take("rows", (2, 3), torch.float32, cpu)
    assert small.shape == (2, 3) and small.data_ptr() == big.data_ptr()  # the same memory
    other = scratch.take("prefix", (2, 3), torch.float32, cpu)
    assert other.data_ptr() != big.data_ptr()  # each name its own block
    grown = scratch.take("rows", (5, 5), torch.float32, cpu)
    assert grown.shape == (5, 5) and scratch.nbytes == (25 + 6) * 4
    assert scratch.take("rows", (3,), torch.float64, cpu).dtype == torch.float64
    scratch.clear()
    assert scratch.nbytes == 0


def test_kv_bytes_per_token_of_the_tiny_model_config() -> None:
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, head_dim=32)
    assert kv_bytes_per_token(cfg, torch.float32) == 2 * 4 * 4 * 32 * 4
    cfg.num_key_value_heads = 2
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 2 * 4 * 2 * 32 * 2


# -- the backend -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    from factor_cli.policy.model import load_policy

    return load_policy(str(tiny_model_dir))


def _pair(policy, cap: int | None = None) -> tuple[HFGenerator, HFGenerator]:
    on = HFGenerator(policy, max_new_tokens=16, max_context=1024, prefix_cache_tokens=cap)
    off = HFGenerator(policy, max_new_tokens=16, max_context=1024, prefix_reuse=False)
    assert on.prefix_reuse and not off.prefix_reuse
    return on, off


def test_factory_passes_the_switch(policy) -> None:
    build = BACKENDS.get("hf")
    assert build(policy, max_new_tokens=8, max_context=64).prefix_reuse
    assert not build(policy, max_new_tokens=8, max_context=64, prefix_reuse=False).prefix_reuse


def test_default_cap_is_the_memory_budget(policy) -> None:
    gen = HFGenerator(policy, max_new_tokens=8, max_context=1024, batch_size=4)
    assert gen.prefix_cache.capacity == 2 * 4 * 1024  # two full batches fit in 1 GiB here
    big = HFGenerator(policy, max_new_tokens=8, max_context=2048)
    per_token = kv_bytes_per_token(policy.model.config, policy.model.dtype)
    assert big.prefix_cache.capacity == min(2 * 128 * 2048, 1024**3 // per_token)


def _assert_same(a: list[Episode], b: list[Episode]) -> int:
    """Equal trajectories (actions, reply tokens, allowed sets) and log-probs within TOL;
    returns the number of turns compared."""
    assert len(a) == len(b)
    turns = 0
    for x, y in zip(a, b):
        assert x.actions == y.actions
        assert len(x.turns) == len(y.turns)
        for s, t in zip(x.turns, y.turns):
            assert s.prompt_ids == t.prompt_ids and s.reply_ids == t.reply_ids
            assert s.allowed_ids == t.allowed_ids
            gap = (torch.tensor(s.logprobs) - torch.tensor(t.logprobs)).abs().max()
            assert float(gap) < TOL
            turns += 1
    return turns


def _play(
    gen: HFGenerator,
    fmt: PromptFormat,
    greedy: bool,
    constrain: bool = False,
    sizes: list[int] | None = None,
) -> tuple[list[Episode], list[Episode]]:
    """Roots (2 groups x K = 3 on coin, up to 5 turns) and B x M = 2 x 2 continuations."""
    starts = [Start(f"coin/{i}", group=g) for g, i in enumerate((3, 11)) for _ in range(3)]
    on_turn = None if sizes is None else (lambda i, n: sizes.append(len(gen.prefix_cache)))
    with EnvPool("twx", 24) as pool:
        runner = RolloutRunner(pool, gen, fmt, max_turns=5, constrain=constrain)
        roots = runner.run(starts, temperature=1.0, greedy=greedy, seed=5, on_turn=on_turn)
        cont = run_continuations(
            runner, roots, "leave-one-out", 2, 2, horizon=3, seed=6, on_turn=on_turn
        )
    return roots, cont.episodes


def test_the_backend_gathers_into_its_scratch_and_close_gives_it_back(policy) -> None:
    gen = HFGenerator(policy, max_new_tokens=4)
    prompts = ["look around and describe the room"] * 2 + ["take the coin from the table"]
    first = gen.generate(prompts, seed=3)
    held = gen.reuse.scratch.nbytes
    assert held > 0  # the decode batch's rows (and prefill) came from the scratch
    assert [g.token_ids for g in gen.generate(prompts, seed=3)] == [g.token_ids for g in first]
    assert gen.reuse.scratch.nbytes == held  # the same batch again: no new block
    gen.close()
    assert gen.reuse.scratch.nbytes == 0


@needs_twx
@pytest.mark.parametrize(
    ("fmt", "greedy"),
    [(APPEND_ONLY, False), (APPEND_ONLY, True), (WINDOW, False)],
    ids=["append-only-sampled", "append-only-greedy", "window-sampled"],
)
def test_reuse_changes_no_trajectory(policy, fmt: PromptFormat, greedy: bool) -> None:
    on, off = _pair(policy)
    roots_on, conts_on = _play(on, fmt, greedy)
    roots_off, conts_off = _play(off, fmt, greedy)
    assert _assert_same(roots_on, roots_off) >= 12
    assert _assert_same(conts_on, conts_off) >= 8
    assert on.prompt_tokens == off.prompt_tokens > 0
    # Reuse happened: append-only prompts extend the previous turn's, so most of every prompt
    # after the first turn is stored; the window still shares system + task and the
    # continuations' first prompts (their roots' prompts at the checkpoints).
    share = on.reused_tokens / on.prompt_tokens
    assert share > (0.6 if fmt is APPEND_ONLY else 0.3)
    assert on.prefill_tokens + on.reused_tokens == on.prompt_tokens
    assert on.reused_tokens > off.reused_tokens  # off shares only identical prompts' prefill
    # Decoding read system + task once per batch (shared_attention), not once per row.
    assert on.shared_prefix_tokens > 0 and off.shared_prefix_tokens == 0


@needs_twx
def test_reuse_with_valid_action_decoding(policy) -> None:
    on, off = _pair(policy)
    roots_on, conts_on = _play(on, APPEND_ONLY, greedy=False, constrain=True)
    roots_off, conts_off = _play(off, APPEND_ONLY, greedy=False, constrain=True)
    assert _assert_same(roots_on, roots_off) >= 12
    _assert_same(conts_on, conts_off)
    assert all(t.allowed_ids is not None for e in roots_on for t in e.turns)
    assert on.reused_tokens / on.prompt_tokens > 0.6


def _forwards_of(gen: HFGenerator, greedy: bool) -> tuple[list[Episode], list[Episode], int]:
    """:func:`_play` under valid-action decoding, and the model forwards it ran."""
    calls: list[int] = []
    hook = gen.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        roots, conts = _play(gen, WINDOW, greedy=greedy, constrain=True)
    finally:
        hook.remove()
    return roots, conts, len(calls)


@needs_twx
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_forced_tokens_skip_the_model_and_change_no_trajectory(policy, greedy: bool) -> None:
    """Valid-action decoding with forced tokens skipping the model (the default) against a
    forward per token: the same roots and continuations, log-probs within 1e-5, forced
    positions scored exactly 0, and fewer forwards."""
    on = HFGenerator(policy, max_new_tokens=16, max_context=1024)
    off = HFGenerator(policy, max_new_tokens=16, max_context=1024, skip_forced=False)
    roots_on, conts_on, calls_on = _forwards_of(on, greedy)
    roots_off, conts_off, calls_off = _forwards_of(off, greedy)
    assert _assert_same(roots_on, roots_off) >= 12
    assert _assert_same(conts_on, conts_off) >= 8
    turns = [t for e in roots_on + conts_on for t in e.turns]
    forced = [lp for t in turns for lp, c in zip(t.logprobs, t.allowed_ids) if len(c) == 1]
    assert len(forced) > len(turns) and all(lp == 0.0 for lp in forced)  # the tags at least
    assert calls_on < 0.8 * calls_off


@needs_twx
def test_a_small_cap_evicts_and_changes_nothing(policy) -> None:
    cap = 600  # about two prompts: far less than one turn's batch of six
    on, off = _pair(policy, cap=cap)
    sizes: list[int] = []
    roots_on, conts_on = _play(on, APPEND_ONLY, greedy=False, sizes=sizes)
    roots_off, conts_off = _play(off, APPEND_ONLY, greedy=False)
    _assert_same(roots_on, roots_off)
    _assert_same(conts_on, conts_off)
    assert sizes and max(sizes) <= cap
    assert on.prefix_cache.evicted > 0
    assert on.reused_tokens > 0  # what survives eviction is still used


@needs_twx
def test_refresh_and_weight_updates_drop_the_cache(policy) -> None:
    model = copy.deepcopy(policy.model)
    own = type(policy)(model=model, tokenizer=policy.tokenizer)
    on = HFGenerator(own, max_new_tokens=12, max_context=1024)
    prompts = ["Task: find the coin.\n\nCurrent observation: You are in the kitchen."] * 2
    on.generate(prompts, seed=1)
    assert len(on.prefix_cache) > 0
    on.refresh()
    assert len(on.prefix_cache) == 0
    on.generate(prompts, seed=1)
    with torch.no_grad():  # an optimizer-like in-place update, without refresh()
        for p in model.parameters():
            p.mul_(1.5)
    after = on.generate(prompts, seed=1)  # stale KV would give other log-probs
    fresh = HFGenerator(own, max_new_tokens=12, max_context=1024, prefix_reuse=False)
    ref = fresh.generate(prompts, seed=1)
    assert [g.token_ids for g in after] == [g.token_ids for g in ref]
    for g, r in zip(after, ref):
        assert max(abs(x - y) for x, y in zip(g.logprobs, r.logprobs)) < TOL


def test_config_switch_defaults_on_and_turns_off() -> None:
    from factor_cli.train.config import RolloutConfig, load_config

    assert RolloutConfig().prefix_reuse is True
    assert load_config("smoke", ["rollout.prefix_reuse=false"]).rollout.prefix_reuse is False


@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 8))
def test_cost_batches_cover_every_row_once_within_the_padding_slack(new, size) -> None:
    """The cached scorer's batches: each row once, at most ``batch_size`` rows, and a padded
    cost (rows x largest count) within 1.25x the batch's real cost."""
    from factor_cli.policy.generation.prefix_reuse import cost_batches

    batches = cost_batches(new, size)
    assert sorted(i for b in batches for i in b) == list(range(len(new)))
    for b in batches:
        assert 1 <= len(b) <= size
        assert len(b) * max(new[i] for i in b) <= 1.25 * sum(new[i] for i in b) or len(b) == 1


# -- shared stems: what several prompts of a batch share past the cache is prefilled once ------
_seqs = st.lists(st.integers(0, 2), min_size=0, max_size=12).map(tuple)


@given(st.lists(st.tuples(_seqs, st.integers(0, 12)), max_size=12), st.integers(1, 4))
def test_shared_stems_are_shared_past_what_is_stored_and_leave_no_pair_out(rows, least) -> None:
    """Each stem is a common prefix of its rows (two or more, each row in one stem at most),
    at least ``least`` tokens longer than the most any of them has stored; and two sorted
    neighbours that share that much are never both left without a stem."""
    from factor_cli.policy.generation.stems import shared_stems

    rows = list({s: (s, min(k, len(s))) for s, k in rows}.values())  # distinct, as the backend
    stems = shared_stems(rows, least)
    owner: dict[int, int] = {}
    for n, (stem, of) in enumerate(stems):
        assert len(of) >= 2
        for i in of:
            assert i not in owner
            owner[i] = n
            assert rows[i][0][: len(stem)] == stem
        assert len(stem) - max(rows[i][1] for i in of) >= least

    def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    for a, b in itertools.pairwise(order):
        shared = lcp(rows[a][0], rows[b][0]) - max(rows[a][1], rows[b][1])
        if shared >= least:
            assert a in owner or b in owner


def test_shared_stems_of_sibling_prompts() -> None:
    """Three prompts after one common part and a fourth apart: one stem, the common part, as
    long as each row has at most ``least`` tokens less of it stored."""
    from factor_cli.policy.generation.stems import shared_stems

    common = tuple(range(40))
    rows = [((*common, 50, 51), 5), ((*common, 60), 0), (tuple(range(100, 150)), 0),
            ((*common, 70, 71, 72), 8)]  # fmt: skip
    assert shared_stems(rows, 32) == [(common, [0, 1, 3])]
    # 40 - 8 stored = 32 past the cache: too short for the third at 33, not for the first two
    assert shared_stems(rows, 33) == [(common, [0, 1])]
    assert shared_stems(rows, 36) == []


def test_stems_prefill_a_shared_part_once_and_change_no_reply(policy) -> None:
    """Prompts that share a long part nothing stored yet: with stems it is computed once (the
    prefill counter drops by the copies saved), replies are the same (seeded and greedy) and
    log-probs agree within 1e-5."""
    task = "Task: find the coin and take it.\n\nCurrent observation: " + "A long corridor. " * 8
    prompts = [f"{task}You see a {x}." for x in ("door", "table", "key", "lamp")] + ["look"]
    on = HFGenerator(policy, max_new_tokens=8, max_context=1024)
    off = HFGenerator(policy, max_new_tokens=8, max_context=1024, stem_min=None)
    shared = len(on.encode([task])[0][0]) - 4  # about the part the four share (BPE edges)
    for greedy in (False, True):
        on.refresh()
        off.refresh()
        a = on.generate(prompts, greedy=greedy, seeds=list(range(5)))
        b = off.generate(prompts, greedy=greedy, seeds=list(range(5)))
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            gap = (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max()
            assert float(gap) < TOL
    assert on.prompt_tokens == off.prompt_tokens
    assert off.prefill_tokens - on.prefill_tokens >= 2 * 3 * shared  # 3 copies saved, twice


def test_a_batch_in_any_order_gives_each_prompt_its_own_reply(policy) -> None:
    """The backend orders a batch's rows by length (banded decode attention); each reply
    still goes to its own prompt and equals that prompt's reply alone (same seed)."""
    prompts = [
        "Task: find the coin.\n\nCurrent observation: " + "You are in a long hall. " * n
        for n in (5, 1, 9, 3, 7)
    ]
    seeds = [11, 12, 13, 14, 15]
    gen = HFGenerator(policy, max_new_tokens=8, max_context=1024)
    batch = gen.generate(prompts, seeds=seeds)
    for prompt, seed, got in zip(prompts, seeds, batch):
        alone = HFGenerator(policy, max_new_tokens=8, max_context=1024).generate(
            [prompt], seeds=[seed]
        )[0]
        assert got.prompt_ids == alone.prompt_ids and got.token_ids == alone.token_ids
        gap = (torch.tensor(got.logprobs) - torch.tensor(alone.logprobs)).abs().max()
        assert float(gap) < TOL


def test_duplicate_rows_group_requests_by_prompt() -> None:
    from factor_cli.policy.generation.duplicates import duplicate_rows

    prompts = [[1, 2], [1, 2], [3], [1, 2, 4], [1, 2], [3]]
    assert duplicate_rows(prompts) == [[0, 1, 4], [2, 5], [3]]
    assert duplicate_rows([[1], [2], [1, 2]]) is None  # all distinct: no grouping


def test_merged_duplicates_decode_once_and_change_no_reply(policy) -> None:
    """Repeated prompts (a group's first turns, a checkpoint's continuations) share a decode
    row while their replies agree: replies are those of a row per request (seeded, free and
    constrained, also where requests of one prompt allow other replies, and greedy), log-probs
    within 1e-5, prompt tokens counted alike, fewer computed; seedless sampling keeps a row per
    request."""
    obs = "Current observation: You are in the {}. There is a door to the north."
    prompts = [f"Task: find the coin.\n\n{obs.format(r)}" for r in ["kitchen"] * 5 + ["hall"] * 3]
    allowed = [["go north", "take coin", "look"]] * 4 + [["go north"]] + [["look", "go east"]] * 3
    from factor_cli.policy.generation.decode import BufferLayer

    on = HFGenerator(policy, max_new_tokens=8, max_context=1024)
    off = HFGenerator(policy, max_new_tokens=8, max_context=1024, merge_duplicates=False)
    spare: list[bool] = []  # per row copy: were there spare rows for it (no reallocation)?
    append = BufferLayer.append_rows

    def record(self, src, room):
        spare.append(self._k.shape[0] >= self.rows + len(src))
        append(self, src, room)

    for greedy, acts in itertools.product((False, True), (allowed, None)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(BufferLayer, "append_rows", record)
            a = on.generate(prompts, greedy=greedy, seeds=list(range(8)), allowed=acts)
        b = off.generate(prompts, greedy=greedy, seeds=list(range(8)), allowed=acts)
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.allowed_ids == y.allowed_ids
            gap = (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max()
            assert float(gap) < TOL
        if not greedy and acts is None:
            assert len({tuple(x.token_ids) for x in a[:5]}) > 1  # a shared row split
    assert spare and all(spare)  # rows were copied, into rows the gathered cache kept spare
    assert on.prompt_tokens == off.prompt_tokens
    assert on.prefill_tokens < off.prefill_tokens
    seen: list[int] = []
    real = type(on)._inputs

    def count(self, prompts, *args):
        seen.append(len(prompts))
        return real(self, prompts, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(on), "_inputs", count)
        on.generate(prompts, seed=None)  # global-RNG draws: a row per request
        on.generate(prompts, seeds=list(range(8)))
    assert seen == [8, 2]
