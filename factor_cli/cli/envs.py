"""`factor envs ...`: list the environments, play one, generate ALFWorld problems."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from factor_cli.envs import ENVIRONMENTS, EnvError, availability, make_env

from .common import console, err_console, fail

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Environments: availability, interactive play, generated data.",
    no_args_is_help=True,
)


@app.command("list")
def list_cmd() -> None:
    """Each environment adapter: available here, or exactly what is missing and how to get it."""
    wide = console.width >= 140  # convention and metric only fit a wide terminal
    table = Table(title="Environments")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("status", ratio=1)
    table.add_column("instance id", no_wrap=True)
    table.add_column("turns", justify="right", no_wrap=True)
    if wide:
        table.add_column("convention", no_wrap=True)
        table.add_column("metric")
    for name in ENVIRONMENTS:
        spec = ENVIRONMENTS.get(name).spec
        missing = availability(name)
        status = "[green]available[/]" if missing is None else f"[red]missing:[/] {escape(missing)}"
        row = [name, status, spec.instance_format, str(spec.max_turns)]
        table.add_row(*row, *([spec.convention, spec.metric] if wide else []))
    console.print(table)


@app.command("play")
def play_cmd(
    env_name: str = typer.Argument(
        ..., metavar="ENV", help="Environment name (see `factor envs list`)."
    ),
    instance: str = typer.Option(
        ..., "--instance", "-i", help="Instance id, e.g. coin/17 or boil/L0/3."
    ),
    script: Path | None = typer.Option(
        None, "--script", "-s", help="File with one action per line; no prompt."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON summary at the end (with --script)."
    ),
    show_valid: bool = typer.Option(
        False, "--valid", help="Show the valid actions after each step."
    ),
) -> None:
    """Play an instance in the terminal (type actions; `quit` to stop), or run a script of actions.

    With --json the summary is {"instance", "steps", "done", "success", "score", "outcome"}.
    """
    if env_name not in ENVIRONMENTS:
        fail(f"unknown environment {env_name!r}; valid: {', '.join(ENVIRONMENTS.names())}")
    actions: list[str] | None = None
    if script is not None:
        if not script.exists():
            fail(f"{script}: no such script file; write one action per line")
        actions = [ln.strip() for ln in script.read_text().splitlines() if ln.strip()]
    out = err_console if as_json else console
    try:
        with make_env(env_name) as env:
            obs = env.reset(instance)
            out.print(Text(env.task_description(), style="bold"))
            out.print(Text(obs))
            steps = 0
            while not env.done:
                if actions is not None:
                    if steps >= len(actions):
                        break
                    action = actions[steps]
                    out.print(Text(f"> {action}", style="cyan"))
                else:
                    if show_valid:
                        out.print(
                            Text(f"valid: {', '.join(env.valid_actions()[:40])}", style="dim")
                        )
                    action = typer.prompt(">", prompt_suffix=" ").strip()
                    if action in ("quit", "exit"):
                        break
                result = env.step(action)
                steps += 1
                out.print(Text(result.observation))
                if not result.valid:
                    out.print("[yellow](invalid action)[/]")
            res = env.outcome()
            summary = {
                "instance": instance,
                "steps": steps,
                "done": env.done,
                "success": res.success,
                "score": res.score,
                "outcome": res.outcome,
            }
    except EnvError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        console.print(
            f"[bold]done={summary['done']} success={summary['success']} "
            f"score={summary['score']} outcome={summary['outcome']}[/]"
        )


@app.command("alfworld-generate")
def alfworld_generate_cmd(
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Data root to write (default: ~/.cache/factor/alfworld-gen)."
    ),
    train_per_category: int = typer.Option(10, min=1, help="Train games per task type."),
    eval_per_category: int = typer.Option(4, min=1, help="Eval games per task type."),
    seed: int = typer.Option(0, help="Seed (same seed and counts give the same bytes)."),
) -> None:
    """Write ALFRED-style games of all six ALFWorld categories for the shipped domain.

    Every game's expert plan is played through the real ALFWorld engine before it is written,
    so the set is winnable offline; train games use ALFRED's train scenes, eval games its test
    scenes. Point ALFWORLD_DATA (or --data-root options) at the output to play them.
    """
    from factor_cli.envs.alfworld import DEFAULT_GENERATED_ROOT, NO_DATA, AlfWorldEnv

    missing = AlfWorldEnv.availability(data_root=None)
    if missing is not None and missing != NO_DATA:  # missing data is what this command makes
        fail(f"alfworld: {missing}")
    from factor_cli.envs.alfworld_gen import generate

    root = out or DEFAULT_GENERATED_ROOT
    try:
        with console.status(f"generating train games into {root} (each is played to a win first)"):
            train = generate(root, train_per_category, seed, "train")
        with console.status(f"generating eval games into {root}"):
            evals = generate(root, eval_per_category, seed, "eval")
    except (EnvError, ValueError, OSError) as exc:
        fail(f"alfworld-generate: {exc}")
    console.print(Text(f"wrote {len(train)} train and {len(evals)} eval games under {root}"))
