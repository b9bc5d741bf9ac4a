"""`factor study plan|run --axis`: an axis' values replaced from the command line, including
values with commas in them (coin's params) as a YAML list, so one horizon of a zipped study can
run in its own sitting with the same cells (same keys) as the whole spec."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from factor_cli.cli.main import app

runner = CliRunner()
COIN3 = "numLocations=3,numDistractorItems=0,includeDoors=0"


def _plan(*args: str) -> dict:
    res = runner.invoke(app, ["study", "plan", "mini", "--json", *args], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_a_yaml_list_keeps_the_commas_and_selects_the_specs_own_cells() -> None:
    whole = _plan()
    one = _plan(f'--axis=env.options.params.coin=["{COIN3}"]', "--axis", "env.max_turns=6")
    assert len(whole["cells"]) == 30 and len(one["cells"]) == 15
    assert {c["point"]["env.options.params.coin"] for c in one["cells"]} == {COIN3}
    expected = {c["key"] for c in whole["cells"] if c["point"]["env.max_turns"] == 6}
    assert {c["key"] for c in one["cells"]} == expected


def test_comma_separated_values_split_as_before() -> None:
    two = _plan("--axis", "env.max_turns=6,12", "--seeds", "1")
    assert sorted({c["point"]["env.max_turns"] for c in two["cells"]}) == [6, 12]


def test_a_broken_list_is_a_one_line_error() -> None:
    res = runner.invoke(app, ["study", "plan", "mini", "--axis", "env.max_turns=[6"])
    err = res.stderr.strip()
    assert res.exit_code != 0 and err.startswith("error: --axis") and "\n" not in err, err
    assert "YAML list" in err
    empty = runner.invoke(app, ["study", "plan", "mini", "--axis", "env.max_turns=[]"])
    assert empty.exit_code != 0 and "non-empty list" in empty.stderr
