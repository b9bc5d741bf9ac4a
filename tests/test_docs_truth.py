"""The documentation stays true to the code: lists render as lists, no internal issue numbers,
every command the docs name exists, every diagnostic kind and shipped study spec is documented
and none is called missing, and math is typeset wherever the site typesets math
(docs/development.md, "The documentation site").

The facts come from the code at test time (the CLI's command tree, the diagnose kinds, the
shipped specs in experiments/studies/), so the rules keep holding as the code grows. Each rule is
a function from a page's text to its findings, so a test can plant a defect and see it caught.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import typer
from test_docs import _nav_pages as _nav
from test_docs import mkdocs_config

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
GLOSSARY = "glossary.md"


def pages() -> dict[str, str]:
    """Every hand-written page (the generated API pages are not on disk) and the README."""
    out = {
        p.relative_to(DOCS).as_posix(): p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md")
    }
    out["README.md"] = (REPO / "README.md").read_text(encoding="utf-8")
    return dict(sorted(out.items()))


FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced and indented code blocks and display math."""
    fenced = math = False
    previous = ""
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif line.strip() == "$$":
            math = not math
        elif not (fenced or math):
            indented_code = line.startswith("    ") and not previous.strip()
            indented_code |= line.startswith("    ") and previous.startswith("    ")
            indented_code &= not line.lstrip().startswith(("-", "*", "|", "1."))
            if not indented_code:
                yield n, line
        previous = line


