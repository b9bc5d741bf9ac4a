"""Policy models: the tiny model's save/reload round trip, presets, tokenizer, load_policy errors,
and the `factor model` CLI. Everything is built in tmp dirs from environment text; no downloads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from factor_cli.cli.main import app
from factor_cli.envs import availability
from factor_cli.policy.model import (
    ACTION_TOKENS,
    METADATA_FILE,
    _looks_like_path,
    build_tiny_model,
    chars_per_token,
    corpus_digest,
    init_tiny,
    load_policy,
    read_metadata,
    train_tokenizer,
)
from factor_cli.policy.presets import TINY_PRESETS

twx_missing = availability("twx")
pytestmark = pytest.mark.skipif(
    twx_missing is not None, reason=f"the tokenizer corpus needs twx: {twx_missing}"
)
runner = CliRunner()
SAMPLE = "I should cook it.\n<action>cook red potato in stove</action>"


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    from factor_cli.policy.corpus import environment_corpus

    return environment_corpus(max_games=12, seed=0, scienceworld_games=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny") / "model", "1m", corpus, seed=0)


def test_corpus_is_environment_text(corpus: list[str]) -> None:
    twx = [t for t in corpus if "find the coin" in t or "cookbook" in t]
    assert len(twx) == 12  # the 12 TWX gold plays, plus ScienceWorld descriptions if available
    assert all(t.startswith("Task: ") for t in corpus)
    assert any("\n> take coin\n" in t for t in twx) and any("\n> eat meal\n" in t for t in twx)


def test_twx_corpus_is_reproducible_and_coin_walks_win() -> None:
    import random

    from factor_cli.envs import make_env
    from factor_cli.policy.corpus import TWX_SETTINGS, coin_walk, twx_texts

    with make_env("twx", params={"coin": TWX_SETTINGS[2][1]}) as env:  # 6 locations
        # (the open adapter also keeps the shared JVM running between the two corpus builds)
        assert twx_texts(8, random.Random(1)) == twx_texts(8, random.Random(1))
        for seed in range(5):
            text = coin_walk(env, f"coin/{seed}")
            assert env.success and text.endswith("> take coin\nYou take the coin.")


def test_reload_gives_same_tokenizer_and_logits(tiny_dir: Path, corpus: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fresh_tok = train_tokenizer(corpus)  # deterministic: same corpus -> same tokenizer
    fresh = build_tiny_model("1m", fresh_tok, seed=0)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    assert len(tok) == len(fresh_tok) == model.config.vocab_size
    assert tok.all_special_tokens == fresh_tok.all_special_tokens
    for text in corpus[:20]:
        assert tok.encode(text, add_special_tokens=False) == fresh_tok.encode(
            text, add_special_tokens=False
        )
    ids = torch.tensor([tok.encode(corpus[0][:300], add_special_tokens=False)])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, fresh(ids).logits)


def test_tokenizer_round_trip_on_environment_text(tiny_dir: Path, corpus: list[str]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for text in [*corpus, SAMPLE, "café, naïve: 日本 \t tabs\n\n"]:
        ids = tok.encode(text, add_special_tokens=False, verbose=False)
        assert tok.decode(ids) == text
    # Trained on this text, BPE must compress it well beyond bytes (docs/design.md section 8:
    # ~4 chars/token).
    assert chars_per_token(tok, corpus) > 3.0


def test_action_tags_are_single_text_tokens(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tag_ids = [tok.encode(t, add_special_tokens=False) for t in ACTION_TOKENS]
    assert all(len(ids) == 1 for ids in tag_ids)
    ids = tok.encode(SAMPLE, add_special_tokens=False)
    assert tag_ids[0][0] in ids and ids[-1] == tag_ids[1][0]
    assert tok.decode(ids, skip_special_tokens=True) == SAMPLE  # tags are not special


def test_chat_template_renders_and_replies_retokenize(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    msgs = [{"role": "system", "content": "Act."}, {"role": "user", "content": "Task: coin"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|bos|><|system|>\nAct.<|eos|><|user|>\nTask: coin<|eos|><|assistant|>\n"
    prompt = tok.encode(text, add_special_tokens=False)
    assert prompt[0] == tok.bos_token_id and prompt.count(tok.eos_token_id) == 2
    for reply in ("<action>take coin</action>", "go east <action>move east</action>"):
        generated = [*tok.encode(reply, add_special_tokens=False), tok.eos_token_id]
        rerendered = tok.apply_chat_template(
            [*msgs, {"role": "assistant", "content": reply}], tokenize=False
        )
        assert tok.encode(rerendered, add_special_tokens=False) == prompt + generated
    assert tok.decode(prompt, skip_special_tokens=True) == "\nAct.\nTask: coin\n"
    with pytest.raises(Exception, match="unknown role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


@pytest.mark.parametrize("name", sorted(TINY_PRESETS))
def test_preset_parameter_counts(name: str, corpus: list[str]) -> None:
    tok = train_tokenizer(corpus)
    model = build_tiny_model(name, tok, seed=0)
    preset = TINY_PRESETS[name]
    assert model.num_parameters() == preset.num_parameters(len(tok))
    assert model.config.max_position_embeddings >= 2048
    assert model.config.model_type == "llama"
    low, high = {"1m": (0.9e6, 1.2e6), "5m": (4.5e6, 5.6e6)}[name]
    assert low <= model.num_parameters() <= high


def test_init_is_seeded_and_leaves_global_rng_alone(corpus: list[str]) -> None:
    tok = train_tokenizer(corpus[:4])
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = (build_tiny_model("1m", tok, seed=s) for s in (0, 0, 1))
    assert torch.equal(torch.rand(3), expected_next)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_init_tiny_refuses_existing_dir_and_overwrites_with_force(
    tmp_path: Path, corpus: list[str]
) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="--force"):
        init_tiny(out, "1m", corpus[:4])
    assert (out / "keep.txt").exists()
    init_tiny(out, "1m", corpus[:4], seed=3, overwrite=True)
    assert not (out / "keep.txt").exists()
    meta = read_metadata(out)
    assert meta is not None and meta["seed"] == 3 and meta["corpus_texts"] == 4
    assert meta["corpus_sha256"] == corpus_digest(corpus[:4])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp dirs left


def test_init_tiny_crash_leaves_no_half_written_dir(
    tmp_path: Path, corpus: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import PreTrainedTokenizerFast

    def boom(self: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        init_tiny(tmp_path / "m", "1m", corpus[:4])
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old"
    old.mkdir()
    (old / "keep.txt").write_text("x")
    with pytest.raises(RuntimeError, match="disk full"):
        init_tiny(old, "1m", corpus[:4], overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["old"] and (old / "keep.txt").exists()


def test_load_policy(tiny_dir: Path) -> None:
    policy = load_policy(str(tiny_dir))
    assert policy.tokenizer.padding_side == "left"
    assert policy.tokenizer.pad_token_id is not None
    assert policy.model.generation_config.pad_token_id == policy.tokenizer.pad_token_id
    assert policy.hidden_size == 128 and policy.dtype == torch.float32
    assert not policy.model.training
    batch = policy.tokenizer(
        ["> take coin", "You are in the kitchen."], return_tensors="pt", padding=True
    )
    assert batch["attention_mask"][0, 0] == 0  # the shorter row is padded on the left
    assert load_policy(str(tiny_dir), dtype="bfloat16").dtype == torch.bfloat16


def test_dtype_names_have_one_home() -> None:
    """The config's ``model.dtype`` choices, the loader and the vLLM backend share one list."""
    import subprocess
    import sys
    from typing import get_args

    from factor_cli.policy.dtypes import AUTO, DTYPE_NAMES, dtype_name, load_dtype, torch_dtype
    from factor_cli.train.config import ModelConfig

    assert get_args(ModelConfig.model_fields["dtype"].annotation) == DTYPE_NAMES
    assert DTYPE_NAMES == ("float32", "bfloat16", "float16")
    for name in DTYPE_NAMES:
        assert torch_dtype(name) is getattr(torch, name) and dtype_name(torch_dtype(name)) == name
        assert load_dtype(name) is torch_dtype(name)
    assert load_dtype(AUTO) == "auto"
    with pytest.raises(ValueError, match="dtype 'auto' is not supported; use one of float32"):
        torch_dtype("auto")
    with pytest.raises(ValueError, match=r"dtype torch\.int8 is not supported"):
        dtype_name(torch.int8)
    code = "import sys, factor_cli.policy.dtypes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_load_policy_errors(tmp_path: Path, tiny_dir: Path, corpus: list[str]) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=r"nope: no such model directory.*init-tiny"):
        load_policy(str(missing))
    a_file = tmp_path / "weights.bin"
    a_file.write_text("")
    with pytest.raises(FileNotFoundError, match="is a file"):
        load_policy(str(a_file))
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        load_policy(str(tmp_path))
    with pytest.raises(ValueError, match="dtype 'fp8' is not supported; use one of float32"):
        load_policy(str(tiny_dir), dtype="fp8")
    with pytest.raises(ValueError, match="not a torch device"):
        load_policy(str(tiny_dir), device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_policy(str(tiny_dir), device="cuda")
    no_tok = tmp_path / "no_tok"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_dir / name, no_tok / name)
    with pytest.raises(FileNotFoundError, match="no loadable tokenizer"):
        load_policy(str(no_tok))
    wrong_tok = tmp_path / "wrong_tok"
    shutil.copytree(tiny_dir, wrong_tok)
    train_tokenizer(corpus, vocab_size=900).save_pretrained(wrong_tok)
    with pytest.raises(ValueError, match="902 tokens but the model's embedding has 770 rows"):
        load_policy(str(wrong_tok))


