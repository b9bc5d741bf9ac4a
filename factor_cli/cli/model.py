"""`factor model ...`: build the tiny local model, inspect a model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from factor_cli.envs import EnvError
from factor_cli.policy.presets import TINY_PRESETS, get_preset

from .common import console, fail

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Models: build a tiny local model, inspect one.",
    no_args_is_help=True,
)

ROUND_TRIP_TEXT = (
    "Task: cook a meal.\nYou are in the kitchen. You see a fridge that is closed.\n"
    "> open fridge\nI think the fridge holds it. <action>take red potato</action>\t(café, 100%)"
)
"""Environment-like text with tags, tabs, newlines and a non-ASCII character."""


@app.command("init-tiny")
def init_tiny_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Directory to create (must not exist)."),
    preset: str = typer.Option(
        "1m", "--preset", "-p", help=f"Model size: {', '.join(TINY_PRESETS)}."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weight initialisation."),
    max_games: int = typer.Option(
        200, "--max-games", help="TextWorldExpress gold plays in the tokenizer corpus."
    ),
    scienceworld_games: int = typer.Option(
        0,
        "--scienceworld-games",
        help="ScienceWorld gold plays added to the corpus (their text varies between runs).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists."),
) -> None:
    """Build a tiny Llama model and a BPE tokenizer trained on environment text; save to OUT.

    Byte-level BPE on gold plays and task descriptions; reloads with the Auto classes.
    """
    from factor_cli.policy.corpus import environment_corpus
    from factor_cli.policy.model import init_tiny

    try:
        get_preset(preset)
    except ValueError as exc:
        fail(str(exc))
    if out.exists() and not force:
        fail(f"{out} already exists; pass --force to replace it")
    t0 = time.perf_counter()
    try:
        with console.status("building the tokenizer corpus from environment gold plays..."):
            texts = environment_corpus(max_games, scienceworld_games=scienceworld_games)
        console.print(
            f"corpus: {len(texts)} episodes, {sum(map(len, texts)):,} characters "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        with console.status(f"training the tokenizer, building the {preset} model, saving..."):
            init_tiny(out, preset, texts, seed, overwrite=force)
    except (EnvError, ValueError, OSError) as exc:
        fail(str(exc))
    console.print(f"[green]saved[/] {escape(str(out))} ({time.perf_counter() - t0:.1f} s)")
    _print_summary(_describe(str(out)))


@app.command("info")
def info_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="Model directory or hub id."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Parameter count, vocabulary, config summary and a tokenizer round-trip check.

    Exits 1 if the tokenizer does not reproduce the check text exactly.
    """
    try:
        summary = _describe(path)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_summary(summary)
    if not summary["round_trip_ok"]:
        fail("tokenizer round trip failed: decode(encode(text)) differs from the text")


def _describe(path: str) -> dict[str, Any]:
    """Load the model (quietly) and collect what `info` shows."""
    from factor_cli.policy.model import ACTION_TOKENS, load_policy, read_metadata

    with console.status(f"loading {path}..."):
        policy = load_policy(path)
    model, tok = policy.model, policy.tokenizer
    cfg = model.config
    ids = tok.encode(ROUND_TRIP_TEXT, add_special_tokens=False)
    meta = read_metadata(path) if Path(path).expanduser().is_dir() else None
    return {
        "path": path,
        "architecture": (cfg.architectures or [type(model).__name__])[0],
        "model_type": cfg.model_type,
        "parameters": model.num_parameters(),
        "hidden_size": policy.hidden_size,
        "layers": getattr(cfg, "num_hidden_layers", None),
        "heads": getattr(cfg, "num_attention_heads", None),
        "intermediate_size": getattr(cfg, "intermediate_size", None),
        "max_positions": getattr(cfg, "max_position_embeddings", None),
        "dtype": str(policy.dtype).removeprefix("torch."),
        "embedding_rows": model.get_input_embeddings().weight.shape[0],
        "tokenizer_size": len(tok),
        "tokenizer_class": type(tok).__name__,
        "special_tokens": {k: getattr(tok, k) for k in ("bos_token", "eos_token", "pad_token")},
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "action_tags_single_token": all(
            len(tok.encode(t, add_special_tokens=False)) == 1 for t in ACTION_TOKENS
        ),
        "round_trip_tokens": len(ids),
        "round_trip_chars_per_token": round(len(ROUND_TRIP_TEXT) / max(len(ids), 1), 3),
        "round_trip_ok": tok.decode(ids) == ROUND_TRIP_TEXT,
        "tiny": meta,
    }


