"""Policy models: load any Hugging Face causal LM, or build a tiny local one.

:func:`load_policy` loads a causal LM and its tokenizer by local path or hub id, with the
tokenizer set up for batched generation (left padding, a pad token guaranteed).

:func:`init_tiny` builds the CPU stand-in used by tests and smoke runs: a Llama-architecture
model from :data:`TINY_PRESETS` with random weights (seeded) and a byte-level BPE tokenizer
trained on environment text (:func:`train_tokenizer`), saved with ``save_pretrained`` so both
reload with ``AutoModelForCausalLM`` / ``AutoTokenizer``.

Tiny tokenizer conventions:

- special tokens ``<|bos|>``, ``<|eos|>``, ``<|pad|>`` and the role markers ``<|system|>``,
  ``<|user|>``, ``<|assistant|>`` (special: ``decode(..., skip_special_tokens=True)`` drops them);
- ``<action>`` and ``</action>`` are single, non-special added tokens, so they decode as text;
- plain encoding adds nothing (no bos): ``decode(encode(s)) == s`` for any string ``s``;
- the chat template renders ``<|bos|>`` once, then each message as ``<|role|>\\n{content}<|eos|>``
  with no separator, and the generation prompt as ``<|assistant|>\\n``; a reply generated up to
  and including ``<|eos|>`` re-renders token for token in the next turn's context.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from .dtypes import load_dtype
from .presets import TinyPreset, get_preset
from .presets import looks_like_path as _looks_like_path
from .prompting import ACTION_CLOSE, ACTION_OPEN

if TYPE_CHECKING:  # importing transformers' model classes takes ~10 s: done where they are used
    from transformers import (
        LlamaForCausalLM,
        PreTrainedModel,
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
    )

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = tuple(f"<|{r}|>" for r in ROLES)
ACTION_TOKENS = (ACTION_OPEN, ACTION_CLOSE)
DEFAULT_VOCAB_SIZE = 768
"""BPE vocabulary incl. bytes and specials (docs/design.md section 8: ~4 chars per token)."""
METADATA_FILE = "factor_tiny.json"
"""Written beside the weights by :func:`init_tiny`: preset, seed, parameter count, corpus size
and SHA-256, chars/token on the corpus, and build_seconds (tokenizer + model + save, plus the
corpus when init_tiny built it itself)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role'] + '; use system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# -- tiny presets: factor_cli/policy/presets.py (torch-free, read by config validation) -------


# -- tokenizer ---------------------------------------------------------------------------------
def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    extra_tokens: Sequence[str] = ACTION_TOKENS,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for the same texts).

    ``vocab_size`` counts the 256 byte symbols, the special tokens and the merges; each of
    ``extra_tokens`` is then added as one non-special token, so ``len(tokenizer)`` is
    ``vocab_size + len(extra_tokens)``. The chat template is :data:`CHAT_TEMPLATE`.
    """
    from transformers import PreTrainedTokenizerFast

    specials = [BOS, EOS, PAD, *ROLE_TOKENS]
    minimum = 256 + len(specials)
    if vocab_size <= minimum:
        raise ValueError(
            f"vocab_size {vocab_size} leaves no merges: byte-level BPE needs > {minimum} "
            f"(256 bytes + {len(specials)} special tokens)"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # exact offset mappings
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_tokens])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATE
    for t in extra_tokens:
        if len(hf.encode(t, add_special_tokens=False)) != 1:  # guards a tokenizers regression
            raise RuntimeError(f"extra token {t!r} does not encode to a single token")
    return hf


def chars_per_token(tokenizer: PreTrainedTokenizerBase, texts: Iterable[str]) -> float:
    """sum_s len(s) / sum_s len(encode(s)) over ``texts`` (no special tokens added)."""
    chars = tokens = 0
    for s in texts:
        chars += len(s)
        tokens += len(tokenizer.encode(s, add_special_tokens=False, verbose=False))
    if tokens == 0:
        raise ValueError("chars_per_token needs at least one non-empty text")
    return chars / tokens


def corpus_digest(texts: Sequence[str]) -> str:
    """SHA-256 of the texts joined by NUL: equal digests mean the same tokenizer."""
    return hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()


# -- building and saving -----------------------------------------------------------------------
@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Hide transformers' per-call progress bars (weight loading / shard writing) for a block."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def build_tiny_model(
    preset: TinyPreset | str, tokenizer: PreTrainedTokenizerBase, seed: int = 0
) -> LlamaForCausalLM:
    """A randomly initialised LlamaForCausalLM for ``tokenizer``; weights depend only on ``seed``
    (torch's global RNG is forked, so the caller's random state is left as it was)."""
    from transformers import LlamaForCausalLM

    spec = get_preset(preset) if isinstance(preset, str) else preset
    config = spec.config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def init_tiny(
    out_dir: Path,
    preset: str = "1m",
    texts: Iterable[str] | None = None,
    seed: int = 0,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    overwrite: bool = False,
) -> Path:
    """Train the tokenizer, build the preset's model and save both to ``out_dir``.

    ``texts`` defaults to :func:`factor_cli.policy.corpus.environment_corpus` (seed 0, so every
    model seed shares one tokenizer). Everything is written to a temporary sibling directory
    that is renamed into place at the end: a crash never leaves a half-written model directory.
    An existing ``out_dir`` raises FileExistsError unless ``overwrite``. Returns ``out_dir``.
    """
    spec = get_preset(preset)
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists; pass --force (overwrite=True) to replace it"
        )
    t0 = time.perf_counter()
    if texts is None:
        from .corpus import environment_corpus

        texts = environment_corpus()
    corpus = [t for t in texts if t]
    if not corpus:
        raise ValueError("init_tiny needs a non-empty text corpus to train the tokenizer")
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size)
    tokenizer.model_max_length = spec.max_position_embeddings
    model = build_tiny_model(spec, tokenizer, seed)
    metadata = {
        "preset": preset,
        "seed": seed,
        "num_parameters": model.num_parameters(),
        "vocab_size": len(tokenizer),
        "corpus_texts": len(corpus),
        "corpus_chars": sum(len(t) for t in corpus),
        "corpus_sha256": corpus_digest(corpus),
        "chars_per_token": round(chars_per_token(tokenizer, corpus), 4),
        "build_seconds": None,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with _quiet_transformers():
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        metadata["build_seconds"] = round(time.perf_counter() - t0, 3)
        (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        _move_into_place(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``; an existing ``out_dir`` is moved aside first and deleted
    only once the new one is in place."""
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()


