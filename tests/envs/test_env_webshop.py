"""WebShop adapter: the pure parts exactly; the live text environment only where it is set up."""

from __future__ import annotations

from typing import ClassVar

import pytest

from factor_cli.envs import EnvUnavailable, UnknownInstance, make_env
from factor_cli.envs import webshop as ws

CLICKABLES = ["back to search", "< prev", "description", "buy now", "b09abc1234", "large"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("search[Red Running Shoes]", ("search", "red running shoes")),
        ("  click[Buy Now]\n", ("click", "buy now")),
        ("click[ < Prev ]", ("click", " < prev ")),  # WebShop does not strip the argument
        ("search[x] and more", ("search", "x")),  # nor look past the first full match
        ("click[a [b] c]", None),  # greedy: the name would be 'click[a '
        ("search[]", None),
        ("Search[shoes]", None),
        ("buy now", None),
        ("click buy now", None),
        ("think: search[shoes]", None),
        ("search[a\nb]", None),
    ],
)
def test_parse_action(text: str, expected: tuple[str, str] | None) -> None:
    assert ws.parse_action(text) == expected


@pytest.mark.parametrize(
    ("text", "bar", "valid", "reason"),
    [
        ("search[shoes]", True, True, ""),
        ("search[shoes]", False, False, "no search bar"),
        ("search[  ]", True, False, "no keywords"),
        ("click[ buy now]", False, False, "nothing to click"),
        ("click[Buy Now]", False, True, ""),
        ("click[b09abc1234]", False, True, ""),
        ("click[medium]", False, False, "nothing to click"),
        ("click[search]", True, False, "nothing to click"),
        ("purchase", False, False, "not search"),
    ],
)
def test_check_action(text: str, bar: bool, valid: bool, reason: str) -> None:
    checked = ws.check_action(text, bar, [*CLICKABLES, "search"])
    assert checked.valid is valid
    assert reason in checked.reason and (checked.reason == "") is valid


def test_checked_command_is_webshop_syntax() -> None:
    assert ws.check_action(" click[Buy Now] ", False, CLICKABLES).command == "click[buy now]"


@pytest.mark.parametrize(
    ("reward", "invalid", "expected"),
    [(1.0, 0, 1.0), (0.5, 2, 0.3), (0.0, 3, -0.3), (0.75, 0, 0.75)],
)
def test_penalized_score(reward: float, invalid: int, expected: float) -> None:
    assert ws.penalized_score(reward, invalid) == pytest.approx(expected, abs=1e-12)


def test_penalized_score_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="invalid_actions"):
        ws.penalized_score(1.0, -1)


def test_truncate_whitespace_tokens() -> None:
    text = "WebShop [SEP] Instruction:  [SEP]\ni need shoes"
    assert ws.truncate_tokens(text, 3) == "WebShop [SEP] Instruction:"
    assert ws.truncate_tokens(text, 5) == "WebShop [SEP] Instruction:  [SEP]\ni"
    assert ws.truncate_tokens(text, 8) == text
    assert ws.truncate_tokens(text, 0) == ""
    long = " ".join(f"w{i}" for i in range(600))
    cut = ws.truncate_tokens(long)
    assert cut.split() == [f"w{i}" for i in range(512)]
    with pytest.raises(ValueError, match="max_tokens"):
        ws.truncate_tokens(text, -1)


