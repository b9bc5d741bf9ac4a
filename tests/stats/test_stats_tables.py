"""The paper's table layouts on small hand-computable results, and their exports."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from toy_results import ITEMS, SUCCESS

from factor_cli.stats import KINDS, TABLES, reference_deltas, to_csv, to_latex, to_markdown
from factor_cli.stats.io import validate_results
from factor_cli.stats.tables import (
    AUTO,
    DEFAULT_CATEGORY_ENV,
    EXPORTS,
    Cell,
    TableOptionError,
    TableRequest,
    cell_text,
    format_number,
    protocol_table,
)

SD_25 = 25 / math.sqrt(2)  # sample std of {50, 75}: 17.68
SD_50 = 50 / math.sqrt(2)  # sample std of {0, 50} or {50, 100}: 35.36


def results(extra: dict[tuple[str, int], dict[str, object]] | None = None) -> pd.DataFrame:
    rows = []
    for (method, seed), succ in SUCCESS.items():
        for (env, item, cat), s in zip(ITEMS, succ, strict=True):
            row = {
                "env": env,
                "method": method,
                "seed": seed,
                "item_id": item,
                "category": cat,
                "success": s,
                "score": float(s),
            }
            row.update((extra or {}).get((method, seed), {}))
            rows.append(row)
    return pd.DataFrame(rows)


def values(table, column: str) -> list[tuple[float | None, float | None, bool]]:
    j = table.columns.index(column)
    return [(r[j].value, r[j].std, r[j].bold) for r in table.rows]


def test_main_table_exact_values() -> None:
    t = TABLES.get("main")(TableRequest(validate_results(results()), category_env="alf"))
    assert t.columns == ("Method", "x", "y", "alf (%)", "ws (%)")
    assert [r[0].text for r in t.rows] == ["A", "B"]
    assert values(t, "x") == [(75.0, None, True), (50.0, None, False)]
    assert values(t, "y") == [(50.0, None, True), (50.0, None, True)]  # a tie: both bold
    (a_alf, b_alf) = values(t, "alf (%)")
    assert a_alf == (62.5, pytest.approx(SD_25), True)
    assert b_alf == (50.0, 0.0, False)
    assert values(t, "ws (%)") == [
        (75.0, pytest.approx(SD_50), True),
        (25.0, pytest.approx(SD_50), False),
    ]
    assert "2 seeds" in t.caption


def test_main_table_markdown_export() -> None:
    t = TABLES.get("main")(TableRequest(validate_results(results()), category_env="alf"))
    caption = (
        "Main results. Macro success rate (%) per environment, mean ± sample standard deviation "
        "over 2 seeds; alf category columns: mean over seeds. Bold marks the best value per column."
    )
    want = (
        caption
        + """

