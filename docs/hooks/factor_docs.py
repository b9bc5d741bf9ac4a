"""MkDocs hooks: what the documentation site generates at build time.

Nothing below is a hand-kept copy of something the code already says:

- a page may hold a marker line ``<!-- generated: NAME -->``; :func:`on_page_markdown` replaces
  it with the table :data:`GENERATORS` builds from the code (the training config's field
  descriptions and the presets, the credit registries). An unknown name fails the build.
- the API reference pages (``api/credit.md``, ``api/stats.md``, ``api/library.md``) are
  written here, one mkdocstrings block per module, so a new module shows up by itself.
- MathJax is copied from the installed ``django-static-mathjax`` package (the ``docs`` extra)
  into the site, so equations render with no network and no vendored copy in the repository.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

MATHJAX_SOURCE = ("static", "mathjax", "es5", "tex-svg-full.js")
"""The engine inside the ``mathjax`` package: TeX in, SVG out, every TeX extension built in
(nothing is fetched on demand) and no font files to load."""
MATHJAX_DEST = "assets/mathjax/tex-svg-full.js"
"""Where ``mkdocs.yml``'s ``extra_javascript`` expects it in the site."""

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->[ \t]*$", re.MULTILINE)

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- markdown helpers


def _cell(text: str) -> str:
    """One table cell: whitespace folded; outside code spans, < > & escaped; | always."""
    text = " ".join(str(text).split())
    parts = text.split("`")
    for i, part in enumerate(parts):
        if i % 2 == 0:  # outside a code span
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        parts[i] = part.replace("|", r"\|")
    return "`".join(parts)