class CharTokenizer:
    """A stand-in tokenizer: one id per character."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


def test_truncate_with_a_tokenizer() -> None:
    assert ws.truncate_tokens("abcdef", 4, CharTokenizer()) == "abcd"
    assert ws.truncate_tokens("abc", 4, CharTokenizer()) == "abc"


PAGE = """<!DOCTYPE html>
<html>
<head><title>WebShop</title><style>body { color: red; }</style></head>
<body>
<div id="instruction-text" class="text-center">
<h4>Instruction: <br>i need a long clip-in hair extension, and price lower than 40.00 dollars</h4>
</div>
<!-- a comment -->
<form><input id="search_input" type="text" name="search_query">
<button class="btn" type="submit">Search</button></form>
<script>var x = 1;</script>
<p>Total results: 50 &amp; more</p></body>
</html>"""


def test_page_text_matches_webshop_simple_mode() -> None:
    # WebShop's convert_html_to_text(simple=True) (BeautifulSoup): visible text nodes, stripped,
    # joined by ' [SEP] '. Expected values checked against BeautifulSoup 4.15 on the same input.
    assert ws.page_text(PAGE) == (
        "Instruction: [SEP] i need a long clip-in hair extension, and price lower than 40.00"
        " dollars [SEP] Search [SEP] Total results: 50 & more"
    )


@pytest.mark.parametrize(
    ("html", "text"),
    [
        ("<p>a</p><p>b</p>", "a [SEP] b"),
        ("<body>\n  <p>a</p>\n</body>", "a"),  # a blank node with a newline is dropped
        ("<div>  <p>a</p></div>", " [SEP] a"),  # one without is kept as an empty field
        ("<pre>  </pre><p>x</p>", " [SEP] x"),
        ("<head><meta charset='utf-8'><title>t</title></head><p>x<b>y</b></p>", "x [SEP] y"),
        ("loose text <!-- c --><p>kept</p>", "kept"),
        ("<h4>a</h5><div>b</div>", "a [SEP] b"),  # WebShop's templates mismatch end tags
        ("<p>a &lt;b&gt; &amp; c</p>", "a <b> & c"),
    ],
)
def test_page_text_small_cases(html: str, text: str) -> None:
    assert ws.page_text(html) == text


@pytest.mark.parametrize(
    ("index", "fold"),
    [(0, "eval"), (499, "eval"), (500, "dev"), (1499, "dev"), (1500, "train"), (12086, "train")],
)
def test_goal_split(index: int, fold: str) -> None:
    assert ws.goal_split(index) == fold


def test_goal_split_and_ids_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="goal index"):
        ws.goal_split(-1)
    assert ws.parse_instance("42") == 42
    for bad in ("", "-1", "4.2", "goal 4"):
        with pytest.raises(UnknownInstance, match="webshop"):
            ws.parse_instance(bad)


def test_missing_setup_names_each_step(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "WebShop"
    monkeypatch.setenv("WEBSHOP_DIR", str(repo))
    assert ws.missing_setup() == ws.SETUP  # no web_agent_site there
    (repo / "web_agent_site").mkdir(parents=True)
    assert "no product data" in ws.missing_setup()
    (repo / "data").mkdir()
    (repo / "data" / "items_shuffle_1000.json").write_text("[]")
    assert "no search index" in ws.missing_setup()
    (repo / "search_engine" / "indexes_1k").mkdir(parents=True)
    monkeypatch.setattr(ws, "java_missing", lambda: "Java is not installed")
    assert ws.missing_setup() == (
        "WebShop's search engine (pyserini) needs Java 11+: Java is not installed"
    )
    monkeypatch.setattr(ws, "java_missing", lambda: None)
    assert ws.missing_setup() is None


def test_unavailable_webshop_fails_with_the_setup_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WEBSHOP_DIR", str(tmp_path / "nowhere"))
    assert ws.WebShopEnv.availability() == ws.SETUP
    with pytest.raises(
        EnvUnavailable, match=r"git clone https://github\.com/princeton-nlp/WebShop"
    ):
        make_env("webshop")
    with pytest.raises(EnvUnavailable, match=r"setup\.sh"):
        ws.WebShopEnv()


def test_spec() -> None:
    spec = ws.WebShopEnv.spec
    assert (spec.name, spec.convention, spec.max_turns) == ("webshop", "group-standardize", 15)


_MISSING = ws.WebShopEnv.availability()


@pytest.mark.skipif(_MISSING is not None, reason=f"webshop: {_MISSING}")
def test_live_episode() -> None:
    with make_env("webshop") as env:
        obs = env.reset("0")
        assert env.task_description() and len(obs.split()) <= ws.FEEDBACK_TOKENS
        bad = env.step("click[no such button]")
        assert not bad.valid and bad.observation == obs
        step = env.step(f"search[{env.task_description()}]")
        assert step.valid and not step.done
        assert env.outcome().outcome == pytest.approx(-0.1)
        assert env.category("0") and env.canonical_description("0").startswith('{"asin"')


# -- the adapter's own logic, on a stand-in with WebAgentTextEnv's interface -----------------------
class _StandInTextEnv:
    """Not WebShop: three pages with WebAgentTextEnv's interface (state['html'], reset(session),
    step(action), get_available_actions(), server.goals, instruction_text), so the adapter's glue
    (validity, feedback, reward, outcome) is tested here; test_live_episode runs the real site."""

    PAGES: ClassVar[dict[str, str]] = {
        "search": '<div id="instruction-text"><h4>Instruction: <br>{goal}</h4></div>'
        '<input id="search_input"><button class="btn">Search</button>',
        "results": '<button class="btn">Back to Search</button>'
        '<a class="product-link">B0001</a><h4>Red shirt</h4>',
        "item": '<button class="btn">Buy Now</button><p>{words}</p>',
    }

    def __init__(self, observation_mode: str, **kwargs: object) -> None:
        assert observation_mode == "html"
        self.server = type(
            "Server",
            (),
            {
                "goals": [
                    {"asin": "B0001", "category": "fashion", "instruction_text": "a red shirt"},
                    {"asin": "B0002", "category": "food", "instruction_text": "cheap tea"},
                ]
            },
        )()
        self.page, self.goal = "search", self.server.goals[0]

    @property
    def instruction_text(self) -> str:
        return self.goal["instruction_text"]

    @property
    def state(self) -> dict:
        words = " ".join(f"w{i}" for i in range(600))
        return {"html": self.PAGES[self.page].format(goal=self.instruction_text, words=words)}

    def reset(self, session: int) -> tuple[str, None]:
        self.page, self.goal = "search", self.server.goals[session]
        return self.state["html"], None

    def get_available_actions(self) -> dict:
        clicks = {
            "search": ["search"],
            "results": ["back to search", "b0001"],
            "item": ["buy now"],
        }[self.page]
        return {"has_search_bar": self.page == "search", "clickables": clicks}

    def step(self, action: str) -> tuple[str, float, bool, None]:
        done = action == "click[buy now]"
        moves = {"search[a red shirt]": "results", "click[b0001]": "item"}
        self.page = moves.get(action, self.page)
        return self.state["html"], 1.0 if done else 0.0, done, None

    def close(self) -> None:
        pass


@pytest.fixture()
def stand_in(tmp_path, monkeypatch: pytest.MonkeyPatch):
    import sys
    import types

    repo = tmp_path / "WebShop"
    for sub in ("web_agent_site", "data", "search_engine/indexes_1k"):
        (repo / sub).mkdir(parents=True)
    (repo / "data" / "items_shuffle_1000.json").write_text("[]")
    monkeypatch.setenv("WEBSHOP_DIR", str(repo))
    monkeypatch.setattr(ws, "java_missing", lambda: None)
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = types.ModuleType("web_agent_site.envs.web_agent_text_env")
    module.WebAgentTextEnv = _StandInTextEnv  # type: ignore[attr-defined]
    for name in ("web_agent_site", "web_agent_site.envs"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with ws.WebShopEnv() as env:
        yield env


def test_adapter_episode_on_the_stand_in(stand_in) -> None:
    env = stand_in
    obs = env.reset("0")
    assert obs == "Instruction: [SEP] a red shirt [SEP] Search"
    assert env.task_description() == "a red shirt"
    assert env.valid_actions() == ["search[<keywords>]"]
    bad = env.step("click[B0001]")  # not on this page
    assert (bad.valid, bad.observation, bad.info["invalid_reason"]) == (
        False,
        obs,
        "nothing to click called 'b0001' on this page",
    )
    results = env.step("search[A Red Shirt]").observation
    assert results == "Back to Search [SEP] B0001 [SEP] Red shirt"
    assert env.valid_actions() == ["click[back to search]", "click[b0001]"]
    item = env.step("click[B0001]")
    assert item.observation.split()[:3] == ["Buy", "Now", "[SEP]"]
    assert len(item.observation.split()) == ws.FEEDBACK_TOKENS  # 600 words cut to 512 tokens
    assert not env.step("search[tea]").valid  # no search bar on an item page
    last = env.step("click[Buy Now]")
    assert (last.done, last.reward, last.score, env.success) == (True, 1.0, 100.0, True)
    out = env.outcome()
    assert (out.invalid_actions, out.turns) == (2, 5)
    assert out.outcome == pytest.approx(1.0 - 2 * 0.1)


def test_adapter_instances_on_the_stand_in(stand_in) -> None:
    assert stand_in.category("1") == "food"
    assert '"index": 1' in stand_in.canonical_description("1")
    with pytest.raises(UnknownInstance, match="goals 0-1"):
        stand_in.reset("2")
    with pytest.raises(UnknownInstance):
        stand_in.reset("x")
