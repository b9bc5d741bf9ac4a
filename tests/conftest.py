"""Shared fixtures: one tiny model per test session, built from a small environment corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from factor_cli.envs import availability


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
