"""Shared fixtures: one tiny model per test session, built from a small environment corpus
committed beside the tests (so the model needs no Java); and the rule that a test may skip only
for a reason in :data:`ALLOWED_SKIPS`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline: times are the benchmarks' business, and under two test workers on two
# cores an example can wait for a core longer than hypothesis's default 200 ms deadline.
settings.register_profile("factor", deadline=None)
settings.load_profile("factor")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (multi-process runs of a minute or more) first, in file order:
    under ``pytest -n 2`` (scripts/test.sh) they then start at once, rather than one of them
    starting last and running alone while the other worker has nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


TINY_CORPUS = Path(__file__).parent / "data" / "tiny_corpus.json"
"""``environment_corpus(max_games=30, scienceworld_games=0)`` with TextWorldExpress and
ScienceWorld available, saved (tests/policy/test_tiny_corpus.py checks it is still that)."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~1M-parameter Llama + byte-level BPE tokenizer trained on TWX gold plays and
    ScienceWorld task texts (the committed corpus: no environment, no Java)."""
    from factor_cli.policy.model import init_tiny

    texts = json.loads(TINY_CORPUS.read_text())
    return init_tiny(tmp_path_factory.mktemp("tiny") / "model", "1m", texts, seed=0)


ALLOWED_SKIPS = (
    "twx:", "twx needs Java", "scienceworld", "webshop", "alfworld is not installed",
    "vLLM is not installed", "vLLM is installed here", "this machine has a GPU", "mlflow",
    "submitit", "the docs extra", "chromium", "playwright", "running as root",
    "on a shared filesystem", "this checkout has a WebShop manifest",
    "the unprivileged user",
)  # fmt: skip
"""Substrings of the skip reasons a run may show: a missing optional runtime or extra (each
reason carries its install hint), or a machine property. Any other skip fails the run."""


def unexpected_skips(reports: list[pytest.TestReport]) -> list[str]:
    """``node id: reason`` of each skip whose reason matches no :data:`ALLOWED_SKIPS` entry."""
    out = []
    for rep in reports:
        if rep.skipped and isinstance(rep.longrepr, tuple):
            reason = str(rep.longrepr[2]).removeprefix("Skipped: ")
            if not any(allowed in reason for allowed in ALLOWED_SKIPS):
                out.append(f"{rep.nodeid}: {reason}")
    return out


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
