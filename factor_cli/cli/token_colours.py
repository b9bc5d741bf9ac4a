"""The colour of a token by its allocation weight, shared by `factor credit explain` and
`factor ledger show` (terminal and HTML), so both read the same way.

w = 1 is the uniform share of the action's credit (grey); w > 1 turns green (full at w = 2.5),
w < 1 turns blue-grey (full at w = 0).
"""

from __future__ import annotations


def token_rgb(w: float) -> tuple[int, int, int]:
    """Background colour (r, g, b) for allocation weight ``w``."""
    if w >= 1.0:
        x = min((w - 1.0) / 1.5, 1.0)
        return int(200 - 120 * x), int(200 + 55 * x), int(200 - 120 * x)
    x = max(min(1.0 - w, 1.0), 0.0)
    return int(200 - 90 * x), int(200 - 90 * x), int(200 - 50 * x)


def token_style(w: float) -> str:
    """The rich style of a token with allocation weight ``w`` (black text on its colour)."""
    r, g, b = token_rgb(w)
    return f"black on rgb({r},{g},{b})"
