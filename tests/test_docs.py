"""The documentation: the README stays a landing page, the site's navigation holds every page,
nothing cites a document outside the repository, and the built site renders in headless Chromium
with its math typeset and no console error (docs/development.md, "The documentation site")."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from browser import chromium_tab

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 250
REPO_URL = "https://example.invalid/factor"  # .invalid: never resolves, never fetched


def _hooks() -> ModuleType:
    """docs/hooks/factor_docs.py, which needs mkdocs (the docs extra)."""
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]' (the docs extra)")
    spec = importlib.util.spec_from_file_location("factor_docs", DOCS / "hooks" / "factor_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_landing_page_whose_links_resolve() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if "://" not in t and not (REPO / t).exists()]
    assert missing == []


def _nav_pages(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from _nav_pages(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from _nav_pages(value)


def mkdocs_config() -> dict[str, Any]:
    """mkdocs.yml as data; its ``!ENV [NAME, default]`` values read as their default."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!ENV", lambda loader, node: loader.construct_sequence(node)[-1])
    return yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


def test_every_docs_page_is_in_the_navigation_and_every_entry_exists() -> None:
    config = mkdocs_config()
    nav = set(_nav_pages(config["nav"]))
    on_disk = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "hooks" not in p.parts}
    generated = set(_hooks().api_pages())
    assert on_disk - nav == set(), "add these pages to nav: in mkdocs.yml"
    assert nav - on_disk - generated == set(), "nav: names pages that do not exist"


def test_nothing_cites_a_document_outside_the_repository() -> None:
    # Built from pieces so that this file does not match itself.
    outside = re.compile("DES" + "IGN|" + "shared" + "/")
    roots = ["factor_cli", "tests", "benchmarks", "examples", "scripts", "docs", "README.md"]
    hits = []
    for root in roots:
        path = REPO / root
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            if not f.is_file() or "__pycache__" in f.parts:
                continue
            try:
                text = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # images and other binaries
            hits += [
                f"{f.relative_to(REPO)}:{n}"
                for n, line in enumerate(text.splitlines(), 1)
                if outside.search(line)
            ]
    assert hits == [], "cite docs/design.md (by section) instead"


def test_generated_tables_come_from_the_code() -> None:
    hooks = _hooks()
    reference = hooks.config_reference()
    for field in ("`rollout.prefix_reuse`", "`credit.eta_0`", "`value.tau`"):
        assert field in reference
    methods = hooks.methods_table()
    for name in ("`factor`", "`grpo`", "`serl-repro`", "`ppo`"):
        assert f"| {name} |" in methods


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built strictly, as scripts/test.sh builds it."""
    _hooks()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "FACTOR_REPO_URL": REPO_URL}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_header_links_the_repository_the_build_names(site: Path) -> None:
    """No public address is known, so mkdocs.yml reads it from FACTOR_REPO_URL: a site built
    with it shows the link in every page's header."""
    for page in ("index.html", "tutorial/index.html"):
        html = (site / page).read_text()
        assert re.search(rf'<a href="{re.escape(REPO_URL)}"[^>]*class="md-source"', html), page


@pytest.mark.parametrize(
    ("page", "title", "math"),
    [
        ("", "factor", True),
        ("training/", "Training - factor", True),
        ("design/", "Design - factor", True),
        ("api/credit/", "factor_cli.credit - factor", False),
        ("installation/", "Installation - factor", False),
        ("tutorial/", "A first experiment - factor", True),
        ("glossary/", "Concepts and glossary - factor", True),
        ("howto/add-environment/", "Add an environment - factor", True),
    ],
)
def test_the_site_renders_in_chromium_with_its_math_and_no_console_error(
    site: Path, tmp_path: Path, page: str, title: str, math: bool
) -> None:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        with chromium_tab(tmp_path) as tab:
            tab.page.goto(base + page, wait_until="networkidle")
            assert tab.page.title() == title
            tab.page.wait_for_function("() => window.MathJax && MathJax.startup?.promise")
            tab.page.evaluate("() => MathJax.startup.promise")  # typesetting has finished
            marked = tab.page.locator(".arithmatex").count()
            assert tab.page.locator("mjx-container").count() == marked
            assert (marked > 0) == math
            assert tab.page.locator('[data-mml-node="merror"]').count() == 0  # no TeX error
            if page.startswith("api/"):
                assert tab.page.locator("#factor_cli\\.credit\\.tac\\.td_action_credit").count()
    finally:
        server.shutdown()
    assert tab.errors == []
    assert [u for u in tab.requests if not u.startswith(base)] == []  # nothing from the network
