"""The one error path: bad input and faults end as one line on stderr with a non-zero exit code,
printed literally (never parsed as rich markup), and Ctrl-C ends quietly with 130.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from factor_cli.cli.common import error_line
from factor_cli.cli.main import app
from factor_cli.envs import availability
from factor_cli.interrupts import caused_by_interrupt

runner = CliRunner()
FACTOR = [sys.executable, "-m", "factor_cli"]
needs_twx = pytest.mark.skipif(availability("twx") is not None, reason="twx needs Java")


def _one_line_error(result: object, *needles: str) -> str:
    """The error text of a CliRunner result, checked to be exactly one ``error:`` line."""
    err = result.stderr.strip()  # type: ignore[attr-defined]
    assert result.exit_code != 0, result.output  # type: ignore[attr-defined]
    assert err.startswith("error: "), err
    assert "\n" not in err, err
    assert "Traceback" not in result.output, result.output  # type: ignore[attr-defined]
    for needle in needles:
        assert needle in err, err
    return err


def test_error_line_is_literal_text() -> None:
    hint = "pip install 'factor-cli[alfworld]' and see /tmp/[/bad].json [bold]x[/]"
    assert error_line(hint).plain == f"error: {hint}"
    assert error_line("first\n  second").plain == "error: first second"


def test_markup_in_a_path_is_printed_as_is(tmp_path: Path) -> None:
    path = "/tmp/[/bad].json"
    result = runner.invoke(app, ["credit", "explain", path])
    _one_line_error(result, path)


@needs_twx
def test_markup_in_an_instance_id_is_printed_as_is() -> None:
    result = runner.invoke(app, ["envs", "play", "twx", "--instance", "coin/[/x]", "--json"])
    _one_line_error(result, "coin/[/x]")


def test_credit_explain_on_a_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["credit", "explain", str(tmp_path)])
    _one_line_error(result, str(tmp_path), "is a folder")


def test_uncaught_user_errors_end_as_one_line(tmp_path: Path) -> None:
    """The safety net: an OSError / ValueError that no command caught is still one line."""
    code = (
        "import typer\n"
        "from factor_cli.cli.common import run_app\n"
        "app = typer.Typer()\n"
        "@app.command()\n"
        "def go(kind: str) -> None:\n"
        "    if kind == 'os':\n"
        "        open('/nonexistent/[x]/file')\n"
        "    raise ValueError('bad [red]value[/]\\nsecond line')\n"
        "run_app(app)\n"
    )
    for kind, needle in (("os", "No such file or directory"), ("value", "bad [red]value[/]")):
        proc = subprocess.run(
            [sys.executable, "-c", code, kind], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 1
        assert proc.stderr.strip().startswith("error: ") and needle in proc.stderr
        assert "\n" not in proc.stderr.strip() and "Traceback" not in proc.stderr


def test_an_error_raised_while_handling_ctrl_c_counts_as_ctrl_c() -> None:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise AttributeError("'GatewayConnection' object has no attribute 'x'") from None
    except AttributeError as exc:
        assert caused_by_interrupt(exc)  # __context__ survives `from None`
    assert not caused_by_interrupt(ValueError("plain"))


@pytest.fixture(scope="module")
def truncated_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bad = tmp_path_factory.mktemp("truncated") / "model"
    shutil.copytree(tiny_model_dir, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return bad


def test_truncated_weights_model_info(truncated_model: Path) -> None:
    result = runner.invoke(app, ["model", "info", str(truncated_model)])
    _one_line_error(result, str(truncated_model), "weights file is damaged")


def test_truncated_weights_eval(truncated_model: Path, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "eval",
            "--checkpoint",
            str(truncated_model),
            "--set",
            f"output_dir={tmp_path}",
            "--set",
            f"tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ],
    )
    _one_line_error(result, "weights file is damaged")


@needs_twx
def test_ctrl_c_during_splits_build_is_quiet_and_writes_nothing(tmp_path: Path) -> None:
    """SIGINT to the whole foreground process group (what Ctrl-C does) mid-build."""
    out = tmp_path / "splits"
    proc = subprocess.Popen(
        [*FACTOR, "splits", "build", "twx", "--splits-dir", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Wait until the JVM is up and checksumming has begun (the JVM is a child of the CLI).
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        if children:
            break
        time.sleep(0.2)
    time.sleep(0.3)  # checksumming the 1,200 instances takes over a second after this
    assert proc.poll() is None, "the build finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted", err
    manifest = out / "twx_ids.csv"
    if manifest.exists():  # interrupted after the atomic write: then it is whole and locked
        from factor_cli.splits.manifest import file_digest, read_lock

        assert read_lock(out)["twx_ids.csv"] == file_digest(manifest)
    leftovers = list(out.glob(".*")) if out.exists() else []
    assert leftovers == []  # no temporary files


@needs_twx
def test_user_text_with_markup_is_printed_literally(tmp_path: Path) -> None:
    """Actions, observations and paths are data, never rich markup (a "[/x]" once crashed)."""
    script = tmp_path / "[x]" / "actions.txt"
    script.parent.mkdir()
    script.write_text("[/x] look [bold]around\nmove east\n")
    result = runner.invoke(
        app, ["envs", "play", "twx", "--instance", "coin/0", "--script", str(script)]
    )
    assert result.exit_code == 0, result.output
    assert "> [/x] look [bold]around" in result.output
