"""Headless Chromium for the tests that render a page (the docs site, a transcript's HTML):
the system's /usr/bin/chromium driven by playwright, with a fresh profile, recording console
errors, page errors and every request."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@dataclass
class Tab:
    page: Any
    """playwright's Page."""
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextmanager
def chromium_tab(tmp_path: Path) -> Iterator[Tab]:
    """A tab in a fresh headless Chromium; skips when Chromium or playwright is missing."""
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: apt-get install chromium, or scripts/install.sh --dev")
    playwright = pytest.importorskip(
        "playwright.sync_api", reason="pip install playwright (the dev extra)"
    )
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            tab = Tab(browser.new_page())
            tab.page.on(
                "console", lambda m: tab.errors.append(m.text) if m.type == "error" else None
            )
            tab.page.on("pageerror", lambda exc: tab.errors.append(str(exc)))
            tab.page.on("request", lambda r: tab.requests.append(r.url))
            yield tab
        finally:
            browser.close()
