"""Every config mistake is caught when the config loads: one line naming where the bad value came
from (the YAML file and line, or the ``--set`` item), the field, the value and what is allowed.
Nothing is built or logged first, and mistakes outside the credit names never import torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from factor_cli.train.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "env.name=twxx",
            r"--set env.name=twxx: field env.name: unknown environment 'twxx'; "
            r"valid: alfworld, scienceworld, twx, webshop",
        ),
        (
            "rollout.backend=sglang",
            r"field rollout.backend: unknown generation backend 'sglang'; "
            r"valid: hf, vllm",
        ),
        (
            "rollout.max_new_tokens=768",
            r"field rollout.max_new_tokens: max_new_tokens \(768\) must be < max_context",
        ),
        (
            "env.games=[zork]",
            r"field env.games: 'zork' not in twx_ids.csv; "
            r"valid: coin, cookingworld",
        ),
        ("model.device=gpu", r"field model.device: use cpu, cuda, cuda:N or mps"),
        ("model.init_tiny=3m", r"field model.init_tiny: unknown tiny preset '3m'; valid: 1m, 5m"),
        ("rollout.max_context=4096", r"field rollout.max_context: 4096 exceeds the model's 2048"),
        ("env.splits_dir=/nonexistent", r"field env.splits_dir: .*no such manifest"),
        ("method=facter", r"--set method=facter: field method: unknown method 'facter'; valid: "),
        ("reduction=sum", r"field reduction: unknown reduction 'sum'; valid: "),
        ("nosuch.key=1", r"--set nosuch.key=1: field nosuch: Extra inputs are not permitted"),
        (
            "continuations.per_state=0",
            r"--set continuations.per_state=0: field continuations.per_state: "
            r"Input should be greater than or equal to 1 \(got 0\)",
        ),
    ],
)
def test_config_errors_name_the_set_item_and_field(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config("smoke", [override])
    assert "\n" not in str(err.value)


def test_a_missing_local_model_without_a_tiny_preset_is_caught(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"field model.path: .*no such model directory"):
        load_config("smoke", [f"model.path={tmp_path / 'none'}", "model.init_tiny=null"])


def test_a_bad_value_in_the_file_is_blamed_on_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("method: factor\nenv:\n  name: twxx\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}: field env.name: unknown environment"):
        load_config(str(cfg))
    # The same field overridden on the command line is blamed on the --set item instead.
    with pytest.raises(ConfigError, match=r"^--set env.name=nope: field env.name"):
        load_config(str(cfg), ["env.name=nope"])


def test_yaml_syntax_errors_give_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("method: factor\nrollout:\n  k: [1, 2\nsteps: 3\n")
    with pytest.raises(ConfigError, match=rf"^{cfg}:4:\d+: not valid YAML") as err:
        load_config(str(cfg))
    assert "\n" not in str(err.value)


def test_non_utf8_and_folder_configs(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("method: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml:1: not UTF-8 text \(byte 12\)"):
        load_config(str(bad))
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(str(folder))


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_config_errors_do_not_import_torch(tmp_path: Path) -> None:
    """A field mistake answers before torch (or anything heavy) is imported."""
    code = (
        "import sys, json\n"
        "from factor_cli.train.config import load_config, ConfigError\n"
        "out = {}\n"
        "for item in ['env.name=twxx', 'rollout.backend=sglang', 'rollout.max_new_tokens=9999',"
        " 'optim.lr=-1', 'nosuch=1']:\n"
        "    try:\n"
        "        load_config('smoke', [item])\n"
        "    except ConfigError as exc:\n"
        "        out[item] = str(exc)\n"
        "heavy = [m for m in ('torch', 'transformers', 'mlflow', 'scipy', 'pandas', 'deepspeed')"
        " if m in sys.modules]\n"
        "print(json.dumps({'errors': out, 'heavy': heavy}))\n"
    )
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(result["errors"]) == 5
    assert result["heavy"] == []


def test_presets_and_manifests_resolve_outside_the_checkout(tmp_path: Path) -> None:
    """From any working directory the shipped presets and split manifests are found."""
    code = (
        "from factor_cli.train.config import load_config\n"
        "from factor_cli.train.data import instances\n"
        "cfg = load_config('smoke')\n"
        "print(len(instances(cfg, 'eval')), len(instances(cfg, 'train')))\n"
    )
    proc = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    n_eval, n_train = map(int, proc.stdout.split())
    assert n_eval > 0 and n_train > 0
    assert not (tmp_path / "splits").exists()


def test_monte_carlo_k_has_one_home() -> None:
    """continuations.per_state defaults to VinePPO's K = 9, from rollout/continuations.py."""
    from factor_cli.rollout import continuations

    assert continuations.PER_STATE == 9
    assert load_config("smoke").continuations.per_state == continuations.PER_STATE
    assert load_config("smoke", ["continuations.per_state=3"]).continuations.per_state == 3
