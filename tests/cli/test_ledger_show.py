"""Rendering transcript episodes (no run needed): the terminal view's credit columns and
telescoping check, and the HTML page's escaping and token colours. The command itself runs on a
real tiny run in tests/train/test_transcripts.py."""

from __future__ import annotations

from rich.console import Console

from factor_cli.cli.episode_render import episodes_html, print_episode
from factor_cli.cli.token_colours import token_rgb, token_style
from factor_cli.ledger.transcripts import EpisodeRecord, TurnRecord


def _turn(t: int, credit: float | None, weights: list[float | None]) -> TurnRecord:
    return TurnRecord(
        t=t, prompt="<|bos|>Task: find & take", observation="You see <b>a coin</b>",
        reply="<action>take coin</action>", action="take coin", valid=t == 1,
        feedback="You take the coin & win", reward=float(t), done=t == 1,
        admissible=[f"act {k}" for k in range(15)],
        tokens=["<action>", "take", " coin", "</action>"], action_mask=[False, True, True, False],
        weights=weights, credit=credit, value=None if credit is None else 0.25,
    )  # fmt: skip


def _episode(a_seq: float | None, credits: list[float | None]) -> EpisodeRecord:
    weights: list[float | None] = [None, 1.6, 0.4, None] if a_seq is not None else [None] * 4
    return EpisodeRecord(
        kind="step" if a_seq is not None else "eval", step=4, episode=0, instance="coin/7",
        group=1, outcome=1.0, success=True, score=1.0, a_seq=a_seq, v0=0.0,
        turns=[_turn(t, c, weights) for t, c in enumerate(credits)],
    )  # fmt: skip


def _terminal(ep: EpisodeRecord) -> str:
    console = Console(record=True, width=120)
    print_episode(console, ep, 3, "ab" * 16)
    return console.export_text()


def test_terminal_view_shows_credit_value_mean_weight_and_the_check() -> None:
    text = _terminal(_episode(0.75, [0.5, 0.25]))
    assert "training step 4, episode #0 of 3" in text and "A^seq = +0.7500" in text
    assert "+0.5000" in text and "+0.2500" in text and "0.2500" in text  # A*_t, V
    assert "1.000" in text  # w-bar = (1.6 + 0.4) / 2
    assert "Σ_t A*_t = +0.7500 = A^seq ✓" in text
    assert "... (+3 more)" in text  # 15 admissible actions, 12 listed
    assert "✓ valid" in text and "✗ invalid" in text
    drift = _terminal(_episode(0.75, [0.5, 0.5]))
    assert "≠ A^seq (off by +0.2500)" in drift


def test_eval_episodes_have_no_credit_columns_filled() -> None:
    text = _terminal(_episode(None, [None, None]))
    assert "Σ_t" not in text and "A^seq =" not in text
    assert "eval after step 4" in text


def test_html_escapes_everything_and_colours_action_tokens_by_weight() -> None:
    ep = _episode(0.75, [0.5, 0.25])
    page = episodes_html([ep], "run <x> & co", 3)
    assert "<b>a coin</b>" not in page and "&lt;b&gt;a coin&lt;/b&gt;" in page
    assert "<title>run &lt;x&gt; &amp; co</title>" in page
    assert "&lt;action&gt;" in page and "<action>" not in page
    r, g, b = token_rgb(1.6)
    assert f'style="background: rgb({r},{g},{b})" title="weight 1.600">take</span>' in page
    assert '<span class="tok nonaction">&lt;/action&gt;</span>' in page
    assert page.count('<tr class="turn">') == 2 and "<script" not in page


def test_terminal_and_html_share_the_colour_scale() -> None:
    for w in (0.0, 0.5, 1.0, 1.7, 9.0):
        r, g, b = token_rgb(w)
        assert token_style(w) == f"black on rgb({r},{g},{b})"
    assert token_rgb(1.0) == (200, 200, 200)  # uniform share: neutral grey
    assert token_rgb(2.5) == token_rgb(10.0) == (80, 255, 80)  # saturates
