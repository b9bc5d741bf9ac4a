"""Rendering transcript episodes (:mod:`factor_cli.ledger.transcripts`) for `factor ledger show`:
rich in the terminal, one self-contained HTML page (inline CSS, no script, no external resource).

Both colour the reply's action tokens by their allocation weight as `factor credit explain`
does (:mod:`factor_cli.cli.token_colours`); non-action tokens (reasoning, tags) are dimmed: the
loss gives them the trajectory's A^seq, not a share of A*_t.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from .token_colours import token_rgb, token_style

if TYPE_CHECKING:
    from factor_cli.ledger.transcripts import EpisodeRecord, TurnRecord

CONSERVED = 1e-4  # transcripts keep 5 decimals: the telescoping check at that precision
ADMISSIBLE_SHOWN = 12  # admissible actions listed per turn before "... (+N more)"
LEGEND = (
    "Token colour = allocation weight ω (1 = uniform share of the action's credit): greener = "
    "more, greyer = less; dim = non-action tokens (they get A^seq)."
)


def _num(x: float | None, fmt: str = "+.4f") -> str:
    return "-" if x is None else format(x, fmt)


def title(ep: EpisodeRecord, count: int) -> str:
    """``training step 3, episode #1 of 4`` / ``eval of the starting policy, episode ...``."""
    if ep.kind == "eval":
        when = "eval of the starting policy" if ep.step == 0 else f"eval after step {ep.step}"
    else:
        when = f"training step {ep.step}"
    return f"{when}, episode #{ep.episode} of {count}"


def summary(ep: EpisodeRecord) -> str:
    """The episode's one-line facts: instance, group or category, outcome, A^seq, V~(x_0)."""
    parts = [f"instance {ep.instance}"]
    parts.append(f"category {ep.category}" if ep.category is not None else f"group {ep.group}")
    parts += [f"G = {ep.outcome:g}", "success ✓" if ep.success else "success ✗"]
    parts.append(f"score {ep.score:g}")
    if ep.a_seq is not None:
        parts.append(f"A^seq = {ep.a_seq:+.4f}")
    if ep.v0 is not None:
        parts.append(f"V~(x0) = {ep.v0:.4f}")
    parts.append(f"{len(ep.turns)} turns")
    return " · ".join(parts)


def conservation(ep: EpisodeRecord) -> str | None:
    """``Σ_t A*_t = ... = A^seq ✓`` (or the drift), None without credit."""
    total = ep.credit_sum
    if total is None or ep.a_seq is None:
        return None
    drift = total - ep.a_seq
    check = "= A^seq ✓" if abs(drift) < CONSERVED else f"≠ A^seq (off by {drift:+.4f})"
    return f"Σ_t A*_t = {total:+.4f} {check}"


def _admissible(turn: TurnRecord) -> str:
    shown = turn.admissible[:ADMISSIBLE_SHOWN]
    more = len(turn.admissible) - len(shown)
    return " | ".join(shown) + (f" ... (+{more} more)" if more > 0 else "")


# ----------------------------------------------------------------------------- terminal


def reply_text(turn: TurnRecord, numbers: bool = False) -> Text:
    """The reply's tokens, action tokens on their weight's colour (``numbers``: with w)."""
    text = Text()
    for tok, is_action, w in zip(turn.tokens, turn.action_mask, turn.weights, strict=True):
        if w is not None:
            text.append(tok, style=token_style(w))
            if numbers:
                text.append(f"({w:.2f})", style="dim")
        else:
            text.append(tok, style="bold" if is_action else "dim")
    return text


def _turn_cell(turn: TurnRecord, prompt: bool, numbers: bool) -> Group:
    lines: list[Text] = []
    if prompt:
        lines.append(Text.assemble(("x_t: ", "bold dim"), (turn.prompt, "dim")))
    else:
        lines.append(Text.assemble(("obs: ", "bold dim"), (turn.observation, "dim")))
    if turn.admissible:
        lines.append(Text.assemble(("admissible: ", "bold dim"), (_admissible(turn), "dim")))
    lines.append(Text.assemble(("reply: ", "bold"), reply_text(turn, numbers)))
    valid = ("✓ valid", "green") if turn.valid else ("✗ invalid", "red")
    done = "   done" if turn.done else ""
    action = (turn.action or "(empty)", "bold")
    lines.append(
        Text.assemble(("→ ", "bold"), action, "  ", valid, f"   r = {turn.reward:g}{done}")
    )
    lines.append(Text(f"↳ {turn.feedback}", style="italic"))
    return Group(*lines)


