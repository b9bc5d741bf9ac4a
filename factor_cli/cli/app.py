"""The ``factor`` command tree: every sub-app and command, registered once."""

from __future__ import annotations

import typer

from factor_cli import __version__

from .credit import app as credit_app
from .diagnose import diagnose_cmd
from .envs import app as envs_app
from .ledger import app as ledger_app
from .model import app as model_app
from .splits import app as splits_app
from .splits import verify_cmd
from .stats import app as stats_app
from .study import SHORTCUTS, shortcut, sweep_app
from .study import app as study_app
from .train import eval_cmd, sft_cmd, train_cmd

app = typer.Typer(
    rich_markup_mode="markdown",
    name="factor",
    help=(
        "FACTOR experiment toolkit: credit-conserving action-to-token allocation for multi-turn "
        "LLM-agent RL (arXiv 2608.07118)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(credit_app, name="credit")
app.add_typer(stats_app, name="stats")
app.add_typer(envs_app, name="envs")
app.add_typer(splits_app, name="splits")
app.add_typer(model_app, name="model")
app.add_typer(ledger_app, name="ledger")
app.command("verify-splits")(verify_cmd)
app.command("train")(train_cmd)
app.command("eval")(eval_cmd)
app.command("sft")(sft_cmd)
app.command("diagnose")(diagnose_cmd)
app.add_typer(study_app, name="study")
for _name, (_spec, _summary) in SHORTCUTS.items():
    app.command(_name)(shortcut(_spec, _summary))
app.add_typer(sweep_app, name="sweep")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"factor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """FACTOR experiment toolkit."""
