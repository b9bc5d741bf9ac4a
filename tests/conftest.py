"""Shared fixtures: one tiny model per test session, built from a small environment corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from factor_cli.envs import availability

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
    """A ~1M-parameter Llama + byte-level BPE tokenizer trained on TWX gold plays."""
    missing = availability("twx")
    if missing:
        pytest.skip(f"the tiny-model corpus needs TextWorldExpress: {missing}")
    from factor_cli.policy.corpus import environment_corpus
    from factor_cli.policy.model import init_tiny

    texts = environment_corpus(max_games=30, scienceworld_games=0)
    return init_tiny(tmp_path_factory.mktemp("tiny") / "model", "1m", texts, seed=0)