def read_metadata(path: Path | str) -> dict[str, Any] | None:
    """The :data:`METADATA_FILE` of a model directory built by :func:`init_tiny`, else None."""
    f = Path(path).expanduser() / METADATA_FILE
    return json.loads(f.read_text()) if f.is_file() else None


# -- loading -----------------------------------------------------------------------------------
@dataclass
class Policy:
    """A causal LM and its tokenizer (left padding, pad token set)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def hidden_size(self) -> int:
        """H: width of the last hidden state (the value head's input)."""
        return int(text_config(self.model.config).hidden_size)


def text_config(config: Any) -> Any:
    """The language model's part of an hf config (a multimodal one nests it)."""
    text = getattr(config, "get_text_config", None)
    return text() if text else config


def _resolve_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device {device!r} is not a torch device; use cpu, cuda or cuda:N"
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available here; use cpu")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available here; use cpu")
    return dev


def _dtype_kwargs(dtype: torch.dtype | str) -> dict[str, Any]:
    # transformers >= 4.56 calls it `dtype`; older releases ignore that key silently.
    major, minor = (int(x) for x in version("transformers").split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_policy(path_or_id: str, dtype: str = "float32", device: str = "cpu") -> Policy:
    """Load a causal LM and its tokenizer from a local directory or a Hugging Face hub id.

    The tokenizer pads on the left (batched generation) and always has a pad token (its own,
    else eos). Problems raise one-line errors naming the path and the fix: FileNotFoundError for
    a missing directory, model or tokenizer files; ValueError for a bad dtype or device, a
    checkpoint that is not a causal LM, or a tokenizer that does not fit the model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = load_dtype(dtype)
    dev = _resolve_device(device)
    local = Path(path_or_id).expanduser()
    if local.exists():
        if not local.is_dir():
            raise FileNotFoundError(f"{local} is a file; pass the model directory that holds it")
        if not (local / "config.json").is_file():
            raise FileNotFoundError(
                f"{local} has no config.json, so it is not a Hugging Face model directory; "
                f"build one with `factor model init-tiny --out {local}`"
            )
        source = str(local)
    elif _looks_like_path(path_or_id):
        raise FileNotFoundError(
            f"{path_or_id}: no such model directory; build one with "
            f"`factor model init-tiny --out {path_or_id}` or pass a hub id (org/name)"
        )
    else:
        source = path_or_id
    where = "directory" if local.exists() else "hub id"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"{source}: no loadable tokenizer in this {where} ({_first_line(exc)}); "
            "save the tokenizer beside the model (tokenizer.save_pretrained)"
        ) from exc
    try:
        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(source, **_dtype_kwargs(torch_dtype))
    except ValueError as exc:
        raise ValueError(
            f"{source}: not a causal language model ({_first_line(exc)}); "
            "pass a checkpoint with a *ForCausalLM architecture"
        ) from exc
    except OSError as exc:
        raise FileNotFoundError(
            f"{source}: could not load the model weights from this {where} ({_first_line(exc)}); "
            "check the path or hub id (and HF_HUB_OFFLINE / network for hub ids)"
        ) from exc
    except Exception as exc:
        # safetensors reports a truncated or corrupt file with its own error type.
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ValueError(
            f"{source}: the weights file is damaged ({_first_line(exc)}); it was probably cut "
            "short by an interrupted copy or save: copy it again or rebuild the model"
        ) from exc
    _check_tokenizer_fits(source, tokenizer, model)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"{source}: the tokenizer has neither a pad nor an eos token; "
                "set tokenizer.pad_token and save it"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Policy(model=model.to(dev).eval(), tokenizer=tokenizer)


def _check_tokenizer_fits(
    source: str, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel
) -> None:
    """Catch the silent failure where a wrong tokenizer class reloads as an empty tokenizer."""
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) == 0 or not tokenizer.encode("a b", add_special_tokens=False):
        raise ValueError(
            f"{source}: the tokenizer reloaded empty (class {type(tokenizer).__name__}); "
            "re-save it with the tokenizer that built the model"
        )
    if len(tokenizer) > rows:
        raise ValueError(
            f"{source}: the tokenizer has {len(tokenizer)} tokens but the model's embedding has "
            f"{rows} rows; the tokenizer belongs to a different model"
        )
