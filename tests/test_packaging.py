"""A non-editable install carries the presets and split manifests and finds them from any folder.

Builds the wheel from this checkout, installs it (without dependencies: the test venv has them)
into a temporary folder, and runs it from another working directory with that folder first on
the path, so nothing can come from the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(build), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stderr[-3000:]}")
    (wheel,) = build.glob("factor_cli-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "factor_cli/_shipped/experiments/smoke.yaml",
        "factor_cli/_shipped/experiments/paper.yaml",
        "factor_cli/_shipped/splits/twx_ids.csv",
        "factor_cli/_shipped/splits/splits.lock",
    ):
        assert shipped in names, f"{shipped} is not in {wheel.name}"
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return site


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_wheel_install_finds_presets_and_manifests(installed: Path, tmp_path: Path) -> None:
    code = (
        "import factor_cli\n"
        "from factor_cli.resources import presets_dir, splits_dir\n"
        "from factor_cli.train.config import load_config\n"
        "from factor_cli.train.data import instances\n"
        "cfg = load_config('smoke')\n"
        "paper = load_config('paper')\n"
        "print(factor_cli.__file__)\n"
        "print(presets_dir())\n"
        "print(splits_dir())\n"
        "print(len(instances(cfg, 'eval')))\n"
    )
    proc = _run(installed, tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    module, presets, splits, n_eval = proc.stdout.split()
    for path in (module, presets, splits):
        assert Path(path).is_relative_to(installed), path
    assert int(n_eval) > 0


def test_wheel_install_verifies_its_manifests(installed: Path, tmp_path: Path) -> None:
    """`factor verify-splits` from an unrelated folder checks the shipped lock digests."""
    proc = _run(installed, tmp_path, "-m", "factor_cli", "verify-splits", "--sample", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all manifests verified" in proc.stdout