def _print_summary(s: dict[str, Any]) -> None:
    table = Table(title=escape(f"model {s['path']}"), show_header=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value")
    shape = (
        f"hidden {s['hidden_size']}, layers {s['layers']}, heads {s['heads']}, "
        f"MLP {s['intermediate_size']}, positions {s['max_positions']}"
    )
    specials = ", ".join(f"{k.removesuffix('_token')}={v}" for k, v in s["special_tokens"].items())
    ok = "[green]ok[/]" if s["round_trip_ok"] else "[red]FAILED[/]"
    rows = [
        ("architecture", f"{s['architecture']} ({s['model_type']}), {s['dtype']}"),
        ("parameters", f"{s['parameters']:,}"),
        ("shape", shape),
        ("vocabulary", f"tokenizer {s['tokenizer_size']}, embedding rows {s['embedding_rows']}"),
        ("tokenizer", escape(f"{s['tokenizer_class']}; {specials}")),
        ("chat template", "yes" if s["chat_template"] else "no"),
        ("<action> single token", "yes" if s["action_tags_single_token"] else "no"),
        (
            "round trip",
            f"{ok} ({s['round_trip_tokens']} tokens, "
            f"{s['round_trip_chars_per_token']} chars/token)",
        ),
    ]
    if s["tiny"]:
        t = s["tiny"]
        rows.append(
            (
                "tiny build",
                f"preset {t['preset']}, seed {t['seed']}, corpus {t['corpus_texts']} texts / "
                f"{t['corpus_chars']:,} chars (sha256 {t.get('corpus_sha256', '?')[:12]}), "
                f"{t['chars_per_token']} chars/token",
            )
        )
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)


@app.command("teacher-gap")
def teacher_gap_cmd(
    config: str = typer.Option("smoke", "--config", "-c", help="Preset (smoke, paper) or YAML."),
    overrides: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="Model directory (default: the config's warm start)."
    ),
    plays: int = typer.Option(
        32, "--plays", min=1, help="Eval instances (one gold, one sampled play each)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the instances, the plays and the shuffle."),
    out: Path | None = typer.Option(None, "--out", help="Also write the per-action rows (CSV)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Does the hindsight teacher read what the feedback says? Measured before any RL.

    On held-out eval instances (the gold plan replayed, and one play sampled by the model), each
    action's log-likelihood gain from putting feedback in the prompt,
    g = log pi_T(a | x, Phi) - log pi(a | x), with the true Phi, another action's (shuffled) and
    an empty block. A teacher that reads the feedback has true - shuffled > 0 (95% interval over
    plays); if it sits at 0, HTA's and SERL's token weights carry no information and a study of
    them spends its hours on noise. Seconds on the smoke preset. Without --checkpoint the
    config's warm start is used (built first if it is missing, as `factor train` would).
    """
    from .train import _Bars, _load, _plain, _progress

    cfg = _load(config, overrides)
    if checkpoint is not None and not (checkpoint / "config.json").exists():
        fail(f"--checkpoint {checkpoint}: no model there (config.json missing)")
    try:
        rows = _gap_rows(cfg, checkpoint, plays, seed, _Bars, _plain, _progress)
    except (ValueError, OSError, EnvError) as exc:
        fail(str(exc).splitlines()[0])
    from factor_cli.stats.diagnose import teacher_gap

    table = teacher_gap(rows, seed=seed)
    if out is not None:
        from factor_cli.atomic import atomic_target

        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(out) as tmp:
            rows.to_csv(tmp, index=False)
    if as_json:
        typer.echo(json.dumps({"table": table.to_dict(orient="records"),
                               "dropped": rows.attrs.get("dropped", 0)}))  # fmt: skip
        return
    _print_gap(table, rows.attrs.get("dropped", 0))


def _gap_rows(cfg: Any, checkpoint: Path | None, plays: int, seed: int, bars: Any, plain: Any,
              progress: Any) -> Any:  # fmt: skip
    """The per-action gains of the model (the config's warm start without ``checkpoint``)."""
    from factor_cli.diagnostics.teacher_gap import GapPlan, teacher_gap_rows
    from factor_cli.policy.model import load_policy
    from factor_cli.train.run import warm_start

    with progress() as bar:
        path = str(checkpoint) if checkpoint else warm_start(cfg, bars(bar), plain)
        policy = load_policy(path, cfg.model.dtype, cfg.model.device)
        task = bar.add_task("teacher gap", total=None)
        return teacher_gap_rows(cfg, policy, GapPlan(plays, seed),
                                lambda label: bar.update(task, description=label))  # fmt: skip


def _print_gap(table: Any, dropped: int) -> None:
    """The gap table, one row per measure: the mean gain under each condition and the two
    contrasts with their 95% intervals over plays."""
    out = Table(title="teacher-student gap: log-likelihood gain of the realised action",
                title_justify="left")  # fmt: skip
    for col in ("plays", "measure", "mean", "95% CI"):
        out.add_column(col, justify="left" if col in ("plays", "measure") else "right")
    for r in table.itertuples(index=False):
        ci = lambda lo, hi: f"[{lo:+.3f}, {hi:+.3f}]"  # noqa: E731
        rows = [
            (f"{r.source} ({r.plays} plays, {r.actions} actions)", "gain, true feedback",
             f"{r.gain_true:+.3f}", ""),
            ("", "gain, shuffled", f"{r.gain_shuffled:+.3f}", ""),
            ("", "gain, none", f"{r.gain_none:+.3f}", ""),
            ("", "true - shuffled", f"{r.true_minus_shuffled:+.3f}", ci(r.ci_low, r.ci_high)),
            ("", "true - none", f"{r.true_minus_none:+.3f}", ci(r.none_ci_low, r.none_ci_high)),
            ("", "share true > shuffled", f"{r.share_true_above:.2f}", ""),
            ("", "plays won", f"{r.success:.2f}", ""),
        ]  # fmt: skip
        for i, row in enumerate(rows):
            out.add_row(*row, end_section=i == len(rows) - 1)
    console.print(out)
    if dropped:
        console.print(f"{dropped} gold play(s) left out: the replay could not retrace the plan")