def print_episode(
    console: Console,
    ep: EpisodeRecord,
    count: int,
    run_id: str,
    prompt: bool = False,
    numbers: bool = False,
) -> None:
    """One episode: its facts, then per turn t the observation (or the whole prompt x_t), the
    reply's coloured tokens, the action, its validity, reward and feedback, with A*_t, V(x_t)
    and the mean token weight w-bar_t beside it."""
    console.print(Text(f"run {run_id}: {title(ep, count)}", style="bold"))
    console.print(Text(summary(ep)), highlight=False)
    if ep.task:
        console.print(Text(f"task: {ep.task}", style="dim"))
    if ep.error:
        console.print(Text(f"cut short: {ep.error}", style="yellow"))
    console.print(Text(LEGEND, style="dim"))
    table = Table(show_lines=True, expand=True)
    table.add_column("t", justify="right", no_wrap=True)
    table.add_column("A*_t", justify="right", no_wrap=True)
    table.add_column("V(x_t)", justify="right", no_wrap=True)
    table.add_column("w̄", justify="right", no_wrap=True)
    table.add_column("turn", ratio=1, overflow="fold")
    for turn in ep.turns:
        table.add_row(
            str(turn.t),
            _num(turn.credit),
            _num(turn.value, ".4f"),
            _num(turn.mean_weight, ".3f"),
            _turn_cell(turn, prompt, numbers),
        )
    check = conservation(ep)
    if check:
        table.caption, table.caption_justify = check, "left"
    console.print(table)


# ----------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; background: #fff; }
h1 { font-size: 1.3rem; } h2 { font-size: 1.1rem; margin: 0 0 .3rem 0; }
.legend { color: #555; font-size: .9rem; }
section.episode { border: 1px solid #ccc; border-radius: 6px; padding: .8rem; margin: 1rem 0; }
.facts { color: #333; margin: .2rem 0 .5rem 0; }
.task, .error { color: #666; font-size: .9rem; }
.error { color: #a60; }
table.turns { border-collapse: collapse; width: 100%; }
table.turns th, table.turns td { border-top: 1px solid #ddd; padding: .3rem .4rem;
  vertical-align: top; text-align: left; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.obs, .prompt, .feedback, .reply { white-space: pre-wrap; font-family: ui-monospace, monospace;
  font-size: .85rem; margin: .15rem 0; }
.obs, .prompt { color: #666; }
.feedback { font-style: italic; }
.tok { border-radius: 2px; color: #000; box-shadow: inset -1px 0 0 rgba(0, 0, 0, .18); }
.nonaction { color: #999; }
.valid { color: #080; } .invalid { color: #b00; }
.check { margin-top: .4rem; font-size: .9rem; }
summary { cursor: pointer; color: #555; font-size: .85rem; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _reply_html(turn: TurnRecord) -> str:
    spans = []
    for tok, is_action, w in zip(turn.tokens, turn.action_mask, turn.weights, strict=True):
        if w is not None:
            r, g, b = token_rgb(w)
            spans.append(
                f'<span class="tok" style="background: rgb({r},{g},{b})" '
                f'title="weight {w:.3f}">{_e(tok)}</span>'
            )
        else:
            cls = "tok action" if is_action else "tok nonaction"
            spans.append(f'<span class="{cls}">{_e(tok)}</span>')
    return "".join(spans)


def _turn_html(turn: TurnRecord) -> str:
    valid = (
        '<span class="valid">✓ valid</span>'
        if turn.valid
        else '<span class="invalid">✗ invalid</span>'
    )
    admissible = (
        f'<div class="obs">admissible: {_e(_admissible(turn))}</div>' if turn.admissible else ""
    )
    cells = [
        f'<td class="num">{turn.t}</td>',
        f'<td class="num">{_num(turn.credit)}</td>',
        f'<td class="num">{_num(turn.value, ".4f")}</td>',
        f'<td class="num">{_num(turn.mean_weight, ".3f")}</td>',
        "<td>"
        f'<details><summary>prompt x_t</summary><div class="prompt">{_e(turn.prompt)}</div>'
        "</details>"
        f'<div class="obs">obs: {_e(turn.observation)}</div>{admissible}'
        f'<div class="reply">{_reply_html(turn)}</div>'
        f"<div>→ <b>{_e(turn.action or '(empty)')}</b> {valid} r = {turn.reward:g}"
        f"{' done' if turn.done else ''}</div>"
        f'<div class="feedback">↳ {_e(turn.feedback)}</div>'
        "</td>",
    ]
    return f'<tr class="turn">{"".join(cells)}</tr>'


def _episode_html(ep: EpisodeRecord, count: int) -> str:
    rows = "".join(_turn_html(t) for t in ep.turns)
    check = conservation(ep)
    parts = [
        f'<section class="episode" id="episode-{ep.episode}">',
        f"<h2>{_e(title(ep, count))}</h2>",
        f'<div class="facts">{_e(summary(ep))}</div>',
        f'<div class="task">task: {_e(ep.task)}</div>' if ep.task else "",
        f'<div class="error">cut short: {_e(ep.error)}</div>' if ep.error else "",
        '<table class="turns"><thead><tr><th>t</th><th>A*_t</th><th>V(x_t)</th><th>w̄</th>'
        f"<th>turn</th></tr></thead><tbody>{rows}</tbody></table>",
        f'<div class="check">{_e(check)}</div>' if check else "",
        "</section>",
    ]
    return "".join(parts)


def episodes_html(episodes: Sequence[EpisodeRecord], page_title: str, count: int) -> str:
    """One self-contained page of ``episodes`` (``count``: how many the file holds)."""
    body = "".join(_episode_html(ep, count) for ep in episodes)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(page_title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{_e(page_title)}</h1><p class="legend">{_e(LEGEND)}</p>{body}</body></html>\n'
    )
