"""`factor train`, `factor eval`, `factor sft`: the training commands."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from factor_cli.train.config import ConfigError, TrainConfig, field_reference, load_config

from .common import EXIT_INTERRUPTED, console, err_console, fail, first_line

if TYPE_CHECKING:
    from factor_cli.train.evaluate import Comparison
    from factor_cli.train.run import EvalSummary

CONFIG_HELP = "Preset name (smoke, paper) or a YAML file."
SET_HELP = "Override a field, e.g. --set rollout.k=4 --set method=grpo (repeatable)."


def _main_rank() -> bool:
    """False on torchrun's ranks other than 0, which train silently beside it."""
    return os.environ.get("RANK", "0") == "0"


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not _main_rank(),
    )


class _Bars:
    """One progress bar per phase, reset each time the phase starts over."""

    def __init__(self, bar: Progress) -> None:
        self.bar, self.tasks = bar, {}

    def __call__(self, phase: str, i: int, n: int) -> None:
        if phase not in self.tasks:
            self.tasks[phase] = self.bar.add_task(phase, total=n)
        self.bar.update(self.tasks[phase], completed=i, total=n)


def _plain(message: str) -> None:
    """Log a library message as literal text (paths may hold "[")."""
    console.print(Text(message), soft_wrap=True)  # paths stay whole, for copying


def _load(config: str, overrides: list[str]) -> TrainConfig:
    try:
        return load_config(config, overrides)
    except ConfigError as exc:
        fail(str(exc))


