"""WebShop adapter (``webshop``): the authors' text environment (``WebAgentTextEnv``).

An instance is a goal index (a string of digits) into WebShop's goal list, which WebShop itself
shuffles with a fixed seed; WebShop's own folds are goals 0-499 test (our eval), 500-1499 dev and
1500+ train (:func:`goal_split`). Actions are ``search[keywords]`` and ``click[button]``.

Outcome: WebShop's reward r in [0, 1] is paid when the agent clicks "Buy Now" (score = 100 r);
success means score 100 (r = 1). G~_i = r - 0.1 * (number of invalid actions) (docs/design.md
section 4.2, group-standardised by the credit core). An action is invalid when it is not
``search[...]`` / ``click[...]``, searches on a page without a search bar or with no keywords, or
clicks something the page does not offer; it is not sent to WebShop (the page stays as it was)
and is counted.

Feedback Phi_t: the page text as WebShop's simple text mode writes it (visible text nodes joined
by " [SEP] ", :func:`page_text`), truncated to 512 tokens (:func:`truncate_tokens`: whitespace
tokens unless a tokenizer is passed).

Everything that does not need the live site is a pure function here and unit-tested; the class
needs WebShop installed from its repository (the PyPI ``webshop`` 0.1.0 is a broken stub).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Protocol

from .base import Environment, EnvSpec, EnvUnavailable, Step, UnknownInstance
from .jvm import java_missing
from .registry import register

INVALID_PENALTY = 0.1
FEEDBACK_TOKENS = 512
SETUP = (
    "WebShop is not installed: `git clone https://github.com/princeton-nlp/WebShop`, run its "
    "`./setup.sh -d small` (or `-d all`: downloads the products and builds the search index; "
    "needs internet and Java 11+), then `pip install -e` that folder or set WEBSHOP_DIR to it "
    "(the PyPI `webshop` package is a broken stub)"
)


# -- pure functions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class WebAction:
    """A checked agent action."""

    kind: str
    """'search' or 'click' ('' when the text is neither)."""
    arg: str
    """The argument as WebShop will see it (lower-cased)."""
    valid: bool
    reason: str = ""
    """Why the action is invalid ('' when valid)."""

    @property
    def command(self) -> str:
        """The action in WebShop's syntax, e.g. 'click[buy now]'."""
        return f"{self.kind}[{self.arg}]"


_ACTION = re.compile(r"(.+)\[(.+)\]")  # WebShop's engine.parse_action


def parse_action(text: str) -> tuple[str, str] | None:
    """Split ``'search[Red shoes]'`` into ``('search', 'red shoes')`` as WebShop does; None when
    WebShop would not see a search or a click.

    WebShop's own parse: ``re.match(r'(.+)\\[(.+)\\]')`` (greedy, so the last '[' that leaves a
    non-empty argument before a ']' splits; text after that ']' is ignored), then the argument
    lower-cased, not stripped. Only whitespace around the whole action is removed first.
    """
    match = _ACTION.match(text.strip())
    if match is None or match.group(1) not in ("search", "click"):
        return None
    return match.group(1), match.group(2).lower()


def check_action(text: str, has_search_bar: bool, clickables: Sequence[str]) -> WebAction:
    """Validate an action against the current page (``clickables`` as WebShop lists them).

    Valid: ``search[k]`` with k not blank on a page with a search bar (WebShop's baseline action
    space; WebShop itself would also search from other pages); ``click[c]`` with c among the
    page's clickables, other than the 'search' button, which ``search[...]`` presses (exactly what
    WebShop executes). Anything else is invalid and must not be sent.
    """
    parsed = parse_action(text)
    if parsed is None:
        return WebAction("", "", False, "not search[...] or click[...]")
    kind, arg = parsed
    if kind == "search":
        if not arg.strip():
            return WebAction(kind, arg, False, "search[] has no keywords")
        if not has_search_bar:
            return WebAction(kind, arg, False, "this page has no search bar")
        return WebAction(kind, arg, True)
    if arg == "search" or arg not in clickables:
        return WebAction(kind, arg, False, f"nothing to click called {arg!r} on this page")
    return WebAction(kind, arg, True)


