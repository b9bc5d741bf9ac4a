"""`factor` CLI: help lists working commands; `credit explain` on the example and on bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factor_cli.cli.main import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coin_group.json"
runner = CliRunner()


def _commands(help_text: str) -> list[str]:
    """Command names listed in a typer help page ([] for a command without sub-commands)."""
    if "Commands" not in help_text:
        return []
    block = help_text.split("Commands")[1]
    return re.findall(r"│ (\w[\w-]*)\s{2,}", block)


def test_every_listed_command_has_working_help() -> None:
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    groups = _commands(top.output)
    assert {"credit", "stats", "envs", "splits", "verify-splits", "model"} <= set(groups)
    for group in groups:
        sub = runner.invoke(app, [group, "--help"])
        assert sub.exit_code == 0, sub.output
        for cmd in _commands(sub.output):
            res = runner.invoke(app, [group, cmd, "--help"])
            assert res.exit_code == 0, res.output


def test_explain_example_json() -> None:
    res = runner.invoke(app, ["credit", "explain", str(EXAMPLE), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["methods"] == ["factor", "serl-repro"] and out["step"] == 20
    assert len(out["trajectories"]) == 4
    for tr in out["trajectories"]:
        assert abs(tr["credit_sum"]["factor"] - tr["a_seq"]) < 1e-9
        assert abs(tr["drift"]["factor"]) < 1e-9
        # SERL broadcasts A^seq to each of the T actions.
        assert tr["credit_sum"]["serl-repro"] == pytest.approx(tr["a_seq"] * len(tr["actions"]))
        for act in tr["actions"]:
            assert act["mean_weight"]["factor"] == pytest.approx(1.0, abs=1e-9)
            assert len(act["weights"]["factor"]) == len(act["tokens"])
    serl_means = [a["mean_weight"]["serl-repro"] for t in out["trajectories"] for a in t["actions"]]
    assert max(abs(m - 1) for m in serl_means) > 1e-3


def test_explain_renders_table() -> None:
    res = runner.invoke(app, ["credit", "explain", str(EXAMPLE), "-w", "--compare", "grpo"])
    assert res.exit_code == 0, res.output
    assert "win-direct" in res.output and "= A^seq ✓" in res.output and "grpo" in res.output


def test_explain_warmup_step() -> None:
    res = runner.invoke(app, ["credit", "explain", str(EXAMPLE), "--step", "3", "--json"])
    out = json.loads(res.output)
    assert out["warmup"]["factor"] is True and out["strength"]["factor"] == 0.0


def test_methods_table() -> None:
    res = runner.invoke(app, ["credit", "methods"])
    assert res.exit_code == 0
    assert "tac-serl-psi" in res.output and "gae-0.95" in res.output


def test_methods_table_fits_80_columns_uncut() -> None:
    """At 80 columns every cell is whole: nothing is cut to "…" and no row is wider."""
    from factor_cli.credit import ESTIMATORS, METHODS

    res = runner.invoke(app, ["credit", "methods"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    assert "…" not in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    methods_part, estimators_part = res.output.split("Credit estimators")
    rows = {line.split()[0]: line.split() for line in methods_part.splitlines() if line.split()}
    for name in METHODS:
        spec = METHODS.get(name)
        assert rows[name][:3] == [name, spec.estimator, spec.allocation]
        assert rows[name][-1] == (spec.reduction or "protocol")
    listed = {line.split()[0] for line in estimators_part.splitlines() if line.split()}
    assert set(ESTIMATORS) <= listed


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "group.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def _group(**change: object) -> dict:
    data = json.loads(EXAMPLE.read_text())
    data.update(change)
    return data


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: "{not json", "not valid JSON"),
        (lambda d: _group(trajectories=[]), "field trajectories: List should have at least 1 item"),
        (lambda d: _group(convention="webshop"), "unknown convention 'webshop'"),
        (lambda d: _group(colour="red"), "field colour: Extra inputs are not permitted"),
        (
            lambda d: _group(
                trajectories=[
                    {
                        **d["trajectories"][0],
                        "actions": [{**d["trajectories"][0]["actions"][0], "logp_old": [-1.0]}],
                    }
                ]
            ),
            "field trajectories[0].actions[0]: logp_old has 1 entries for 4 tokens",
        ),
        (
            lambda d: _group(trajectories=d["trajectories"][:1]),
            "group of size 1: the leave-one-out baseline needs K >= 2",
        ),
        (
            lambda d: _group(trajectories=[{**d["trajectories"][0], "outcome": "yes"}] * 2),
            "field trajectories[0].outcome",
        ),
    ],
)
def test_explain_bad_file_one_line_error(tmp_path: Path, make, message: str) -> None:
    path = _write(tmp_path, make(json.loads(EXAMPLE.read_text())))
    res = runner.invoke(app, ["credit", "explain", str(path)])
    assert res.exit_code == 1
    assert message in res.output
    assert res.output.strip().startswith("error:") and str(path) in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_explain_missing_file_and_bad_method(tmp_path: Path) -> None:
    res = runner.invoke(app, ["credit", "explain", str(tmp_path / "nope.json")])
    assert res.exit_code == 1 and "no such file" in res.output
    res = runner.invoke(app, ["credit", "explain", str(EXAMPLE), "--method", "factr"])
    assert res.exit_code == 1 and "unknown method 'factr'; valid:" in res.output
