"""The shared-prefix (radix-tree) scorer against the plain right-padded forward.

Specification: :func:`score_replies` with ``share_prefixes=True`` returns the same log-probs,
logits and boundary hidden states as the padded forward, and a loss over them has the same
gradients (fp32, within 1e-5), on random batches whose sequences share prefixes in every way a
training batch does: siblings of a group (a common head), turns of one trajectory (one prompt
extends another), identical prompts with different replies, identical sequences, a sequence that
is a prefix of another, empty replies, constrained replies.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import random_llama

from factor_cli.policy.generation import score_replies
from factor_cli.policy.generation.shared_prefix import path, radix_tree, tree_size

VOCAB = 40


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return random_llama(VOCAB, 256)


def _batch(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts and replies that share prefixes the ways a training batch's do."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    system = toks(rng.randint(1, 6))
    prompts, replies = [], []
    for _ in range(rng.randint(1, 3)):  # groups: a task after the shared system text
        task = system + toks(rng.randint(0, 5))
        for _ in range(rng.randint(1, 3)):  # trajectories: history grows turn by turn
            history = list(task)
            for _ in range(rng.randint(1, 3)):
                prompt = history + toks(rng.randint(1, 4))
                reply = toks(rng.randint(0, 4))
                prompts.append(prompt)
                replies.append(reply)
                history = prompt + reply + toks(rng.randint(0, 3))
    if rng.random() < 0.5:  # the same prompt, another reply (a sibling's first turn)
        prompts.append(list(prompts[0]))
        replies.append(toks(rng.randint(1, 3)))
    if rng.random() < 0.5:  # the very same sequence twice
        prompts.append(list(prompts[-1]))
        replies.append(list(replies[-1]))
    replies[0] = replies[0] or toks(1)  # something to take a gradient of
    order = list(range(len(prompts)))
    rng.shuffle(order)
    return [prompts[i] for i in order], [replies[i] for i in order]


def _allowed(replies: list[list[int]], seed: int) -> list:
    rng = random.Random(seed + 1)
    out = []
    for r in replies:
        if rng.random() < 0.5:
            out.append(None)
        else:  # each position's allowed set holds its token and a few others
            out.append([sorted({t, *rng.sample(range(VOCAB), 3)}) for t in r])
    return out


def _loss(sc) -> torch.Tensor:
    total = sum((lp * (1 + 0.1 * torch.arange(len(lp)))).sum() for lp in sc.logprobs)
    if sc.logits is not None:
        total = total + sum((z.clamp_min(-50) ** 2).mean() for z in sc.logits if len(z))
    return total


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000), constrained=st.booleans(), temperature=st.sampled_from([1.0, 0.7])
)
def test_tree_scoring_equals_the_padded_forward(model, seed, constrained, temperature) -> None:
    prompts, replies = _batch(seed)
    allowed = _allowed(replies, seed) if constrained else None
    out = {}
    for share in (False, True):
        model.zero_grad()
        sc = score_replies(
            model, prompts, replies, temperature, pad_id=0, with_grad=True,
            return_hidden=True, return_logits=True, allowed=allowed, share_prefixes=share,
        )  # fmt: skip
        _loss(sc).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        out[share] = (sc, grads)
    (a, ga), (b, gb) = out[False], out[True]
    for x, y in zip(a.logprobs, b.logprobs):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    for x, y in zip(a.logits, b.logits):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.boundary_hidden, b.boundary_hidden, atol=1e-5, rtol=1e-5)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_tree_scoring_without_grad_and_without_replies(model) -> None:
    """The value head's boundary features: empty replies, hidden states only."""
    prompts, _ = _batch(3)
    empty = [[] for _ in prompts]
    a = score_replies(model, prompts, empty, return_hidden=True)
    b = score_replies(model, prompts, empty, return_hidden=True, share_prefixes=True)
    assert all(len(lp) == 0 for lp in b.logprobs) and not b.boundary_hidden.requires_grad
    torch.testing.assert_close(a.boundary_hidden, b.boundary_hidden, atol=1e-5, rtol=1e-5)


def test_an_empty_prompt_is_refused(model) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        score_replies(model, [[]], [[1]], share_prefixes=True)


def _slow_tree_size(seqs: list[list[int]]) -> int:
    """The oracle: distinct non-empty prefixes = nodes of the uncompressed trie."""
    return len({tuple(s[:n]) for s in seqs for n in range(1, len(s) + 1)})


@given(st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=12))
def test_radix_tree_spells_every_sequence_once(seqs) -> None:
    root = radix_tree(seqs)
    for s in seqs:
        edges = path(root, s)
        assert [t for e in edges for t in e.tokens] == list(s)
        assert all(e.depth == sum(len(f.tokens) for f in edges[:k]) for k, e in enumerate(edges))
    assert tree_size(seqs) == _slow_tree_size(seqs)


def test_the_tree_encodes_fewer_tokens_than_the_padded_batch() -> None:
    prompts, replies = _batch(7)
    seqs = [p + r for p, r in zip(prompts, replies)]
    assert tree_size(seqs) < sum(map(len, seqs)) <= len(seqs) * max(map(len, seqs))
