"""Build hook: ship the presets and split manifests inside the wheel.

The repository keeps ``experiments/`` and ``splits/`` at its top level (the product's layout); a
wheel copies them to ``factor_cli/_shipped/`` so an installed ``factor`` finds them from any
working directory (``factor_cli/resources.py`` resolves both places). Everything else is in
``pyproject.toml``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = {"experiments": ("*.yaml", "studies/*.yaml"), "splits": ("*.csv", "splits.lock")}


class BuildWithShipped(build_py):
    def run(self) -> None:
        super().run()
        for folder, patterns in SHIPPED.items():
            target = Path(self.build_lib) / "factor_cli" / "_shipped" / folder
            for pattern in patterns:
                for src in sorted((ROOT / folder).glob(pattern)):
                    dest = target / src.relative_to(ROOT / folder)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dest)


setup(cmdclass={"build_py": BuildWithShipped})
