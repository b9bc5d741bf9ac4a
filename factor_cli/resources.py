"""Where the shipped presets (``experiments/``) and split manifests (``splits/``) live.

The repository keeps one copy of each at its top level (the product's layout). A wheel carries
them inside the package as ``factor_cli/_shipped/<name>/`` (copied there by ``setup.py``'s
build step), so every command finds them from any working directory, editable checkout or not:

1. ``factor_cli/_shipped/<name>`` when it exists (a wheel or a regular install);
2. else ``<checkout>/<name>`` next to the package (an editable install or a source tree).

Standard library only: config loading resolves presets through it before anything heavy loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

PACKAGE_DIR = Path(__file__).resolve().parent
SHIPPED = "_shipped"
Shipped = Literal["experiments", "splits"]
SHIPPED_NAMES: tuple[Shipped, ...] = ("experiments", "splits")


def shipped_dir(name: Shipped) -> Path:
    """The folder of the shipped ``experiments`` or ``splits`` (see the module docstring)."""
    if name not in SHIPPED_NAMES:
        raise ValueError(f"unknown shipped folder {name!r}; valid: {', '.join(SHIPPED_NAMES)}")
    packaged = PACKAGE_DIR / SHIPPED / name
    if packaged.is_dir():
        return packaged
    return PACKAGE_DIR.parent / name


def presets_dir() -> Path:
    """Folder of the training presets (``smoke.yaml``, ``paper.yaml``) and study specs."""
    return shipped_dir("experiments")


def splits_dir(override: str | Path | None = None) -> Path:
    """``override`` (relative to the working directory) or the shipped split manifests."""
    if override is not None and str(override).strip():
        return Path(override).expanduser()
    return shipped_dir("splits")
