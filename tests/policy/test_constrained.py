"""Valid-action decoding (``policy/generation/constrained.py``) and the hf backend under it.

Oracles: the allowed set after a prefix is enumerated from the list of allowed replies (no
trie), and the constrained log-prob is recomputed by a teacher-forced forward of each reply on
its own, z_j[y_j] / T - logsumexp_{v in C_j} z_j[v] / T. The vLLM backend's counterparts are in
``test_vllm_backend.py``; the update's ratio and the teacher in ``tests/train/``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from factor_cli.policy.generation.constrained import (
    TokenTrie,
    TrieBuilder,
    check_allowed,
    constrained_logits,
)
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.generation.scoring import score_replies
from factor_cli.policy.prompting import ACTION_CLOSE, ACTION_OPEN, extract_action

TOL = 1e-5
WORDS = ["move", "north", "south", "take", "coin", "open", "door", "to", "look", "around", "a"]
ACTIONS = [
    ["move north", "move south", "take coin", "take", "look around", "open door to north"],
    ["move north", "move south"],
    ["take coin"],  # one action: every position is forced
    ["open door to north", "open door to south", "open door", "inventory"],
]
PROMPTS = [
    "You are in the kitchen. Find the coin.\n",
    "Task: find the coin. You are in a hallway. Exits: north, south.\n",
    "You see a coin on the floor.\n",
    "A closed door leads north.\n",
]


def oracle_allowed(sequences: Sequence[Sequence[int]], prefix: Sequence[int]) -> list[int] | None:
    """The tokens that continue ``prefix`` in some sequence, by enumeration (None: none)."""
    n = len(prefix)
    nxt = {s[n] for s in sequences if len(s) > n and list(s[:n]) == list(prefix)}
    return sorted(nxt) or None


def random_sequences(rng: random.Random) -> list[list[int]]:
    """Sequences over a small vocabulary (so prefixes are shared), one a prefix of another."""
    seqs = [[rng.randrange(5) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 9))]
    base = seqs[0]
    seqs.append(base + [rng.randrange(5) for _ in range(rng.randint(1, 3))])
    return seqs


# -- the trie, against enumeration ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(25))
def test_trie_equals_enumeration_of_the_allowed_sequences(seed: int) -> None:
    rng = random.Random(seed)
    seqs = random_sequences(rng)
    trie = TokenTrie(seqs)
    prefixes = {tuple(s[:j]) for s in seqs for j in range(len(s) + 1)}
    prefixes |= {tuple(rng.randrange(6) for _ in range(rng.randint(0, 4))) for _ in range(30)}
    for p in sorted(prefixes):
        assert trie.allowed(p) == oracle_allowed(seqs, p), p
    for s in seqs:
        assert trie.allowed_along(s) == [oracle_allowed(seqs, s[:j]) for j in range(len(s))]
    with pytest.raises(ValueError, match="not allowed by the action trie"):
        trie.allowed_along([9])


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    from factor_cli.policy.model import load_policy

    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="module")
def gen(policy) -> HFGenerator:
    return HFGenerator(policy, max_new_tokens=24, max_context=512)


def reply_ids(tokenizer, action: str, stop_ids: Sequence[int]) -> list[int]:
    """R(a), written out: the whole reply string's tokens, then a stop token unless it ends
    with one."""
    ids = tokenizer.encode(f"{ACTION_OPEN}{action}{ACTION_CLOSE}", add_special_tokens=False)
    return ids if ids[-1] in stop_ids else [*ids, stop_ids[0]]


@pytest.mark.parametrize("seed", range(10))
def test_action_tries_equal_enumeration(gen: HFGenerator, seed: int) -> None:
    """Random action sets with shared prefixes ("move north" / "move south") and an action that
    is a prefix of another ("take" / "take coin")."""
    rng = random.Random(seed)
    acts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 8))]
    acts += ["take", "take coin"]
    (trie,) = TrieBuilder(gen.tokenizer, gen.stop_ids).tries([acts], 1)
    seqs = [reply_ids(gen.tokenizer, a, gen.stop_ids) for a in acts]
    assert sorted(trie.sequences) == sorted(map(list, {tuple(s) for s in seqs}))
    for s in seqs:
        assert s[-1] in gen.stop_ids
        assert trie.allowed_along(s) == [oracle_allowed(seqs, s[:j]) for j in range(len(s))]
        assert trie.allowed(s) is None  # complete: nothing is constrained after the stop


@pytest.mark.parametrize(
    ("allowed", "message"),
    [
        ([["go"]], "allowed has 1 entries for 2 prompts"),
        ("go north", "allowed has a string for 2 prompts"),
        ([["go"], ["north", ""]], r"allowed\[1\] holds the action ''"),
        ([["  "], None], r"allowed\[0\] holds the action '  '"),
        ([None, "go north"], r"allowed\[1\] is the string 'go north'"),
    ],
)
def test_bad_allowed_is_one_line_error(gen: HFGenerator, allowed, message: str) -> None:
    for call in (
        lambda: check_allowed(allowed, 2),
        lambda: gen.generate(["a", "b"], allowed=allowed),
    ):
        with pytest.raises(ValueError, match=message) as err:
            call()
        assert "\n" not in str(err.value)


def test_an_action_holding_the_stop_token_is_refused(gen: HFGenerator) -> None:
    with pytest.raises(ValueError, match="contains the stop token") as err:
        gen.generate(["a"], allowed=[[f"take{ACTION_CLOSE}coin"]])
    assert "\n" not in str(err.value)


def test_empty_or_missing_rows_decode_freely() -> None:
    assert check_allowed(None, 2) == [None, None]
    assert check_allowed([[], None, ("go",)], 3) == [None, None, ["go"]]


# -- the hf backend ------------------------------------------------------------------------------
def oracle_logprobs(policy, prompt: list[int], reply: list[int], sets, temperature: float):
    """log pi^C of each reply token: one forward of prompt + reply alone (no batch, no cache),
    z / T renormalised over the oracle's allowed sets by an explicit logsumexp."""
    with torch.no_grad():
        z = policy.model(input_ids=torch.tensor([prompt + reply])).logits[0].float() / temperature
    z = z[len(prompt) - 1 : len(prompt) - 1 + len(reply)]
    return [float(z[j, y] - torch.logsumexp(z[j, sets[j]], 0)) for j, y in enumerate(reply)]