| Method | x | y | alf (%) | ws (%) |
| --- | ---: | ---: | ---: | ---: |
| A | **75.0** | **50.0** | **62.5 ± 17.7** | **75.0 ± 35.4** |
| B | 50.0 | **50.0** | 50.0 ± 0.0 | 25.0 ± 35.4 |
"""
    )
    assert to_markdown(t) == want


def test_ablation_table_deltas_csv_and_latex() -> None:
    t = TABLES.get("ablation")(TableRequest(validate_results(results()), reference="A", decimals=2))
    assert t.columns == ("Method", "alf (%)", "ws (%)", "Δalf", "Δws")
    b, a = t.rows[0], t.rows[1]  # reference is listed where it appears: A first
    assert [r[0].text for r in t.rows] == ["A", "B"]
    assert (b[3].value, b[3].value is not None) == (None, False)  # reference has no delta
    assert a[3].value == pytest.approx(-12.5) and a[4].value == pytest.approx(-50.0)
    assert all(c.bold for c in b[:3]) and not any(c.bold for c in a)
    assert to_csv(t).splitlines() == [
        "Method,alf (%),alf (%) std,ws (%),ws (%) std,Δalf,Δws",
        "A,62.50,17.68,75.00,35.36,,",
        "B,50.00,0.00,25.00,35.36,-12.50,-50.00",
    ]
    latex = to_latex(t)
    assert r"\textbf{62.50 $\pm$ 17.68}" in latex
    assert r"B & 50.00 $\pm$ 0.00 & 25.00 $\pm$ 35.36 & $-$12.50 & $-$50.00 \\" in latex
    assert r"Method & alf (\%) & ws (\%) & $\Delta$alf & $\Delta$ws \\" in latex
    assert r"\begin{tabular}{lrrrr}" in latex


def test_reference_deltas() -> None:
    d = reference_deltas(validate_results(results()), "B")
    assert d.to_dict("records") == [
        {"method": "A", "env": "alf", "delta": pytest.approx(12.5)},
        {"method": "A", "env": "ws", "delta": pytest.approx(50.0)},
    ]


def test_protocol_and_transfer_bold_rules() -> None:
    # Two study groups; group g2 = the same data with B's successes flipped on ws item w2.
    base = results()
    g2 = base.copy()
    mask = (g2["method"] == "B") & (g2["item_id"] == "w2")
    g2.loc[mask, "success"] = 1  # B ws: seed 1 -> 0.5, seed 2 -> 1.0 -> mean 75
    frame = pd.concat([base.assign(study="g1"), g2.assign(study="g2")], ignore_index=True)
    frame = validate_results(frame, run_keys=("study",))
    p = TABLES.get("protocol")(TableRequest(frame, group="study"))
    assert p.columns == ("Study", "Method", "alf (%)", "ws (%)")
    assert [(r[0].text, r[1].text) for r in p.rows] == [
        ("g1", "A"),
        ("g1", "B"),
        ("g2", "A"),
        ("g2", "B"),
    ]
    # best per env over all rows: ws 75.0 appears for g1/A, g2/A and g2/B
    assert [r[3].bold for r in p.rows] == [True, False, True, True]
    tr = TABLES.get("transfer")(TableRequest(frame, group="study"))
    assert [r[3].bold for r in tr.rows] == [True, False, True, True]
    assert [r[2].bold for r in tr.rows] == [True, False, True, False]
    assert "within each study" in tr.caption


def test_budget_table_gains_and_costs() -> None:
    frame = results(
        {
            ("A", 1): {"budget": "2x4", "interactions": 3.0, "wall_clock": 1.2},
            ("A", 2): {"budget": "1x1", "interactions": 1.5, "wall_clock": 1.1},
            ("B", 1): {"budget": None, "interactions": 1.0, "wall_clock": 1.0},
            ("B", 2): {"budget": None, "interactions": 1.0, "wall_clock": 1.0},
        }
    )
    t = TABLES.get("budget")(
        TableRequest(
            validate_results(frame, ("budget",)), methods=["A"], baseline="B", default_budget="2x4"
        )
    )
    assert t.columns == ("B×M", "Interact. (×)", "Wall-clock (×)", "Gain alf (pp)", "Gain ws (pp)")
    assert [r[0].text for r in t.rows] == ["1x1", "2x4 (default)"]  # sorted by B*M
    # A at 1x1 is seed 2: alf 75, ws 50; B means: alf 50, ws 25 -> gains +25, +25
    # A at 2x4 is seed 1: alf 50, ws 100 -> gains 0, +75
    assert [r[3].value for r in t.rows] == pytest.approx([25.0, 0.0])
    assert [r[4].value for r in t.rows] == pytest.approx([25.0, 75.0])
    assert [r[1].value for r in t.rows] == pytest.approx([1.5, 3.0])
    assert [r[2].value for r in t.rows] == pytest.approx([1.1, 1.2])
    assert [r[3].bold for r in t.rows] == [True, False]
    assert cell_text(t.rows[0][2], t.decimals) == "1.10"  # cost ratios keep 2 decimals
    assert cell_text(t.rows[1][3], t.decimals) == "+0.0"


def budget_request(frame: pd.DataFrame, method: str) -> TableRequest:
    return TableRequest(validate_results(frame, ("budget",)), methods=[method], baseline="B")


def test_budget_errors() -> None:
    frame = results({k: {"budget": "2x4", "interactions": "lots"} for k in SUCCESS})
    with pytest.raises(ValueError, match="column 'interactions' must hold numbers"):
        TABLES.get("budget")(budget_request(frame, "A"))
    varying = results({("A", 1): {"budget": "2x4"}, ("A", 2): {"budget": "2x4"}})
    varying["interactions"] = range(len(varying))
    with pytest.raises(ValueError, match="must be constant within a run"):
        TABLES.get("budget")(budget_request(varying, "A"))
    with pytest.raises(ValueError, match="method 'C' not found"):
        TABLES.get("budget")(budget_request(varying, "C"))


def test_table_errors_name_the_value() -> None:
    frame = validate_results(results())
    with pytest.raises(ValueError, match="reference method 'Z' not found; present: A, B"):
        TABLES.get("ablation")(TableRequest(frame, reference="Z"))
    with pytest.raises(ValueError, match="env 'web' not found; present: alf, ws"):
        TABLES.get("main")(TableRequest(frame, envs=["web"]))
    with pytest.raises(ValueError, match="category env 'web' not found"):
        TABLES.get("main")(TableRequest(frame, category_env="web"))
    with pytest.raises(ValueError, match="needs a 'reduction' column"):
        TABLES.get("protocol")(TableRequest(frame))
    with pytest.raises(ValueError, match="unknown table kind 'big'; valid: main, ablation"):
        TABLES.get("big")


def test_one_seed_omits_std_and_missing_cells_show_a_dash() -> None:
    frame = validate_results(results())
    one = frame.loc[frame["seed"] == 1]
    one = one.loc[~((one["method"] == "B") & (one["env"] == "ws"))]
    t = TABLES.get("main")(TableRequest(one))
    assert values(t, "alf (%)") == [(50.0, None, True), (50.0, None, True)]
    assert t.rows[1][2].value is None
    assert cell_text(t.rows[1][2], 1) == "—"
    assert "one seed" in t.caption


def test_number_formatting() -> None:
    assert format_number(-0.04, 1) == "0.0"
    assert format_number(0.04, 1, signed=True) == "+0.0"
    assert format_number(-2.25, 1, signed=True) == "-2.2"
    assert cell_text(Cell(value=-1.5, signed=True, bold=True), 1, "latex") == r"\textbf{$-$1.5}"
    assert cell_text(Cell(text="a_b & c%"), 1, "latex") == r"a\_b \& c\%"
    with pytest.raises(ValueError, match="unknown style"):
        cell_text(Cell(value=1.0), 1, "html")


def test_grouped_table_needs_every_study_value() -> None:
    frame = results(
        {
            ("A", 1): {"backbone": "qwen"},
            ("A", 2): {"backbone": "qwen"},
            ("B", 1): {"backbone": "qwen"},
            ("B", 2): {"backbone": None},
        }
    )
    with pytest.raises(ValueError, match="column 'backbone' is empty in data row 16"):
        TABLES.get("transfer")(TableRequest(validate_results(frame, ("backbone",))))


# ----------------------------------------------------------------------------- every layout

# One study value per run for every layout: reduction and backbone constant, budget 2x4 for A
# only (the baseline B has no budget).
STUDY = {
    (m, s): {"reduction": "token-mean", "backbone": "qwen", "budget": "2x4" if m == "A" else None}
    for m, s in SUCCESS
}
# kind -> (request options, columns, first-column labels, (column, row, value) hand-checked):
# A's alf mean is (50 + 75) / 2 = 62.5, B's is 50; ws: A 75, B 25 (see the header comment).
EVERY_KIND: dict[str, tuple[dict[str, object], tuple[str, ...], list[str], tuple]] = {
    "main": ({}, ("Method", "alf (%)", "ws (%)"), ["A", "B"], ("alf (%)", 0, 62.5)),
    "ablation": (
        {"reference": "A"},
        ("Method", "alf (%)", "ws (%)", "Δalf", "Δws"),
        ["A", "B"],
        ("Δws", 1, -50.0),
    ),
    "protocol": (
        {},
        ("Reduction", "Method", "alf (%)", "ws (%)"),
        ["token-mean", "token-mean"],
        ("ws (%)", 1, 25.0),
    ),
    "budget": (
        {"methods": ["A"], "baseline": "B"},
        ("B×M", "Gain alf (pp)", "Gain ws (pp)"),
        ["2x4"],
        ("Gain ws (pp)", 0, 50.0),
    ),
    "transfer": (
        {},
        ("Backbone", "Method", "alf (%)", "ws (%)"),
        ["qwen", "qwen"],
        ("alf (%)", 0, 62.5),
    ),
}


@pytest.mark.parametrize("kind", TABLES.names())
def test_every_table_kind_builds_from_one_request_type(kind: str) -> None:
    options, columns, labels, (column, row, value) = EVERY_KIND[kind]
    layout = TABLES.get(kind)
    frame = validate_results(results(STUDY), layout.run_keys())
    t = layout(TableRequest(frame, **options))
    assert (t.kind, t.columns) == (kind, columns)
    assert [r[0].text for r in t.rows] == labels
    assert t.rows[row][t.columns.index(column)].value == pytest.approx(value)
    for export in EXPORTS.names():  # every export renders every layout: header + each row
        lines = EXPORTS.get(export)(t).splitlines()
        assert len(lines) > len(labels) and all(any(lb in ln for ln in lines) for lb in labels)


def test_layout_metadata_and_registries() -> None:
    assert KINDS == tuple(TABLES.names()) == ("main", "ablation", "protocol", "budget", "transfer")
    assert EXPORTS.names() == ["csv", "markdown", "latex"]
    assert [TABLES.get(k).run_keys() for k in KINDS] == [
        (),
        (),
        ("reduction",),
        ("budget",),
        ("backbone",),
    ]
    assert TABLES.get("transfer").run_keys("model") == ("model",)
    assert TABLES.get("budget").example("budget") == "2x4"
    assert TABLES.get("budget").example("label") == "one value per run"
    assert {TABLES.get(k).paper for k in KINDS} == {f"Table {n}" for n in range(1, 6)}


def test_main_table_auto_category_env() -> None:
    frame = validate_results(results())
    alfworld = frame.assign(env=frame["env"].replace("alf", "alfworld"))
    auto = TABLES.get("main")(TableRequest(alfworld, category_env=AUTO))
    assert auto.columns == ("Method", "x", "y", "alfworld (%)", "ws (%)")
    assert DEFAULT_CATEGORY_ENV == "alfworld"
    # without that env, AUTO means no category columns
    assert TABLES.get("main")(TableRequest(frame, category_env=AUTO)).columns == (
        "Method",
        "alf (%)",
        "ws (%)",
    )


def test_missing_options_are_option_errors() -> None:
    frame = validate_results(results(STUDY), ("budget",))
    with pytest.raises(TableOptionError, match="table ablation needs --reference METHOD"):
        TABLES.get("ablation")(TableRequest(frame))
    for options in ({}, {"methods": ["A", "B"], "baseline": "B"}, {"methods": ["A"]}):
        with pytest.raises(TableOptionError, match="table budget needs exactly one --method"):
            TABLES.get("budget")(TableRequest(frame, **options))
    with pytest.raises(TableOptionError, match="table protocol needs a study column"):
        protocol_table(TableRequest(frame))  # the bare builder: no layout fills the default
