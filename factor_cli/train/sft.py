"""Supervised warm start on gold plays, so a tiny model emits valid actions before RL.

Each gold step becomes (student prompt x_t, reply ``<action>a_t</action>``); the loss is the
mean cross-entropy of the reply tokens. Gold plays come from the adapters' ``gold_actions`` on
the manifest's train instances (TextWorldExpress: the engine's gold path, or the project's
seeded search where the engine's is unseeded; ScienceWorld gold paths; ALFWorld walkthroughs or
expert plans). A plain torch Adam loop: the SFT model is saved and RL starts from it.

The warm start is a function of the config, byte for byte, for one torch build and CPU kind
(checked in separate fresh processes with different thread settings, ``tests/test_sft.py``):

- the games: ``cfg.sft.games`` draws by ``random.Random(cfg.seed)`` from the train instances;
- their plans: deterministic per instance, and each is played to a win before its steps are
  used (a play that does not win is an EnvError, never training data);
- the batch order: ``torch.randperm`` on a generator seeded with ``cfg.seed``; torch's global
  generator is seeded too (dropout, if a model has any);
- the arithmetic: on the CPU the loop runs on :data:`SFT_THREADS` intra-op threads whatever the
  machine has, because a float sum split over another number of threads rounds differently
  (measured: the smoke warm start on 1 and on 2 threads gave different weights);
- the record: ``warm_start.json`` in the model folder holds the SHA-256 of the examples
  (:func:`examples_digest`), of the base weights and of the warm-started weights; the training
  run carries the first and last as the ledger tags ``sft_data_sha256`` and
  ``start_weights_sha256`` (:func:`start_tags`).

Not covered: ScienceWorld's gold agents draw from the JVM's unseeded global generator (e.g. which
flower pot grow-plant uses) and from object ids that depend on what the process loaded before,
so its gold plays, and a warm start on them, can differ between processes (measured in pairs
of processes: grow-plant/L0/0 differed; with that generator seeded per instance, grow-plant/L1/3
still did; melt, boil, use-thermometer and find-living-thing never did); the recorded data
digest shows when they did. On CUDA, byte identity would also need torch's deterministic
algorithms (not checked here).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from factor_cli.envs import EnvError, Environment, make_env
from factor_cli.policy.generation import score_replies, truncate_middle
from factor_cli.policy.prompting import (
    ACTION_CLOSE,
    ACTION_OPEN,
    PromptFormat,
    TurnView,
    render,
    shown_admissible,
)

from .config import TrainConfig
from .data import instances
from .prompts import prompt_format

Example = tuple[list[int], list[int]]
"""(prompt token ids, reply token ids) of one gold step."""
WARM_START_FILE = "warm_start.json"
GOLD_VERSION = 4
"""Bumped when gold plays or their prompt layout change (2: deterministic TWX coin/twc plans;
4: prompts with (observation, action) history, the step counter and admissible actions), so a
warm start cached under the old data is not reused for a config that now means other data."""
GOLD_MAX_TURNS = 1000
"""Turn limit of the gold plays: a plan is played to its win, not cut at an RL horizon
(ScienceWorld's grow-fruit gold takes 63 actions; the adapters' default limit is 50)."""
TAG_DATA = "sft_data_sha256"
TAG_WEIGHTS = "start_weights_sha256"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
SFT_THREADS = 1
"""Intra-op threads of a CPU warm start (module docstring); on the 1M model one thread was as
fast as two (41 s vs 46 s for the smoke preset's 24 steps on a busy 2-core machine)."""


def gold_examples(
    cfg: TrainConfig,
    tokenizer: Any,
    fmt: PromptFormat,
    progress: Callable[[int, int], None] | None = None,
) -> list[Example]:
    """(prompt ids, reply ids) for every step of ``cfg.sft.games`` gold plays (module doc)."""
    pool = instances(cfg, "train")
    rng = random.Random(cfg.seed)
    chosen = [rng.choice(pool) for _ in range(cfg.sft.games)]
    budget = cfg.rollout.max_context - cfg.rollout.max_new_tokens
    out: list[Example] = []
    plans: dict[str, list[str]] = {}  # instances drawn twice are searched once
    with make_env(cfg.env.name, **{"max_turns": GOLD_MAX_TURNS, **cfg.env.options}) as env:
        for g, inst in enumerate(chosen):
            if inst.instance_id not in plans:
                plans[inst.instance_id] = env.gold_actions(inst.instance_id)
            out += _play_gold(env, inst.instance_id, plans[inst.instance_id], tokenizer, fmt,
                              budget, cfg.sft.teacher_examples)  # fmt: skip
            if progress:
                progress(g + 1, len(chosen))
    return out


def _play_gold(
    env: Environment,
    instance_id: str,
    gold: Sequence[str],
    tokenizer: Any,
    fmt: PromptFormat,
    budget: int,
    teacher: bool = False,
) -> list[Example]:
    """The examples of one gold play, which must win (EnvError naming the instance if not);
    with ``teacher``, each step's student example is followed by its teacher example."""
    out = play_examples(env, instance_id, gold, tokenizer, fmt, budget, True, teacher)
    if not env.success:
        raise EnvError(
            f"{env.spec.name}: the gold play of {instance_id} did not win ({len(env.actions)} "
            f"of {len(gold)} actions, score {env.score}); it is not used as training data"
        )
    return out


def play_examples(
    env: Environment,
    instance_id: str,
    actions: Sequence[str],
    tokenizer: Any,
    fmt: PromptFormat,
    budget: int,
    student: bool,
    teacher: bool,
) -> list[Example]:
    """Play ``actions`` from a reset of ``instance_id`` (until the episode ends) and make each
    step's examples, reply ``<action>a_t</action>``: with ``student`` the student's prompt x_t,
    then with ``teacher`` the teacher's (x_t with the step's feedback Phi_t), both rendered as
    :func:`factor_cli.rollout.teacher.teacher_prompt_texts` and the rollout render them."""
    obs = first = env.reset(instance_id)
    task = env.task_description()
    history: list[tuple[str, str]] = []
    out: list[Example] = []
    count = lambda a: len(tokenizer.encode(a, add_special_tokens=False))  # noqa: E731
    for action in actions:
        view = TurnView(
            task, history, obs, shown_admissible(fmt, env.valid_actions(), count), first
        )
        reply = tokenizer.encode(f"{ACTION_OPEN}{action}{ACTION_CLOSE}", add_special_tokens=False)
        feedback = env.step(action).observation
        texts = [render(fmt, view, tokenizer)] if student else []
        texts += [render(fmt, view, tokenizer, feedback=feedback)] if teacher else []
        for text in texts:
            prompt, _ = truncate_middle(tokenizer.encode(text, add_special_tokens=False), budget)
            out.append((prompt, reply))
        obs = feedback
        history.append((action, obs))
        if env.done:
            break
    return out


def random_walks(cfg: TrainConfig, env: Environment) -> list[tuple[str, list[str]]]:
    """``cfg.sft.hindsight_walks`` seeded walks (instance, actions) over train instances, each an
    admissible action drawn uniformly per turn until the episode ends or the turn limit."""
    pool = instances(cfg, "train")
    rng = random.Random(f"hindsight:{cfg.seed}")
    limit = int(cfg.env.max_turns or 0) or GOLD_MAX_TURNS
    walks = []
    for _ in range(cfg.sft.hindsight_walks):
        instance = rng.choice(pool).instance_id
        env.reset(instance)
        actions: list[str] = []
        while not env.done and len(actions) < limit:
            actions.append(rng.choice(sorted(env.valid_actions())))
            env.step(actions[-1])
        walks.append((instance, actions))
    return walks


def hindsight_examples(
    cfg: TrainConfig,
    tokenizer: Any,
    fmt: PromptFormat,
    progress: Callable[[int, int], None] | None = None,
) -> list[Example]:
    """Teacher-format examples only, of every step of :func:`random_walks`: the prompt the
    teacher's (the student's view with the action's own feedback Phi_t), the reply the walk's
    action. A walk is no lesson for the student (no student example is made), but it teaches
    the teacher to name any action from its feedback, not only the gold one."""
    budget = cfg.rollout.max_context - cfg.rollout.max_new_tokens
    out: list[Example] = []
    with make_env(cfg.env.name, **{"max_turns": GOLD_MAX_TURNS, **cfg.env.options}) as env:
        walks = random_walks(cfg, env)
        for w, (instance, actions) in enumerate(walks):
            out += play_examples(env, instance, actions, tokenizer, fmt, budget, False, True)
            if progress:
                progress(w + 1, len(walks))
    return out


LATER_FIELDS = ("teacher_examples", "hindsight_walks")
"""SFT fields added after warm starts were built: left out of the folder key while at their
defaults, so those warm starts keep their folders."""


def _unset_later_fields(cfg: TrainConfig) -> set[str]:
    defaults = type(cfg.sft)()
    return {f for f in LATER_FIELDS if getattr(cfg.sft, f) == getattr(defaults, f)}


def examples_digest(examples: Sequence[Example]) -> str:
    """SHA-256 of the examples' canonical JSON (``[[prompt ids, reply ids], ...]``, in order)."""
    canon = json.dumps([[list(p), list(r)] for p, r in examples], separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def supervised_finetune(
    model: torch.nn.Module,
    examples: list[Example],
    cfg: TrainConfig,
    pad_id: int,
    progress: Callable[[int, int, float], None] | None = None,
) -> list[float]:
    """Adam on the reply tokens' cross-entropy; returns the loss of every optimizer step.

    Deterministic for a given model, examples and config (module docstring).
    """
    on_cpu = next(model.parameters()).device.type == "cpu"
    with fixed_threads(SFT_THREADS) if on_cpu else nullcontext():
        return _finetune(model, examples, cfg, pad_id, progress)


@contextmanager
def fixed_threads(n: int) -> Iterator[None]:
    """Run a block on ``n`` torch intra-op threads, restoring the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _finetune(
    model: torch.nn.Module,
    examples: list[Example],
    cfg: TrainConfig,
    pad_id: int,
    progress: Callable[[int, int, float], None] | None,
) -> list[float]:
    torch.manual_seed(cfg.seed)  # the global generator: dropout, if the model has any
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.sft.lr)
    model.train()
    losses: list[float] = []
    total = cfg.sft.epochs * -(-len(examples) // cfg.sft.batch_size)
    for _ in range(cfg.sft.epochs):
        order = torch.randperm(len(examples), generator=gen).tolist()
        for lo in range(0, len(order), cfg.sft.batch_size):
            batch = [examples[i] for i in order[lo : lo + cfg.sft.batch_size]]
            sc = score_replies(
                model, [p for p, _ in batch], [r for _, r in batch], 1.0, pad_id, with_grad=True
            )
            loss = -torch.cat(sc.logprobs).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            if progress:
                progress(len(losses), total, losses[-1])
    model.eval()
    return losses


def sft_output_dir(cfg: TrainConfig) -> Path:
    """Where the warm-started model of this config lives (reused by later runs)."""
    key = json.dumps(
        [
            cfg.model.path,
            cfg.env.model_dump(),
            cfg.sft.model_dump(exclude=_unset_later_fields(cfg)),
            cfg.seed,
            dataclasses.asdict(prompt_format(cfg)),
            f"gold-v{GOLD_VERSION}",
        ],
        sort_keys=True,
    )
    return Path(f"{cfg.model.path.rstrip('/')}-sft-{hashlib.sha256(key.encode()).hexdigest()[:8]}")


def weights_sha256(model_dir: Path | str) -> str:
    """SHA-256 of a model folder's weights: of the file itself when there is one weights file
    (``sha256sum model.safetensors`` gives the same), else of the ``sha256sum``-style lines
    ``<digest>  <name>`` of every weights file, sorted by name.

    Raises FileNotFoundError when the folder holds no weights file.
    """
    folder = Path(model_dir)
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{folder}: no weights file (*.safetensors, *.bin)")
    digests = [(_file_sha256(f), f.name) for f in files]
    if len(digests) == 1:
        return digests[0][0]
    lines = "".join(f"{d}  {name}\n" for d, name in digests)
    return hashlib.sha256(lines.encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_warm_start_record(
    model_dir: Path,
    base: str,
    examples: Sequence[Example],
    losses: Sequence[float],
    cfg: TrainConfig,
    seconds: float,
) -> dict[str, Any]:
    """Write and return ``warm_start.json`` of the SFT model saved in ``model_dir``.

    Digests: ``sft_data_sha256`` (:func:`examples_digest`), ``base_weights_sha256`` (of the
    model the SFT started from; None for a hub id) and ``weights_sha256`` (of ``model_dir``).
    The torch version is kept beside them: byte identity holds for one torch build.
    """
    record = {
        "base": base,
        "base_weights_sha256": weights_sha256(base) if Path(base).is_dir() else None,
        TAG_DATA: examples_digest(examples),
        "weights_sha256": weights_sha256(model_dir),
        "examples": len(examples),
        "games": cfg.sft.games,
        "optimizer_steps": len(losses),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "seconds": round(seconds, 3),
        "torch": torch.__version__,
        "device": cfg.model.device,
        "cpu_threads": SFT_THREADS,
    }
    (model_dir / WARM_START_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def start_tags(cfg: TrainConfig, model_path: str) -> dict[str, str]:
    """Ledger tags naming what a training run starts from (module docstring).

    ``start_weights_sha256``: :func:`weights_sha256` of ``model_path`` when it is a local
    folder (a hub id is named instead); ``sft_data_sha256``: the examples' digest from the
    folder's ``warm_start.json``, ``none`` without a warm start, ``unknown`` for a warm start
    built before the record existed.
    """
    folder = Path(model_path)
    weights = weights_sha256(folder) if folder.is_dir() else f"unknown (hub id {model_path})"
    if not cfg.sft.enabled:
        data = "none"
    else:
        record = folder / WARM_START_FILE
        data = json.loads(record.read_text())[TAG_DATA] if record.is_file() else "unknown"
    return {TAG_WEIGHTS: weights, TAG_DATA: data}
