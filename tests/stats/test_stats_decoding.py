"""Tables say when runs decoded under valid-action decoding (the ``decoding`` column, the
ledger's tag): a caption naming the constrained rows, and a refusal to average constrained and
free runs into one cell. The toy results are ``toy_results.py``'s."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from test_stats_tables import results
from typer.testing import CliRunner

from factor_cli.cli.app import app
from factor_cli.stats import TABLES
from factor_cli.stats.io import validate_results
from factor_cli.stats.tables import TableRequest, decoding_note

EVERY = "Every run's replies were constrained to the current admissible actions"


def tagged(decoding: dict[tuple[str, int], str]) -> pd.DataFrame:
    return validate_results(results({k: {"decoding": v} for k, v in decoding.items()}))


ALL_FREE = {("A", 1): "free", ("A", 2): "free", ("B", 1): "free", ("B", 2): "free"}
ALL_CONSTRAINED = {k: "constrained" for k in ALL_FREE}
A_CONSTRAINED = {("A", 1): "constrained", ("A", 2): "constrained", ("B", 1): "free", ("B", 2): ""}


@pytest.mark.parametrize("kind", ["main", "ablation"])
def test_every_layout_caption_says_constrained(kind: str) -> None:
    opts = {"reference": "A"} if kind == "ablation" else {}
    table = TABLES.get(kind)(TableRequest(tagged(ALL_CONSTRAINED), **opts))
    assert table.caption.endswith(f"{EVERY} (valid-action decoding, a different task).")
    free = TABLES.get(kind)(TableRequest(tagged(ALL_FREE), **opts))
    untagged = TABLES.get(kind)(TableRequest(validate_results(results()), **opts))
    assert free.caption == untagged.caption and "decoding" not in free.caption


def test_the_caption_names_the_constrained_rows() -> None:
    request = TableRequest(tagged(A_CONSTRAINED))
    note = decoding_note(request)
    assert "in the runs of A on alf, A on ws; the others decoded freely." in note
    assert note in TABLES.get("main")(request).caption
    # Only B shown: nothing shown was constrained.
    assert decoding_note(TableRequest(tagged(A_CONSTRAINED), methods=["B"])) == ""


def test_a_cell_mixing_constrained_and_free_runs_is_refused() -> None:
    mixed = tagged({**ALL_FREE, ("A", 1): "constrained"})
    with pytest.raises(ValueError, match="env=alf, method=A mix decoding=constrained") as err:
        TABLES.get("main")(TableRequest(mixed))
    assert "\n" not in str(err.value) and "--where decoding=constrained" in str(err.value)
    # Side by side as the study column of the protocol layout, it is what the table compares.
    side = TABLES.get("protocol")(TableRequest(mixed, group="decoding"))
    assert [(r[0].text, r[1].text) for r in side.rows] == [
        ("constrained", "A"),  # groups in order of first appearance (A seed 1)
        ("free", "A"),
        ("free", "B"),
    ]


def test_factor_stats_table_prints_the_note(tmp_path: Path) -> None:
    path = tmp_path / "items.csv"
    tagged(A_CONSTRAINED).to_csv(path, index=False)
    res = CliRunner().invoke(
        app, ["stats", "table", "main", "-i", str(path), "-f", "markdown"], env={"COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    assert "the runs of A on alf, A on ws; the others decoded freely" in res.output
    mixed = tmp_path / "mixed.csv"
    tagged({**ALL_FREE, ("A", 1): "constrained"}).to_csv(mixed, index=False)
    res = CliRunner().invoke(app, ["stats", "table", "main", "-i", str(mixed)])
    assert res.exit_code == 1 and "mix decoding=constrained and decoding=free" in res.output