@pytest.mark.parametrize("mode", ["greedy", "T=1.0", "T=0.7"])
def test_replies_are_allowed_and_logprobs_renormalised(policy, gen: HFGenerator, mode: str) -> None:
    greedy = mode == "greedy"
    temperature = 1.0 if greedy else float(mode[2:])
    prompts, allowed = PROMPTS * 2, ACTIONS * 2
    gens = gen.generate(
        prompts, temperature=temperature, greedy=greedy, seeds=range(8), allowed=allowed
    )
    for g, acts in zip(gens, allowed):
        seqs = [reply_ids(policy.tokenizer, a, gen.stop_ids) for a in acts]
        assert g.token_ids in seqs and g.finished
        action = extract_action(g.text)
        assert action.tagged and action.text in acts
        assert g.text == f"{ACTION_OPEN}{action.text}{ACTION_CLOSE}"
        sets = [oracle_allowed(seqs, g.token_ids[:j]) for j in range(len(g.token_ids))]
        assert g.allowed_ids == sets
        want = oracle_logprobs(policy, g.prompt_ids, g.token_ids, sets, temperature)
        assert max(abs(a - b) for a, b in zip(g.logprobs, want)) < TOL
        for lp, s in zip(g.logprobs, sets):
            if len(s) == 1:
                assert lp == 0.0  # a forced token
            else:
                assert lp < 0.0
    if not greedy:  # sampling reaches more than the greedy reply of the 6-action prompt
        group = gen.generate(
            [PROMPTS[0]] * 8, temperature=1.0, seeds=range(8), allowed=[ACTIONS[0]] * 8
        )
        assert len({tuple(g.token_ids) for g in group}) > 1


def test_rescoring_under_the_sets_reproduces_the_logprobs(policy, gen: HFGenerator) -> None:
    """score_replies with the generations' allowed sets gives back their log-probs (the
    trainer's pi_old), and free scoring does not (the old, inconsistent ratio)."""
    gens = gen.generate(PROMPTS, temperature=0.7, seeds=[3, 4, 5, 6], allowed=ACTIONS)
    args = (
        policy.model,
        [g.prompt_ids for g in gens],
        [g.token_ids for g in gens],
        0.7,
        gen.pad_id,
    )
    constrained = score_replies(*args, allowed=[g.allowed_ids for g in gens]).logprobs
    free = score_replies(*args).logprobs
    for g, c, f in zip(gens, constrained, free):
        assert (c - torch.tensor(g.logprobs)).abs().max() < TOL
        assert (f - torch.tensor(g.logprobs)).abs().max() > 1e-2


def test_same_seed_same_reply_whatever_the_batch(gen: HFGenerator) -> None:
    seeds = [11, 12, 13, 14]
    one = gen.generate(PROMPTS, seeds=seeds, allowed=ACTIONS)
    two = gen.generate(PROMPTS, seeds=seeds, allowed=ACTIONS)
    assert [g.token_ids for g in one] == [g.token_ids for g in two]
    assert [g.logprobs for g in one] == [g.logprobs for g in two]
    (alone,) = gen.generate(PROMPTS[:1], seeds=seeds[:1], allowed=ACTIONS[:1])
    assert alone.token_ids == one[0].token_ids
    assert alone.logprobs == pytest.approx(one[0].logprobs, abs=TOL)


@pytest.mark.parametrize("greedy", [False, True])
def test_free_rows_are_the_unconstrained_replies(gen: HFGenerator, greedy: bool) -> None:
    """Rows with None (or no actions) in a constrained batch decode exactly as without
    ``allowed``: the mask touches their scores nowhere and their random streams are theirs."""
    seeds = [21, 22, 23, 24]
    free = gen.generate(PROMPTS, greedy=greedy, seeds=seeds)
    mixed = gen.generate(PROMPTS, greedy=greedy, seeds=seeds, allowed=[None, ACTIONS[1], [], None])
    for i in (0, 2, 3):
        assert mixed[i].token_ids == free[i].token_ids
        assert mixed[i].logprobs == pytest.approx(free[i].logprobs, abs=1e-6)
        assert mixed[i].allowed_ids is None and free[i].allowed_ids is None
    assert mixed[1].allowed_ids is not None


def test_constrained_logits_mask_out_of_place() -> None:
    z = torch.randn(3, 6, requires_grad=True)
    out = constrained_logits(z, [[1, 4], [0], [2, 3, 5]])
    assert torch.isfinite(out).all() and torch.equal(z[0, [1, 4]], out[0, [1, 4]])
    p = torch.softmax(out, -1)
    assert p[0, [0, 2, 3, 5]].sum() == 0 and p[1, 0] == 1
    out.logsumexp(-1).sum().backward()
    assert z.grad is not None and z.grad[1].tolist() == [1.0, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="allowed_ids has 2 positions for 3 reply tokens"):
        constrained_logits(z, [[1], [2]])