def _code(value: str) -> str:
    return f"`{value}`" if value else ""


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(rows_cell for rows_cell in row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- config reference


def _yaml_value(value: Any) -> str:
    """A value as it would be written in a preset's YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value == float("inf"):
        return ".inf"
    if isinstance(value, (dict, list)):
        return json.dumps(value).replace('"', "")
    return str(value)


def _default(text: str) -> str:
    """``field_reference`` gives Python reprs; show them as YAML values."""
    try:
        return _yaml_value(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return text


def _preset(name: str) -> dict[str, Any]:
    path = REPO / "experiments" / f"{name}.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _lookup(tree: dict[str, Any], dotted: str) -> str:
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return ""
        node = node[key]
    return _yaml_value(node)


def config_reference() -> str:
    """Every field of the training config: default, the two presets' values, meaning.

    The rows come from ``factor_cli.train.config.field_reference`` (each field's own
    description, the ``CreditConfig`` field docstrings for ``credit.*``), the preset columns
    from ``experiments/smoke.yaml`` and ``experiments/paper.yaml`` as written.
    """
    from factor_cli.train.config import field_reference

    presets = {name: _preset(name) for name in ("smoke", "paper")}
    sections: dict[str, list[list[str]]] = {}
    for dotted, default, doc in field_reference():
        section = dotted.split(".")[0] if "." in dotted else "top level"
        sections.setdefault(section, []).append(
            [
                f"`{dotted}`",
                _code(_default(default)),
                _code(_lookup(presets["smoke"], dotted)),
                _code(_lookup(presets["paper"], dotted)),
                _cell(doc),
            ]
        )
    header = ["field", "default", "smoke", "paper", "meaning"]
    out = []
    for section, rows in sections.items():
        title = section if section == "top level" else f"`{section}.*`"
        out += [f"### {title}", "", _table(header, rows), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- credit registries


def _first_line(doc: str | None) -> str:
    text = (doc or "").strip().split("\n\n")[0]
    text = re.sub(r":(?:func|class|mod|data|attr|meth):`~?\.?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def methods_table() -> str:
    """``METHODS``: every trainable method and ablation, as ``factor credit methods`` lists it."""
    from factor_cli.credit import METHODS

    rows = []
    for name in METHODS:
        s = METHODS.get(name)
        rows.append(
            [
                f"`{name}`",
                f"`{s.estimator}`",
                f"`{s.allocation}`",
                s.schedule,
                "yes" if s.kl else "-",
                s.continuation_use,
                f"`{s.reduction}`" if s.reduction else "protocol",
                _cell(s.summary),
            ]
        )
    header = ["method", "credit", "allocation", "schedule", "KL", "cont.", "reduction"]
    return _table([*header, "summary"], rows)


def estimators_table() -> str:
    """``ESTIMATORS`` and the critic's ``TOKEN_ESTIMATORS``."""
    from factor_cli.credit import ESTIMATORS, TOKEN_ESTIMATORS

    rows = []
    for name in ESTIMATORS:
        e = ESTIMATORS.get(name)
        rows.append(
            [
                f"`{name}`",
                "yes" if e.uses_values else "-",
                "yes" if e.conserves else "-",
                _cell(e.summary),
            ]
        )
    for name in TOKEN_ESTIMATORS:
        doc = _first_line(TOKEN_ESTIMATORS.get(name).__doc__).split("\n")[0]
        rows.append([f"`{name}`", "critic", "-", _cell(doc)])
    return _table(["estimator", "value head", "conserves A^seq", "summary"], rows)


def _registry_table(registry: Any, what: str) -> str:
    rows = [[f"`{name}`", _cell(_first_line(registry.get(name).__doc__))] for name in registry]
    return _table([what, "definition"], rows)


def allocations_table() -> str:
    """``ALLOCATIONS``: how an action's credit is spread over its tokens."""
    from factor_cli.credit import ALLOCATIONS

    return _registry_table(ALLOCATIONS, "allocation")


def reductions_table() -> str:
    """``REDUCTIONS``: how token terms become the loss."""
    from factor_cli.credit import REDUCTIONS

    return _registry_table(REDUCTIONS, "reduction")


def conventions_table() -> str:
    """``CONVENTIONS``: each environment convention's A^seq, r_{T-1} and V~(x_0)."""
    from factor_cli.credit import CONVENTIONS

    rows = [
        [f"`{name}`", _cell(_first_line(CONVENTIONS.get(name).advantage.__doc__))]
        for name in CONVENTIONS
    ]
    return _table(["convention", "definition"], rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "config-reference": config_reference,
    "methods": methods_table,
    "estimators": estimators_table,
    "allocations": allocations_table,
    "reductions": reductions_table,
    "conventions": conventions_table,
}


# ----------------------------------------------------------------------------- API reference


def _submodules(package: str) -> list[str]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PluginError(f"API reference: package {package} not found")
    names = pkgutil.iter_modules(spec.submodule_search_locations)
    return [f"{package}.{m.name}" for m in sorted(names, key=lambda m: m.name) if m.name[0] != "_"]


def _blocks(modules: Iterable[str]) -> str:
    """One mkdocstrings block per module, listed in the page's table of contents by its full
    name (``factor_cli.envs.base`` and ``factor_cli.policy.generation.base`` are both "base")."""
    return "\n".join(f"::: {m}\n    options:\n      toc_label: {m}\n" for m in modules)


API_INTRO = {
    "credit": (
        "# `factor_cli.credit`\n\n"
        "Pure functions over the packed ragged batch ([design, section 3]"
        "(../design.md#3-the-packed-batch)): credit estimators, allocations, reductions, "
        "losses, schedules and diagnostics. Torch only; nothing else from the package but the "
        "registry. Every public name is also importable from `factor_cli.credit` itself.\n"
    ),
    "stats": (
        "# `factor_cli.stats`\n\n"
        "Statistics on item-level evaluation results ([statistics](../statistics.md)): the "
        "hierarchical bootstrap, paired item tests, rliable-style aggregates, the paper's "
        "tables and plots. numpy, scipy and pandas only. The package's own docstring lists "
        "its entry points with their shapes.\n"
    ),
}

LIBRARY_MODULES = (
    "factor_cli.registry",
    "factor_cli.envs.base",
    "factor_cli.policy.generation.base",
    "factor_cli.rollout.packing",
    "factor_cli.train.config",
    "factor_cli.ledger.transcripts",
)
"""Beyond ``credit`` and ``stats``: the seams another stack plugs into (a registry entry, an
environment adapter, a generation backend, the packed batch from episodes, the config, the
transcript schema)."""


def api_pages() -> dict[str, str]:
    """One page per self-contained package (its docstring, then each submodule) and one for
    the library surface."""
    pages = {}
    for name, intro in API_INTRO.items():
        package = f"factor_cli.{name}"
        # The package's own block shows its docstring only: its names are re-exports, each
        # documented once, under the submodule that defines it.
        head = f"::: {package}\n    options:\n      members: false\n"
        pages[f"api/{name}.md"] = f"{intro}\n{head}\n{_blocks(_submodules(package))}"
    pages["api/library.md"] = (
        "# Library surface\n\n"
        "The modules another RL stack or a new adapter builds on, besides "
        "[`factor_cli.credit`](credit.md) and [`factor_cli.stats`](stats.md). The training "
        "config's fields, with their descriptions and defaults, are on the "
        "[config reference](../config.md).\n\n" + _blocks(LIBRARY_MODULES)
    )
    return pages


# ----------------------------------------------------------------------------- MathJax


def mathjax_file() -> Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise PluginError(
            "MathJax is not installed: pip install -e '.[docs]' (it comes from the "
            "django-static-mathjax package, which has no dependencies)"
        )
    path = Path(next(iter(spec.submodule_search_locations)), *MATHJAX_SOURCE)
    if not path.is_file():
        raise PluginError(f"MathJax engine missing at {path}: reinstall django-static-mathjax")
    return path


# ----------------------------------------------------------------------------- hooks


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, MATHJAX_DEST, abs_src_path=str(mathjax_file())))
    for uri, content in api_pages().items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def generate(match: re.Match[str]) -> str:
        name = match[1]
        if name not in GENERATORS:
            raise PluginError(
                f"{page.file.src_uri}: unknown generated block {name!r}; "
                f"known: {', '.join(GENERATORS)}"
            )
        return GENERATORS[name]()

    return MARKER.sub(generate, markdown)
