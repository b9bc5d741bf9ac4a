"""`factor credit ...`: inspect the credit core on recorded trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from .common import console, fail
from .token_colours import token_style as _token_style

if TYPE_CHECKING:  # torch-backed; imported by the commands that use them
    from factor_cli.rollout.explain import ActionView, Explanation

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Inspect FACTOR's credit assignment: methods and recorded trajectories.",
    no_args_is_help=True,
)

CONSERVED = 1e-6


def _tokens(view: ActionView, method: str, numbers: bool) -> Text:
    text = Text()
    for tok, w in zip(view.tokens, view.weights[method]):
        text.append(tok, style=_token_style(w))
        if numbers:
            text.append(f"({w:.2f})", style="dim")
    return text


def _check(drift: float) -> str:
    if abs(drift) < CONSERVED:
        return "[green]= A^seq ✓[/]"
    return f"[yellow]≠ A^seq (off by {drift:+.3f}: this credit does not conserve)[/]"


def _render(exp: Explanation, numbers: bool) -> None:
    a, b = exp.methods[0], exp.methods[-1]
    console.print(
        f"[bold]step k = {exp.step}[/]  "
        + "  ".join(
            f"{m}: strength {exp.strength[m]:.3f}, {exp.reduction[m]}"
            + (" [yellow](value-head warm-up: uniform credit)[/]" if exp.warmup[m] else "")
            for m in exp.methods
        )
    )
    console.print(
        "Token colour = allocation weight (1 = uniform share of the action's credit): "
        + "greener = more, greyer = less.",
        style="dim",
    )
    for tr in exp.trajectories:
        table = Table(
            title=f"{tr.id}   G = {tr.outcome:g}   A^seq = {tr.a_seq:+.4f}",
            title_justify="left",
            show_lines=False,
            expand=False,
        )
        table.add_column("t", justify="right", no_wrap=True)
        table.add_column("A*", justify="right", no_wrap=True)
        table.add_column("w̄", justify="right", no_wrap=True)
        table.add_column(f"{a}: tokens", min_width=14)
        if b != a:
            table.add_column("A", justify="right", no_wrap=True)
            table.add_column("w̄", justify="right", no_wrap=True)
            table.add_column(f"{b}: tokens", min_width=14)
        for v in tr.actions:
            row: list[str | Text] = [
                str(v.turn),
                f"{v.credit[a]:+.4f}",
                f"{v.mean_weight[a]:.3f}",
                _tokens(v, a, numbers),
            ]
            if b != a:
                row += [f"{v.credit[b]:+.4f}", f"{v.mean_weight[b]:.3f}", _tokens(v, b, numbers)]
            table.add_row(*row)
            if v.feedback:
                table.add_row("", "", "", Text(f"↳ {v.feedback}", style="dim italic"))
        sums = [f"Σ {m} = {tr.credit_sum[m]:+.4f} {_check(tr.drift[m])}" for m in exp.methods]
        table.caption = "   ".join(sums)
        table.caption_justify = "left"
        console.print(table)


@app.command("explain")
def explain_cmd(
    trajectory: Path = typer.Argument(
        ..., help="Recorded trajectory-group JSON (format: docs/credit.md)."
    ),
    method: str = typer.Option("factor", "--method", "-m", help="Left-hand method."),
    compare: str = typer.Option("serl-repro", "--compare", "-c", help="Right-hand method."),
    step: int | None = typer.Option(
        None,
        "--step",
        "-k",
        min=1,
        help="Training step k for the schedules (default: the file's step, else W + 1).",
    ),
    reduction: str = typer.Option(
        "action-mean", help="Protocol reduction: action-mean or token-mean."
    ),
    weights: bool = typer.Option(False, "--weights", "-w", help="Print each token's weight too."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
    seed: int = typer.Option(0, help="Seed of the shuffled ablations."),
) -> None:
    """Show "how much, then where" for one recorded group.

    For every action: its credit (A* for FACTOR, A^seq broadcast for SERL), the mean token
    weight w̄ (exactly 1 under APM, drifting under SERL's psi), and its tokens coloured by
    their allocation. Each trajectory ends with the telescoping check sum_t A*_t = A^seq.
    """
    from factor_cli.credit import REDUCTIONS, CreditConfig
    from factor_cli.rollout.explain import explain
    from factor_cli.rollout.records import RecordError, load_group

    if trajectory.is_dir():
        fail(f"{trajectory}: is a folder; pass one recorded trajectory-group JSON file")
    try:
        REDUCTIONS.get(reduction)
        group = load_group(trajectory)
        exp = explain(group, [method, compare], step, CreditConfig(), reduction, seed)
    except RecordError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(f"{trajectory}: {exc}")
    except OSError as exc:
        fail(f"{trajectory}: cannot read it ({exc.strerror or exc})")
    if as_json:
        typer.echo(json.dumps(exp.to_json(), indent=1))
        return
    _render(exp, weights)


def _compact_table(title: str) -> Table:
    """No vertical rules and no outer padding, so a registry listing fits 80 columns uncut."""
    return Table(
        title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False
    )


@app.command("methods")
def methods_cmd() -> None:
    """List every trainable method and ablation with its credit, allocation and schedule."""
    from factor_cli.credit import ESTIMATORS, METHODS, TOKEN_ESTIMATORS

    wide = console.width >= 130  # the summary column only fits a wide terminal
    # Every column fits 80 terminal columns uncut; narrower, cells fold instead of being cut.
    table = _compact_table("Methods (credit registry)")
    table.add_column("name", style="bold", overflow="fold")
    for col in ("credit", "allocation", "sched.", "KL", "cont.", "reduction"):
        table.add_column(col, overflow="fold")
    if wide:
        table.add_column("summary", overflow="fold")
    for name in METHODS:
        s = METHODS.get(name)
        row = [
            name,
            s.estimator,
            s.allocation,
            s.schedule,
            "yes" if s.kl else "-",
            s.continuation_use,
            s.reduction or "protocol",
        ]
        table.add_row(*row, *([s.summary] if wide else []))
    console.print(table)
    console.print(
        "sched.: the allocation strength schedule (eta_k, alpha_k or none); cont.: what "
        "continuations feed (head: the value head's targets; mc: the values themselves)",
        style="dim",
    )
    est = _compact_table("Credit estimators")
    est.add_column("name", no_wrap=True, style="bold")
    for col in ("value head", "conserves A^seq", "summary"):
        est.add_column(col, overflow="fold")
    for name in ESTIMATORS:
        e = ESTIMATORS.get(name)
        est.add_row(name, "yes" if e.uses_values else "-", "yes" if e.conserves else "-", e.summary)
    for name in TOKEN_ESTIMATORS:  # per-token credit from a learned critic (ppo)
        doc = (TOKEN_ESTIMATORS.get(name).__doc__ or "").strip().splitlines()[0]
        est.add_row(name, "critic", "-", doc.replace(":func:", "").replace("`", ""))
    console.print(est)
