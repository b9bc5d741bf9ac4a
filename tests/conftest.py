"""Shared fixtures: one tiny model per test session, built from a small environment corpus
committed beside the tests (so the model needs no Java); and the rule that a test may skip only
for a reason in ``suite_rules.ALLOWED_SKIPS``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import settings
from suite_rules import TINY_CORPUS, unexpected_skips

# No per-example deadline: times are the benchmarks' business, and under two test workers on two
# cores an example can wait for a core longer than hypothesis's default 200 ms deadline.
settings.register_profile("factor", deadline=None)
settings.load_profile("factor")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (multi-process runs of a minute or more) first, in file order:
    under ``pytest -n 2`` (scripts/test.sh) they then start at once, rather than one of them
    starting last and running alone while the other worker has nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~1M-parameter Llama + byte-level BPE tokenizer trained on TWX gold plays and
    ScienceWorld task texts (the committed corpus: no environment, no Java)."""
    from factor_cli.policy.model import init_tiny

    texts = json.loads(TINY_CORPUS.read_text())
    return init_tiny(tmp_path_factory.mktemp("tiny") / "model", "1m", texts, seed=0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a run that skipped a test for a reason nobody allowed (a silent skip hides a
    broken test as well as a failure would)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput"):  # xdist workers: the
        return  # controller sees every report
    bad = unexpected_skips(reporter.stats.get("skipped", []))
    if bad:
        reporter.write_line("skips whose reason is not in tests/conftest.py ALLOWED_SKIPS:")
        for line in bad:
            reporter.write_line(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
