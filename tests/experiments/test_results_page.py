"""docs/RESULTS.md is what ``experiments/mini_results.py render`` makes of the committed files
under docs/results/: a fresh clone regenerates every table from them, and the page in the
repository is never stale (issue 29)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _module():
    path = REPO / "experiments" / "mini_results.py"
    spec = importlib.util.spec_from_file_location("mini_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mini_results"] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_committed_results_render_to(tmp_path: Path) -> None:
    mr = _module()
    results = tmp_path / "results"  # render writes its pictures beside the data: work on a copy
    import shutil

    shutil.copytree(REPO / "docs" / "results", results)
    text = mr.render(results, REPO / "experiments" / "RESULTS.md.in")
    assert text == (REPO / "docs" / "RESULTS.md").read_text(), (
        "docs/RESULTS.md is stale: run .venv/bin/python experiments/mini_results.py render"
    )
    for study in (p for p in results.iterdir() if (p / "items.csv").exists()):
        assert (study / "curves.png").stat().st_size > 1000


def test_setting_labels() -> None:
    assert _module().setting_of(3, 6) == "coin3 T6"