def penalized_score(reward: float, invalid_actions: int, penalty: float = INVALID_PENALTY) -> float:
    """G~ = r - penalty * n_invalid, with r in [0, 1] WebShop's reward (score / 100)."""
    if invalid_actions < 0:
        raise ValueError(f"invalid_actions must be >= 0, got {invalid_actions}")
    return reward - penalty * invalid_actions


class Tokenizer(Protocol):
    """What :func:`truncate_tokens` needs from a tokenizer (Hugging Face tokenizers fit)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


_TOKEN = re.compile(r"\S+")


def truncate_tokens(
    text: str, max_tokens: int = FEEDBACK_TOKENS, tokenizer: Tokenizer | None = None
) -> str:
    """The first ``max_tokens`` tokens of ``text``; ``text`` itself when it is not longer.

    Without a tokenizer a token is a maximal run of non-whitespace characters, and the text is cut
    right after the last kept token (its original spacing kept). With a tokenizer, the kept ids
    (no special tokens) are decoded.
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if tokenizer is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])
    if max_tokens == 0:
        return ""
    for k, match in enumerate(_TOKEN.finditer(text), start=1):
        if k == max_tokens:
            return text[: match.end()]
    return text


class _VisibleText(HTMLParser):
    """Text nodes of a page with the tag that holds each (BeautifulSoup's findAll(text=True))."""

    SPACES = " \n\t\x0c\r"
    VOID = frozenset(
        {
            "area",
            "base",
            "br",
            "col",
            "embed",
            "hr",
            "img",
            "input",
            "link",
            "meta",
            "source",
            "track",
            "wbr",
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.texts: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.stack:
            while self.stack.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if not data.strip(self.SPACES) and not {"pre", "textarea"} & set(self.stack):
            data = "\n" if "\n" in data else " "  # as BeautifulSoup does
        self.texts.append((self.stack[-1] if self.stack else "[document]", data))


_HIDDEN = frozenset({"style", "script", "head", "title", "meta", "[document]"})


def page_text(html: str) -> str:
    """A page's text as WebShop's simple text mode writes it (``convert_html_to_text``): the text
    nodes whose parent is not style/script/head/title/meta, comments dropped, each stripped, joined
    by ' [SEP] '. As there (BeautifulSoup), a blank node becomes '\\n' if it holds a newline (then
    skipped) else ' ' (kept: an empty field)."""
    parser = _VisibleText()
    parser.feed(html)
    parser.close()
    return " [SEP] ".join(
        t.strip() for parent, t in parser.texts if parent not in _HIDDEN and t != "\n"
    )


def goal_split(index: int) -> str:
    """WebShop's own fold of a goal index: 0-499 'eval' (its test goals), 500-1499 'dev',
    1500+ 'train' (``baseline_models/env.py``)."""
    if index < 0:
        raise ValueError(f"webshop goal index must be >= 0, got {index}")
    return "eval" if index < 500 else "dev" if index < 1500 else "train"


def parse_instance(instance_id: str) -> int:
    """The goal index of an instance id (a string of digits)."""
    if not instance_id.isdigit():
        raise UnknownInstance(f"webshop instance {instance_id!r} is not a goal index (digits)")
    return int(instance_id)


# -- where WebShop lives ---------------------------------------------------------------------------
def webshop_dir() -> Path | None:
    """The WebShop repository: $WEBSHOP_DIR, else the folder above an importable web_agent_site."""
    env_dir = os.environ.get("WEBSHOP_DIR")
    if env_dir:
        root = Path(env_dir).expanduser()
        return root if (root / "web_agent_site").is_dir() else None
    spec = importlib.util.find_spec("web_agent_site")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def missing_setup() -> str | None:
    """None when WebShop, its data and its search index are in place, else one line with the
    setup steps."""
    root = webshop_dir()
    if root is None:
        return SETUP
    if not any((root / "data").glob("items_shuffle*.json")):
        return (
            f"WebShop at {root} has no product data (data/items_shuffle*.json): run its "
            "`./setup.sh -d small` (needs internet)"
        )
    if not any((root / "search_engine").glob("indexes*")):
        return (
            f"WebShop at {root} has no search index (search_engine/indexes*): run its "
            "`./setup.sh` (builds it with pyserini; needs Java 11+)"
        )
    missing_java = java_missing()
    return (
        f"WebShop's search engine (pyserini) needs Java 11+: {missing_java}"
        if missing_java
        else None
    )


@register("webshop")
class WebShopEnv(Environment):
    spec = EnvSpec(
        name="webshop",
        convention="group-standardize",
        metric="success rate (score 100, i.e. reward 1.0)",
        feedback="the returned page text (WebShop's simple text mode), truncated to 512 tokens",
        max_turns=15,
        invalid_action="not executed (the page stays); counted; -0.1 each on the outcome",
        instance_format="{goal index}",
        role="You are an expert autonomous agent shopping in the WebShop online store.",
        shows_admissible=True,  # verl-agent's WebShop template lists search[...] / click[...]
    )

    def __init__(
        self,
        max_turns: int | None = None,
        tokenizer: Tokenizer | None = None,
        max_feedback_tokens: int = FEEDBACK_TOKENS,
        num_products: int | None = None,
        human_goals: bool = True,
        file_path: str | None = None,
    ) -> None:
        """``tokenizer``: truncate feedback with it (default: whitespace tokens);
        ``num_products``, ``human_goals``, ``file_path``: passed to WebAgentTextEnv (None: its
        defaults; human-written goals as in the paper)."""
        super().__init__()
        missing = missing_setup()
        if missing:
            raise EnvUnavailable(f"webshop: {missing}")
        self.max_turns = max_turns or self.spec.max_turns
        self.tokenizer = tokenizer
        self.max_feedback_tokens = max_feedback_tokens
        root = webshop_dir()
        if root is not None and str(root) not in sys.path:
            sys.path.insert(0, str(root))
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv

        kwargs: dict[str, Any] = {"num_products": num_products, "human_goals": human_goals}
        if file_path:
            kwargs["file_path"] = file_path
        self._env = WebAgentTextEnv(observation_mode="html", **kwargs)
        self._reward = 0.0

    @staticmethod
    def availability() -> str | None:
        return missing_setup()

    def _feedback(self) -> str:
        return truncate_tokens(
            page_text(self._env.state["html"]), self.max_feedback_tokens, self.tokenizer
        )

    def _goal(self, instance_id: str) -> dict[str, Any]:
        index = parse_instance(instance_id)
        goals = self._env.server.goals
        if index >= len(goals):
            raise UnknownInstance(f"webshop has goals 0-{len(goals) - 1}, not {index}")
        return goals[index]

    def _reset(self, instance_id: str) -> str:
        self._goal(instance_id)
        self._env.reset(session=parse_instance(instance_id))
        self._reward = 0.0
        return self._feedback()

    def _step(self, action: str) -> Step:
        available = self._env.get_available_actions()
        checked = check_action(action, available["has_search_bar"], available["clickables"])
        if not checked.valid:
            return Step(
                observation=self._feedback(),
                reward=0.0,
                done=False,
                valid=False,
                score=100 * self._reward,
                info={"success": False, "invalid_reason": checked.reason},
            )
        _, reward, done, _ = self._env.step(checked.command)
        self._reward = float(reward) if done else 0.0
        return Step(
            observation=self._feedback(),
            reward=self._reward,
            done=bool(done),
            valid=True,
            score=100 * self._reward,
            info={"success": bool(done) and self._reward >= 1.0},
        )

    def _outcome_value(self) -> float:
        return penalized_score(self._reward, self.invalid_actions)

    def task_description(self) -> str:
        return str(self._env.instruction_text)

    def valid_actions(self) -> list[str]:
        """The page's clicks as actions; when the page has a search bar, the first entry is the
        pattern 'search[<keywords>]' (any non-empty keywords are valid)."""
        available = self._env.get_available_actions()
        clicks = [f"click[{c}]" for c in available["clickables"] if c != "search"]
        return (["search[<keywords>]"] if available["has_search_bar"] else []) + clicks

    def category(self, instance_id: str) -> str:
        """The goal's product category (beauty, electronics, fashion, food, furniture)."""
        return str(self._goal(instance_id).get("category", "webshop"))

    def canonical_description(self, instance_id: str) -> str:
        goal = self._goal(instance_id)
        keys = (
            "asin",
            "category",
            "query",
            "instruction_text",
            "attributes",
            "goal_options",
            "price_upper",
        )
        return json.dumps(
            {"index": parse_instance(instance_id), **{k: goal.get(k) for k in keys}},
            sort_keys=True,
            default=str,
        )

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()
