"""Prompts, the hindsight teacher's context, action extraction and token masks.

Student prompt for action t (the context x_t), the content of the verl-agent templates that
the paper's baselines (GiGPO, SERL) use:

    system:  the environment's role and the reply convention (one action inside
             <action>...</action>; with ``think``, reasoning inside <think>...</think> first)
    user:    Task: <task description>
             [Earlier turns: the last H (observation, action) pairs]           (``history_turns``)
             [Step t + 1. Actions so far: t.]                                  (``step_counter``)
             Current observation: <observation before action t>
             [Admissible actions: [a_1, a_2, ...]]    (``admissible``, capped in count and tokens)

The hindsight teacher (same weights, no gradient) sees the identical prompt with one block
appended after it, before the reply:

             Outcome of your next action (hindsight): <Phi_t>

so teacher and student differ only by Phi_t. With a chat template the two messages go through
``apply_chat_template``; without one they are joined as plain text ending in "Assistant:".

The executable action is the text inside the first ``<action>...</action>``; without a closing
tag, the text after ``<action>`` up to the end of its line; without any tag, the first non-empty
line of the reply. Reply tokens whose characters overlap that span are action tokens; the rest
(reasoning, the tags, formatting) are non-action tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TAGGED = re.compile(re.escape(ACTION_OPEN) + r"(.*?)" + re.escape(ACTION_CLOSE), re.DOTALL)
FEEDBACK_HEADER = "Outcome of your next action (hindsight): "
ADMISSIBLE_HEADER = "Admissible actions"

ROLE = "You are an agent acting in a text environment."
"""The first sentence of the system text when an environment names no role of its own."""
ADMISSIBLE_MAX = 50
"""Admissible actions shown at most (the first ones, in the engine's order)."""
ADMISSIBLE_MAX_TOKENS = 384
"""Tokens the admissible-action list may take at most (it is cut at a whole action)."""


def system_text(role: str, think: bool) -> str:
    """The system message: the role, then the reply convention."""
    if think:
        rule = (
            f"Think step by step inside {THINK_OPEN}...{THINK_CLOSE}, then reply with exactly "
            f"one action inside {ACTION_OPEN}...{ACTION_CLOSE}."
        )
    else:
        rule = f"Reply with exactly one action inside {ACTION_OPEN}...{ACTION_CLOSE}."
    return f"{role.strip()} Read the task and the observation. {rule}"


@dataclass(frozen=True)
class PromptFormat:
    """How an environment's turns are shown to the policy (``prompt.*`` in the config)."""

    system: str = field(default_factory=lambda: system_text(ROLE, think=False))
    history_turns: int = 2
    """Past (action, observation) pairs shown before the current observation."""
    step_counter: bool = True
    """Show "Step t + 1. Actions so far: t." (how far into the episode the agent is)."""
    admissible: bool = False
    """Show the admissible actions of the current state (the verl-agent convention)."""
    admissible_max: int = ADMISSIBLE_MAX
    admissible_max_tokens: int = ADMISSIBLE_MAX_TOKENS
    use_chat_template: bool = True
    """Use the tokenizer's chat template when it has one."""


@dataclass(frozen=True)
class TurnView:
    """What the policy sees before action t: the task, earlier turns and the observation."""

    task: str
    history: Sequence[tuple[str, str]]
    """Earlier (action, observation-after-it) pairs of this episode (prefix included), oldest
    first; its length is the number of actions taken so far."""
    observation: str
    admissible: Sequence[str] = ()
    """The admissible actions shown (already capped: :func:`shown_admissible`)."""
    first_observation: str | None = None
    """o_0, the observation before the first action (shown when that action is in the window)."""

    def before(self, k: int) -> str | None:
        """The observation before action k: o_0 for k = 0, else the reply to action k - 1."""
        return self.first_observation if k == 0 else self.history[k - 1][1]


def shown_admissible(
    fmt: PromptFormat, actions: Sequence[str], count_tokens: Callable[[str], int]
) -> tuple[str, ...]:
    """The admissible actions a prompt shows: the first ones, at most ``admissible_max`` of them
    and ``admissible_max_tokens`` tokens in all (each counted with its ", " separator); none when
    ``admissible`` is off."""
    if not fmt.admissible:
        return ()
    shown: list[str] = []
    used = 0
    for a in actions[: fmt.admissible_max]:
        used += count_tokens(a) + 1
        if used > fmt.admissible_max_tokens:
            break
        shown.append(a)
    return tuple(shown)


def user_message(
    fmt: PromptFormat, view: TurnView, feedback: str | None = None, history_turns: int | None = None
) -> str:
    keep = fmt.history_turns if history_turns is None else history_turns
    parts = [f"Task: {view.task.strip()}"]
    n = len(view.history)
    if keep > 0 and n:
        lines = []
        for k in range(max(0, n - keep), n):
            seen = view.before(k)
            seen_text = f"Observation: {seen.strip()}\n" if seen else ""
            lines.append(f"[Step {k + 1}] {seen_text}Action: {view.history[k][0]}")
        parts.append("Earlier turns:\n" + "\n".join(lines))
    # After the history, so a turn's prompt shares the longest prefix with the next one's.
    if fmt.step_counter:
        parts.append(f"Step {n + 1}. Actions so far: {n}.")
    parts.append(f"Current observation: {view.observation.strip()}")
    if view.admissible:
        parts.append(f"{ADMISSIBLE_HEADER}: [{', '.join(view.admissible)}]")
    if feedback is not None:
        parts.append(FEEDBACK_HEADER + feedback.strip())
    return "\n\n".join(parts)


def render(
    fmt: PromptFormat,
    view: TurnView,
    tokenizer: object,
    feedback: str | None = None,
    history_turns: int | None = None,
) -> str:
    """The prompt text for the student (``feedback=None``) or the hindsight teacher."""
    user = user_message(fmt, view, feedback, history_turns)
    template = getattr(tokenizer, "chat_template", None)
    if fmt.use_chat_template and template:
        messages = [{"role": "system", "content": fmt.system}, {"role": "user", "content": user}]
        return str(
            tokenizer.apply_chat_template(  # type: ignore[attr-defined]
                messages, tokenize=False, add_generation_prompt=True
            )
        )
    return f"{fmt.system}\n\n{user}\n\nAssistant: "


@dataclass(frozen=True)
class ActionSpan:
    text: str
    """The executable action."""
    start: int
    end: int
    """Character span of the action in the reply."""
    tagged: bool
    """True if found inside <action>...</action> (False: a fallback rule)."""


def extract_action(reply: str) -> ActionSpan:
    """The executable action of a reply (module docstring for the rules)."""
    m = _TAGGED.search(reply)
    if m:
        raw, start = m.group(1), m.start(1)
        tagged = True
    elif ACTION_OPEN in reply:
        start = reply.index(ACTION_OPEN) + len(ACTION_OPEN)
        end_line = reply.find("\n", start)
        raw = reply[start:] if end_line < 0 else reply[start:end_line]
        tagged = False
    else:
        lines = [ln for ln in reply.splitlines()]
        offset = 0
        raw, start = "", 0
        for ln in lines:
            if ln.strip():
                raw, start = ln, offset
                break
            offset += len(ln) + 1
        tagged = False
    lead = len(raw) - len(raw.lstrip())
    text = raw.strip()
    return ActionSpan(text=text, start=start + lead, end=start + lead + len(text), tagged=tagged)


def token_char_spans(
    tokenizer: object, token_ids: Sequence[int]
) -> tuple[str, list[tuple[int, int]]]:
    """(decoded text, [(start, end)] per token) of a generated sequence.

    Tokens are decoded one by one; when that does not reproduce the full decode (a multi-byte
    character split across tokens), prefix decodes give exact boundaries instead.
    """
    decode = tokenizer.decode  # type: ignore[attr-defined]
    full = decode(list(token_ids), skip_special_tokens=False)
    pieces = [decode([t], skip_special_tokens=False) for t in token_ids]
    if "".join(pieces) != full:
        ends = [
            len(decode(list(token_ids[: k + 1]), skip_special_tokens=False))
            for k in range(len(token_ids))
        ]
        starts = [0, *ends[:-1]]
        return full, list(zip(starts, ends))
    spans, pos = [], 0
    for p in pieces:
        spans.append((pos, pos + len(p)))
        pos += len(p)
    return full, spans


def action_token_mask(spans: Sequence[tuple[int, int]], action: ActionSpan) -> list[bool]:
    """True for tokens whose characters overlap the action span (and are not empty)."""
    return [e > s and s < action.end and e > action.start for s, e in spans]
