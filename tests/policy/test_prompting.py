"""The prompt protocol (``prompt.*``): the step counter, the admissible-action list and its caps,
the reasoning convention, per-environment defaults, and one-line errors for bad options."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factor_cli.policy.prompting import (
    ADMISSIBLE_HEADER,
    FEEDBACK_HEADER,
    PromptFormat,
    TurnView,
    shown_admissible,
    system_text,
    user_message,
)
from factor_cli.train.config import ConfigError, load_config
from factor_cli.train.prompts import prompt_format


def _words(text: str) -> int:
    return len(text.split())


def _oracle_shown(actions: list[str], max_count: int, max_tokens: int) -> tuple[str, ...]:
    """The longest prefix of ``actions`` within both caps (tokens: words + 1 separator each)."""
    best: tuple[str, ...] = ()
    for n in range(len(actions) + 1):
        head = actions[:n]
        if n <= max_count and sum(_words(a) + 1 for a in head) <= max_tokens:
            best = tuple(head)
    return best


@given(
    actions=st.lists(st.text("ab ", min_size=1, max_size=12).filter(str.split), max_size=30),
    max_count=st.integers(1, 40),
    max_tokens=st.integers(1, 80),
)
def test_shown_admissible_is_the_longest_prefix_within_both_caps(
    actions: list[str], max_count: int, max_tokens: int
) -> None:
    fmt = PromptFormat(admissible=True, admissible_max=max_count, admissible_max_tokens=max_tokens)
    assert shown_admissible(fmt, actions, _words) == _oracle_shown(actions, max_count, max_tokens)


def test_admissible_off_shows_nothing() -> None:
    assert shown_admissible(PromptFormat(admissible=False), ["look", "go north"], _words) == ()


def test_user_message_layout() -> None:
    view = TurnView(
        "find the coin",
        [("move east", "You are in the pantry."), ("look", "A coin.")],
        "A coin.",
        ("take coin", "move west"),
        "You are in the kitchen.",
    )
    text = user_message(PromptFormat(history_turns=1), view)
    parts = text.split("\n\n")
    assert parts[0] == "Task: find the coin"
    # The last history_turns (observation, action) pairs; the current observation once.
    assert parts[1] == "Earlier turns:\n[Step 2] Observation: You are in the pantry.\nAction: look"
    assert parts[2] == "Step 3. Actions so far: 2."
    assert parts[3] == "Current observation: A coin."
    assert parts[4] == f"{ADMISSIBLE_HEADER}: [take coin, move west]"
    both = user_message(PromptFormat(history_turns=5), view).split("\n\n")[1]
    assert both == (
        "Earlier turns:\n[Step 1] Observation: You are in the kitchen.\n"
        "Action: move east\n[Step 2] Observation: You are in the pantry.\nAction: look"
    )
    quiet = user_message(PromptFormat(history_turns=0, step_counter=False), view)
    assert "Step" not in quiet and "Earlier" not in quiet
    # The teacher's block comes last, after the admissible list: it is the only difference.
    teacher = user_message(PromptFormat(history_turns=1), view, feedback="You take the coin.")
    assert teacher == text + "\n\n" + FEEDBACK_HEADER + "You take the coin."


def test_a_full_history_prompt_extends_the_previous_turns_prompt() -> None:
    """With the whole history in the window, turn t's user message up to its history is a
    prefix of turn t + 1's (the step counter comes after it): KV caches can be reused."""
    fmt = PromptFormat(history_turns=10)
    hist = [("move east", "In the pantry."), ("take coin", "You take the coin.")]
    one = user_message(fmt, TurnView("t", hist[:1], "In the pantry.", (), "In the kitchen."))
    two = user_message(fmt, TurnView("t", hist, "You take the coin.", (), "In the kitchen."))
    shared = one[: one.index("\n\nStep ")]
    assert two.startswith(shared)


def test_system_text_states_the_reply_convention() -> None:
    assert "<action>...</action>" in system_text("You are X.", think=False)
    assert "<think>" not in system_text("You are X.", think=False)
    with_think = system_text("You are X.", think=True)
    assert with_think.startswith("You are X.")
    assert with_think.index("<think>") < with_think.index("<action>")


@pytest.mark.parametrize(
    ("env", "shows"),
    [("twx", True), ("alfworld", True), ("webshop", True), ("scienceworld", False)],
)
def test_env_defaults(env: str, shows: bool) -> None:
    from factor_cli.envs import ENVIRONMENTS

    cfg = load_config("smoke").model_copy(deep=True)
    cfg.env.name, cfg.env.games = env, []
    fmt = prompt_format(cfg)
    assert fmt.admissible is shows
    assert fmt.system.startswith(ENVIRONMENTS.get(env).spec.role)


def test_prompt_overrides_beat_the_env_defaults() -> None:
    cfg = load_config(
        "smoke",
        [
            "prompt.admissible=false",
            "prompt.history_turns=5",
            "prompt.think=true",
            "prompt.admissible_max=7",
            "prompt.step_counter=false",
        ],
    )
    fmt = prompt_format(cfg)
    assert (fmt.admissible, fmt.history_turns, fmt.admissible_max, fmt.step_counter) == (
        False,
        5,
        7,
        False,
    )
    assert "<think>" in fmt.system
    own = prompt_format(load_config("smoke", ["prompt.system=Be brief."]))
    assert own.system == "Be brief."


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("prompt.admissible_max=0", r"field prompt.admissible_max: .*greater than or equal to 1"),
        ("prompt.admissible_max_tokens=-1", r"field prompt.admissible_max_tokens: "),
        ("prompt.history_turns=-1", r"field prompt.history_turns: "),
        ("prompt.system=' '", r"field prompt.system: an empty system text"),
        ("prompt.think=maybe", r"field prompt.think: Input should be a valid boolean"),
        ("prompt.colour=red", r"field prompt.colour: Extra inputs are not permitted"),
        ("rollout.history_turns=3", r"field rollout.history_turns: moved: set prompt.history"),
        ("rollout.valid_action_decoding=sometimes", r"field rollout.valid_action_decoding: "),
    ],
)
def test_bad_prompt_options_are_one_line_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config("smoke", [override])
    assert "\n" not in str(err.value)