def _reference() -> None:
    table = Table(title="Training configuration fields")
    for col in ("field", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for name, default, doc in field_reference():
        table.add_row(name, default, doc)
    console.print(table)


def _tags(items: list[str]) -> dict[str, str]:
    """``--tag KEY=VALUE`` items as a mapping (one-line error for a malformed one)."""
    tags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--tag {item!r}: expected KEY=VALUE, e.g. --tag note=baseline-rerun")
        tags[key.strip()] = value
    return tags


def _resume_command(run_id: str, config: str, overrides: list[str]) -> str:
    """The command that continues ``run_id`` with the same configuration."""
    parts = ["factor", "train", "--resume", run_id]
    if config != "smoke":
        parts += ["--config", config]
    for item in overrides:
        parts += ["--set", item]
    return shlex.join(parts)


def train_cmd(
    config: str = typer.Option("smoke", "--config", "-c", help=CONFIG_HELP),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    resume: str | None = typer.Option(None, "--resume", help="Continue this ledger run id."),
    tag_items: list[str] = typer.Option(
        [], "--tag", help="Add a ledger tag KEY=VALUE to the run (repeatable); studies use it."
    ),
    help_config: bool = typer.Option(False, "--help-config", help="List every config field."),
) -> None:
    """Train a policy with FACTOR or any baseline/ablation; with no arguments, the smoke run.

    The embedded default builds a tiny model if missing, warm-starts it on gold plays, trains a
    few steps on TextWorldExpress, evaluates on the eval split, and logs everything to the ledger
    (MLflow under ./ledger unless MLFLOW_TRACKING_URI or tracking_uri says otherwise).

    Several processes: `torchrun --nproc_per_node N -m factor_cli train ...` shards the
    rollouts over the N ranks and splits each update among them; rank 0 alone writes the ledger
    run, checkpoints' metadata and results (one run per job).
    """
    if help_config:
        _reference()
        return
    cfg = _load(config, overrides)
    tags = {"config_source": config, **_tags(tag_items)}  # study estimates match on it
    from factor_cli.train.run import train

    console.quiet = not _main_rank()  # errors still reach stderr (common.fail)
    console.print(
        f"[bold]factor train[/] {escape(cfg.study)}/{cfg.method} on {cfg.env.name}, "
        f"{cfg.total_steps} steps, seed {cfg.seed}"
    )
    opened: list[str] = []
    try:
        with _progress() as bar:
            summary = train(
                cfg, _Bars(bar), _plain, resume_run_id=resume, on_run=opened.append, tags=tags
            )
    except (ValueError, OSError) as exc:
        fail(first_line(exc))
    except KeyboardInterrupt as exc:
        from factor_cli.ledger.runs import RunTerminated

        # The ledger run is already closed as KILLED and the last checkpoint is intact.
        again = (
            f"resume with `{_resume_command(opened[0], config, overrides)}`"
            if opened
            else "no ledger run was opened yet; nothing to resume"
        )
        err_console.print(Text.assemble(("interrupted", "yellow"), f": {again}"), soft_wrap=True)
        raise typer.Exit(143 if isinstance(exc, RunTerminated) else EXIT_INTERRUPTED) from None
    table = Table(title=f"Run {summary.run_id}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = (
        "return_mean",
        "success_rate",
        "turns_mean",
        "invalid_rate",
        "value_mse",
        "coef_deviation_mean",
        "kl",
        "loss",
    )
    for key in keys:
        if key in summary.metrics:
            table.add_row(key, f"{summary.metrics[key]:.4f}")
    cmp = summary.comparison
    if cmp is not None:
        table.add_row("eval macro success, start", f"{cmp.start:.4f}")
    if summary.eval_metric is not None:
        table.add_row(
            "eval macro success" + (", final" if cmp else ""), f"{summary.eval_metric:.4f}"
        )
    console.print(table)
    if cmp is not None:
        console.print(Text(_comparison_line(cmp)), soft_wrap=True)
    console.print(
        Text(
            f"results: {summary.run_dir} (items: {summary.items_path}"
            + (f"; plot: {summary.progress_path}" if summary.progress_path else "")
            + f"); ledger: `factor ledger report --study {cfg.study}`; episodes: "
            f"`factor ledger show {summary.run_id[:12]}` (--eval, --html PAGE.html)"
        ),
        soft_wrap=True,
    )


def _comparison_line(cmp: Comparison) -> str:
    """The start -> final sentence: both macro successes and the paired CI of the change."""
    return (
        f"eval macro success {cmp.start:.4f} -> {cmp.final:.4f} on the same {cmp.items} items: "
        f"change {cmp.delta:+.4f}, {cmp.confidence:.0%} CI [{cmp.ci_low:+.4f}, "
        f"{cmp.ci_high:+.4f}] (paired bootstrap over items, {cmp.replicates} replicates)"
    )


def eval_cmd(
    run: str | None = typer.Option(None, "--run", help="Ledger run id (uses its final model)."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="A model directory."),
    env: str | None = typer.Option(None, "--env", help="Environment (default: the config's)."),
    split: str = typer.Option(
        "eval", "--split", help="Manifest split: eval, or train (greedy play on training games)."
    ),
    config: str = typer.Option("smoke", "--config", "-c", help=CONFIG_HELP),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Also write the item-level CSV here (it always goes to the run's folder "
        "OUTPUT_DIR/evals/RUN_ID/).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the metric as JSON."),
) -> None:
    """Greedy evaluation of a checkpoint on a manifest split, recorded as a ledger run.

    The run has kind=eval, the checkpoint and training run evaluated, the split and its
    manifest digests, the metric and the item-level results (artifact items/eval_items.csv;
    `factor ledger export --kind eval` collects them). A local copy goes to
    OUTPUT_DIR/evals/RUN_ID/eval_items_ENV.csv (RUN_ID: the eval's ledger run), so evaluations
    running at once never share a file. A failed or interrupted one is closed FAILED or KILLED.
    """
    from factor_cli.splits.manifest import SPLITS

    if (run is None) == (checkpoint is None):
        fail("pass exactly one of --run RUN_ID or --checkpoint DIR")
    if split not in SPLITS:
        fail(f"--split {split!r}: unknown split; valid: {', '.join(SPLITS)}")
    cfg = _load(config, [*overrides, *([f"env.name={env}"] if env else [])])
    model_dir = checkpoint or Path(cfg.output_dir) / str(run) / "model"
    if not (model_dir / "config.json").exists():
        fail(f"{model_dir}: no model there; train first or pass --checkpoint DIR")
    summary = _evaluate(cfg, model_dir, split, run, out)
    paths = [summary.items_path, *([summary.out] if summary.out else [])]
    if as_json:
        payload = {
            "metric": summary.metric, "items": len(summary.items), "run_id": summary.run_id,
            "split": split, "path": str(paths[-1]), "items_path": str(summary.items_path),
        }  # fmt: skip
        typer.echo(json.dumps(payload))
    else:
        console.print(
            f"{cfg.env.name} {split} macro success {summary.metric:.4f} over "
            f"{len(summary.items)} items; ledger run {summary.run_id} -> "
            + ", ".join(str(p) for p in paths),
            highlight=False,
            markup=False,
            soft_wrap=True,  # paths stay whole, for copying
        )


def _evaluate(
    cfg: TrainConfig, model_dir: Path, split: str, run: str | None, out: Path | None
) -> EvalSummary:
    """:func:`~factor_cli.train.run.evaluate_checkpoint` with one-line errors and Ctrl-C."""
    from factor_cli.ledger.runs import RunTerminated
    from factor_cli.train.run import evaluate_checkpoint

    opened: list[str] = []
    try:
        with _progress() as bar:
            return evaluate_checkpoint(
                cfg, model_dir, _Bars(bar), split=split, evaluated_run=run, out=out,
                on_run=opened.append,
            )  # fmt: skip
    except (ValueError, OSError) as exc:
        fail(first_line(exc))
    except KeyboardInterrupt as exc:
        closed = f"ledger run {opened[0]} closed as KILLED" if opened else "no ledger run opened"
        err_console.print(Text.assemble(("interrupted", "yellow"), f": {closed}"), soft_wrap=True)
        raise typer.Exit(143 if isinstance(exc, RunTerminated) else EXIT_INTERRUPTED) from None


def sft_cmd(
    config: str = typer.Option("smoke", "--config", "-c", help=CONFIG_HELP),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Supervised warm start from gold plays (TWX/ScienceWorld gold paths, ALFWorld experts)."""
    cfg = _load(config, [*overrides, "sft.enabled=true"])
    from factor_cli.train.run import warm_start

    try:
        with _progress() as bar:
            path = warm_start(cfg, _Bars(bar), _plain)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc).splitlines()[0])
    console.print(Text(f"warm-started model: {path}"), soft_wrap=True)