@pytest.mark.parametrize(
    ("arg", "is_path"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", False),
        ("gpt2", False),
        ("./gpt2", True),
        ("/m", True),
        ("runs/a/model", True),
        ("~/m", True),
        ("models/", True),
    ],
)
def test_local_paths_are_told_from_hub_ids(arg: str, is_path: bool) -> None:
    assert _looks_like_path(arg) is is_path


def test_cli_init_tiny_and_info(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    res = runner.invoke(app, ["model", "init-tiny", "--out", str(out), "--max-games", "4"])
    assert res.exit_code == 0, res.output
    assert (out / METADATA_FILE).is_file() and "saved" in res.output
    again = runner.invoke(app, ["model", "init-tiny", "--out", str(out), "--max-games", "4"])
    assert again.exit_code == 1 and "already exists; pass --force" in again.output
    bad = runner.invoke(app, ["model", "init-tiny", "--out", str(tmp_path / "x"), "-p", "7b"])
    assert bad.exit_code == 1 and "unknown tiny preset '7b'; valid: 1m, 5m" in bad.output
    info = runner.invoke(app, ["model", "info", str(out), "--json"])
    assert info.exit_code == 0, info.output
    summary = json.loads(info.stdout.strip().splitlines()[-1])
    meta = json.loads((out / METADATA_FILE).read_text())
    assert (
        summary["parameters"]
        == meta["num_parameters"]
        == TINY_PRESETS["1m"].num_parameters(meta["vocab_size"])
    )
    assert summary["round_trip_ok"] and summary["action_tags_single_token"]
    assert summary["tokenizer_size"] == summary["embedding_rows"] == meta["vocab_size"]
    missing = runner.invoke(app, ["model", "info", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no such model directory" in missing.output
