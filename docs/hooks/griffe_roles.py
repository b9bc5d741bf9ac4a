"""A Griffe extension for the API reference: Sphinx cross-reference roles as code spans.

The package's docstrings name other objects the Sphinx way (``:func:`hta_scores```,
``:class:`~.scoring.Scorer```); mkdocstrings renders Markdown, where such a role would show as
literal text. This turns each into a code span of the object's name (the leading ``~`` or ``.``
dropped) before the docstring is parsed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|exc|obj|const):`~?\.?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrites ``:role:`target``` to ```target``` in every docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