def code_text(text: str) -> Iterator[tuple[int, str]]:
    """(line number, code) of every inline code span and every line of a fenced or indented
    code block: where a command is written."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif fenced or (line.startswith("    ") and line.lstrip().startswith("factor ")):
            yield n, line.split(" # ")[0]  # a shell comment is prose
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


# ----------------------------------------------------------------------------- rule: lists

LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+\.) \S")


def lists_without_blank_line(text: str) -> list[int]:
    """Lines starting a list right under a paragraph: Python-Markdown runs them into it."""
    found = []
    previous = ""
    for n, line in prose_lines(text):
        item = LIST_ITEM.match(line)
        if item and not item.group(1) and previous.strip():
            starts_block = previous.startswith((" ", "\t", "|", "#", ">", "<!--", "!!!", "$$"))
            if not LIST_ITEM.match(previous) and not starts_block:
                found.append(n)
        previous = line
    return found


# ----------------------------------------------------------------------------- rule: issues

ISSUE = re.compile(r"\bissues?[ -]#?\d+|(?<![\w&/#(])#\d+\b", re.IGNORECASE)


def issue_mentions(text: str) -> list[int]:
    """Internal issue numbers: a reader of the docs cannot look them up."""
    return [n for n, line in prose_lines(text) if ISSUE.search(re.sub(r"`[^`]*`", "", line))]


# ----------------------------------------------------------------------------- rule: commands


@cache
def command_tree() -> dict[str, set[str] | None]:
    """What `factor --help` lists: each visible command, with its visible subcommands (None for
    a command without subcommands)."""
    from factor_cli.cli.main import app

    root = typer.main.get_command(app)
    tree: dict[str, set[str] | None] = {}
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        if cmd.hidden:
            continue
        subs = getattr(cmd, "commands", None)
        tree[name] = None if subs is None else {s for s, c in subs.items() if not c.hidden}
    return tree


@cache
def diagnose_kinds() -> tuple[str, ...]:
    """The kinds `factor diagnose KIND` accepts."""
    from factor_cli.cli.diagnose import KIND_SUMMARIES

    return tuple(KIND_SUMMARIES)


@cache
def shipped_specs() -> tuple[str, ...]:
    """The study specs in experiments/studies/."""
    return tuple(sorted(p.stem for p in (REPO / "experiments" / "studies").glob("*.yaml")))


WORD = re.compile(r"^[a-z][a-z0-9-]*$")
FACTOR = re.compile(r"(?:^|[\s`(|$])factor ((?:[\w./\\|-]+ ?)+)")


def unknown_commands(text: str) -> list[str]:
    """`factor X [Y]` written in code where X is not a listed command, Y not a subcommand of
    group X, or, for `factor diagnose KIND`, KIND not a kind."""
    tree, found = command_tree(), []
    for n, code in code_text(text):
        for match in FACTOR.finditer(code):
            words = [w for w in re.split(r"\s+|\\\||/", match.group(1)) if w]
            if not words or not WORD.match(words[0]):
                continue
            name, rest = words[0], words[1:]
            if name not in tree:
                found.append(f"{n}: factor {name}")
                continue
            subs = tree[name]
            alternatives = [w for w in rest if WORD.match(w)]
            if subs is not None:
                # `factor ledger list / show / report`: each alternative is a subcommand
                for word in alternatives if re.search(r" / |\\\|", code) else alternatives[:1]:
                    if word not in subs:
                        found.append(f"{n}: factor {name} {word}")
            elif name == "diagnose" and alternatives and alternatives[0] not in diagnose_kinds():
                found.append(f"{n}: factor diagnose {alternatives[0]}")
    return found


# ----------------------------------------------------------------------------- rule: kinds, specs

MISSING = re.compile(
    r"not (?:yet )?(?:built|implemented|shipped|available)|to be built|planned|coming soon",
    re.IGNORECASE,
)


def called_missing(text: str, names: tuple[str, ...]) -> list[str]:
    """A paragraph that says a shipped kind or spec (in backticks) is not built."""
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        if MISSING.search(paragraph):
            found += [n for n in names if re.search(rf"`(?:[^`]*\s)?{re.escape(n)}`", paragraph)]
    return found


def table_names(text: str) -> set[str]:
    """The first column of a Markdown table, where it is a code span."""
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE))


# ----------------------------------------------------------------------------- rule: math

PLAIN_MATH = re.compile(
    r"""A\^(?:seq|MC)\b | A\*_t | \bV~ | \b[wL]-bar | \bV_target\b | \bpi_(?:old|theta|T)\b
    | \blog\ pi\b | \bH\(rho\) | \bDelta\ G\b
    | \b(?:eta|alpha|lambda|tau|omega|rho|Phi|Delta|psi|gamma)_[0-9a-z{]
    | \b[xa]_(?:t|0|\{) | \b[rVAGTL]_(?:\{|t\b|i\b|0\b|T\b|k\b)""",
    re.VERBOSE,
)


def plain_math(text: str, allow_code: bool = False) -> list[str]:
    """Math written as plain text (`eta_k`, V~(x_0), A^seq) in prose, or as a code span that is
    only a symbol, where the site typesets TeX. Outside $...$; code blocks are code."""
    found = []
    for n, line in prose_lines(text):
        line = re.sub(r"\$[^$]+\$", "", line)
        for span in re.findall(r"`([^`]+)`", line):
            symbol_only = PLAIN_MATH.search(span) and not re.search(r"[.=\[\]:\"']|--", span)
            if symbol_only and not allow_code:
                found.append(f"{n}: `{span}`")
        line = re.sub(r"`[^`]*`", "", line)
        found += [f"{n}: {m.group(0)}" for m in PLAIN_MATH.finditer(line)]
    return found


# ----------------------------------------------------------------------------- the tests

PAGES = pages()


@pytest.mark.parametrize("page", list(PAGES))
def test_every_list_has_its_blank_line(page: str) -> None:
    assert lists_without_blank_line(PAGES[page]) == [], "add a blank line before the list"


@pytest.mark.parametrize("page", list(PAGES))
def test_no_page_cites_an_issue_number(page: str) -> None:
    assert issue_mentions(PAGES[page]) == [], "say what the work was, not its issue number"


@pytest.mark.parametrize("page", list(PAGES))
def test_every_command_named_exists(page: str) -> None:
    assert unknown_commands(PAGES[page]) == [], "not in `factor --help`"


@pytest.mark.parametrize("page", [p for p in PAGES if p != "README.md"])
def test_math_is_typeset(page: str) -> None:
    assert plain_math(PAGES[page], allow_code=page == GLOSSARY) == [], "write it as $...$ TeX"


def test_every_diagnose_kind_is_documented_and_none_called_missing() -> None:
    kinds = diagnose_kinds()
    assert set(kinds) <= table_names(PAGES["diagnostics.md"]), "a kind missing from the table"
    rows = PAGES["README.md"].splitlines()
    readme_row = next(ln for ln in rows if ln.startswith("| `factor diagnose"))
    assert [k for k in kinds if f"`{k}`" not in readme_row] == []
    assert {p: called_missing(t, kinds) for p, t in PAGES.items() if called_missing(t, kinds)} == {}


def test_every_shipped_spec_is_documented_and_listed_by_the_cli() -> None:
    from typer.testing import CliRunner

    from factor_cli.cli.main import app

    specs = shipped_specs()
    assert specs and set(specs) <= table_names(PAGES["studies.md"]), "add it to the spec table"
    found = {p: called_missing(t, specs) for p, t in PAGES.items() if called_missing(t, specs)}
    assert found == {}
    for command in ("plan", "run", "status", "report"):
        result = CliRunner().invoke(app, ["study", command, "--help"], env={"COLUMNS": "300"})
        assert [s for s in specs if s not in result.output] == [], f"factor study {command}"


REQUIRED_PAGES = [
    "installation.md",
    "tutorial.md",
    "glossary.md",
    "howto/add-environment.md",
    "howto/add-method.md",
    "howto/study-spec.md",
    "howto/slurm.md",
    "howto/multi-gpu.md",
    "about.md",
    "changelog.md",
]


def test_the_user_pages_exist_and_are_in_the_navigation() -> None:
    nav = list(_nav(mkdocs_config()["nav"]))
    assert [p for p in REQUIRED_PAGES if p not in nav or p not in PAGES] == []
    for name in ("LICENSE", "CITATION.cff", "CHANGELOG.md"):
        assert (REPO / name).is_file()
    assert "Apache License" in (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "2608.07118" in (REPO / "CITATION.cff").read_text(encoding="utf-8")


GLOSSARY_TERMS = {
    "a-seq": "A^{seq}",
    "a-star": "TD Action Credit",
    "allocation": "Hindsight Token Allocation",
    "b-m": "$M$",
    "group-k": "$K$",
    "w": "$W$",
    "eta-k": "\\eta_k",
    "boundary": "\\tilde V",
    "macro-success": "category",
    "group-signal": "group_signal",
    "hindsight-gap": "\\Delta_{t,j}",
    "conventions": "leave-one-out",
}


def test_the_glossary_defines_each_term_and_the_first_use_links_to_it() -> None:
    text = PAGES[GLOSSARY]
    for anchor, term in GLOSSARY_TERMS.items():
        heading = rf"^#+ (.*) \{{#{re.escape(anchor)}[^}}]*\}}\n"
        entry = re.search(heading + r"((?:(?!#).*\n)*)", text, re.M)
        assert entry, f"no glossary entry #{anchor}"
        assert term in entry.group(0), f"#{anchor} does not define {term}"
    assert "per-Action Mean" in text
    # TAC, HTA and APM are spelled out where a reader meets them first, in navigation order.
    order = [p for p in _nav(mkdocs_config()["nav"]) if p in PAGES and p != GLOSSARY]
    for abbreviation in ("TAC", "HTA", "APM"):
        first = next(p for p in order if re.search(rf"\b{abbreviation}\b", PAGES[p]))
        paragraph = next(  # a paragraph, or one item of a list
            par
            for par in re.split(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.) )", PAGES[first])
            if re.search(rf"\b{abbreviation}\b", par)
        )
        assert "glossary.md" in paragraph, f"{first}: link {abbreviation} to the glossary"
