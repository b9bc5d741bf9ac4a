"""Rendering ``factor study report`` with rich: the report's tables, lines, notes and files.

The library builds the report (:mod:`factor_cli.studies.report`); this module only prints it.
Every table goes through the renderer of ``factor stats table`` (escaped text, bold where the
table says so); notes and summary lines are :class:`rich.text.Text`, never markup, so labels
such as ``factor[credit.tau=0.5]`` print as they are. Nothing heavy is imported at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console

    from factor_cli.studies.report import StudyReport


def header(report: StudyReport) -> Text:
    """``TITLE: F of N cells finished (spec hash H)`` as literal text."""
    return Text.assemble(
        (report.title, "bold"),
        f": {report.finished} of {report.cells} cells finished with results "
        f"(study {report.study}, spec hash {report.spec_hash[:16]})",
    )


def render(report: StudyReport, console: Console) -> None:
    """Print the report: header, notes, each table (the bootstrap lines after its table)."""
    from factor_cli.cli.stats import rich_table

    console.print(header(report), soft_wrap=True)
    for note in report.notes:
        console.print(Text.assemble(("note:", "yellow"), " ", note), soft_wrap=True)
    for name, table in report.tables.items():
        console.print(rich_table(table))
        if name == "bootstrap":
            for line in report.lines:
                console.print(Text(line), soft_wrap=True)
