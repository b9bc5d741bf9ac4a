"""`factor eval` is a ledger run: kind=eval, what was evaluated, the split and its digests, the
metric and the items; local copies in a folder of its own; failures closed FAILED or KILLED;
the train split evaluated too; an unusable store is one line for `factor eval` and `factor
train`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("mlflow", reason="install with: pip install 'mlflow>=3.10'")

from mlflow import MlflowClient

from factor_cli.cli.main import app
from factor_cli.envs import availability
from factor_cli.ledger import LedgerError, export_items, runs_table
from factor_cli.ledger.provenance import split_digests
from factor_cli.resources import splits_dir
from factor_cli.splits.manifest import read_manifest
from factor_cli.train import run as run_mod
from factor_cli.train.config import load_config

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")
runner = CliRunner()
twx_missing = availability("twx")
needs_twx = pytest.mark.skipif(twx_missing is not None, reason=f"twx: {twx_missing}")
COLUMNS = ["env", "method", "seed", "item_id", "category", "success", "score"]


def _sets(model: Path, tmp: Path, uri: str) -> list[str]:
    overrides = [
        f"model.path={model}", "model.init_tiny=null", "sft.enabled=false",
        "rollout.max_new_tokens=8", "env.max_turns=2", "eval.max_items=2",
        f"output_dir={tmp / 'runs'}", f"tracking_uri={uri}",
    ]  # fmt: skip
    return [arg for item in overrides for arg in ("--set", item)]


def _eval(*args: str) -> dict:
    res = runner.invoke(app, ["eval", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


@needs_twx
def test_eval_is_a_ledger_run_with_its_own_files(
    tiny_model_dir: Path, tmp_path: Path, uri: str
) -> None:
    sets = _sets(tiny_model_dir, tmp_path, uri)
    out = tmp_path / "mine.csv"
    first = _eval("--checkpoint", str(tiny_model_dir), *sets, "--out", str(out))
    second = _eval("--checkpoint", str(tiny_model_dir), *sets)
    assert first["run_id"] != second["run_id"] and first["items"] == 2
    cfg = load_config("smoke", sets[1::2])
    client = MlflowClient(uri)
    for result in (first, second):
        run = client.get_run(result["run_id"])
        tags = run.data.tags
        assert run.info.status == "FINISHED"
        assert (tags["kind"], tags["eval.split"], tags["env"]) == ("eval", "eval", "twx")
        assert tags["eval.checkpoint"] == str(tiny_model_dir.resolve())
        assert "eval.run_id" not in tags  # a bare model folder: no training run to name
        assert tags["config_hash"] == cfg.digest()
        lock = split_digests(splits_dir() / "splits.lock")
        assert tags["split.twx_ids.csv"] == lock["twx_ids.csv"]
        assert run.data.metrics["eval_metric"] == pytest.approx(result["metric"])
        local = tmp_path / "runs" / "evals" / result["run_id"] / "eval_items_twx.csv"
        assert result["items_path"] == str(local) and local.is_file()
        artifact = client.download_artifacts(
            result["run_id"], "items/eval_items.csv", str(tmp_path)
        )
        items = pd.read_csv(local, dtype={"item_id": str})
        pd.testing.assert_frame_equal(
            pd.read_csv(artifact, dtype={"item_id": str}), items[COLUMNS], check_dtype=False
        )
    assert first["path"] == str(out) and out.read_text() == Path(first["items_path"]).read_text()
    # Every episode is in the eval's transcript, which `factor ledger show --eval` reads back.
    shown = runner.invoke(app, ["ledger", "show", first["run_id"][:12], "--eval", "--episode",
                                "1", "--tracking-uri", uri], env={"COLUMNS": "200"})  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "eval" in shown.output and items["item_id"].iloc[1] in shown.output
    assert not list(tiny_model_dir.parent.glob("eval_items_*.csv"))  # nothing beside the model
    with pytest.raises(LedgerError, match="2 finished runs share"):  # same checkpoint, split
        export_items(cfg.study, uri, kind="eval")
    latest = export_items(cfg.study, uri, kind="eval", keep_latest=True)
    assert set(latest["run_id"]) == {second["run_id"]} and len(latest) == 2
    assert set(latest["split"]) == {"eval"}
    assert set(latest["checkpoint"]) == {str(tiny_model_dir.resolve())}
    res = runner.invoke(app, ["ledger", "export", "-s", cfg.study, "-o", str(tmp_path / "x.csv"),
                              "--tracking-uri", uri])  # fmt: skip
    assert res.exit_code == 1 and "no FINISHED train run" in res.output  # evals are not mixed in


@needs_twx
def test_eval_on_the_train_split(tiny_model_dir: Path, tmp_path: Path, uri: str) -> None:
    got = _eval("--checkpoint", str(tiny_model_dir), "--split", "train",
                *_sets(tiny_model_dir, tmp_path, uri))  # fmt: skip
    rows = read_manifest(splits_dir() / "twx_ids.csv")
    train_ids = {r.instance_id for r in rows if r.split == "train" and r.category == "coin"}
    items = pd.read_csv(got["items_path"], dtype={"item_id": str})
    assert len(items) == 2 and set(items["item_id"]) <= train_ids
    tags = MlflowClient(uri).get_run(got["run_id"]).data.tags
    assert tags["eval.split"] == "train"
    assert tags["mlflow.runName"] == "eval/smoke/factor/twx/42/train"
    res = runner.invoke(app, ["eval", "--checkpoint", str(tiny_model_dir), "--split", "test"])
    assert res.exit_code == 1 and "--split 'test': unknown split; valid: train, eval" in res.output


# ----------------------------------------------------------------------------- failures


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    """A folder that looks like `<output_dir>/<run id>/model` (never loaded: play is patched)."""
    folder = tmp_path / "runs" / ("ab" * 16) / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    return folder


def _sets_fake(tmp_path: Path, uri: str) -> list[str]:
    items = [f"output_dir={tmp_path / 'runs'}", f"tracking_uri={uri}", "eval.max_items=2"]
    return [arg for item in items for arg in ("--set", item)]


@pytest.mark.parametrize(
    ("raised", "status", "exit_code", "message", "error_tag"),
    [
        (ValueError("the policy emitted nothing"), "FAILED", 1,
         "error: the policy emitted nothing", "ValueError: the policy emitted nothing"),
        (KeyboardInterrupt(), "KILLED", 130, "interrupted: ledger run {} closed as KILLED", None),
    ],
)  # fmt: skip
def test_failed_or_interrupted_eval_is_closed(
    fake_model: Path, tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch,
    raised: BaseException, status: str, exit_code: int, message: str, error_tag: str | None,
) -> None:  # fmt: skip
    def play(*args, **kwargs):
        raise raised

    monkeypatch.setattr(run_mod, "_greedy_play", play)
    res = runner.invoke(app, ["eval", "--run", "ab" * 16, *_sets_fake(tmp_path, uri)])
    assert res.exit_code == exit_code, res.output
    (run,) = runs_table(None, uri).itertuples()
    assert (run.kind, run.status) == ("eval", status)
    tags = MlflowClient(uri).get_run(run.run_id).data.tags
    assert tags["eval.run_id"] == "ab" * 16 and tags["eval.checkpoint"] == str(fake_model)
    assert res.output.strip().splitlines()[-1] == message.format(run.run_id)
    assert tags.get("error") == error_tag
    assert not (tmp_path / "runs" / "evals" / run.run_id).exists()


def test_eval_with_a_bad_store_is_one_line(fake_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"\x00garbage" * 100)
    res = runner.invoke(app, ["eval", "--checkpoint", str(fake_model),
                              *_sets_fake(tmp_path, str(bad))])  # fmt: skip
    assert res.exit_code == 1
    assert res.output.strip().startswith(f"error: ledger {bad} is not an SQLite database")
    assert "\n" not in res.output.strip() and not (tmp_path / "runs" / "evals").exists()


@needs_twx
def test_train_with_a_bad_store_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"\x00garbage" * 100)
    sets = _sets(tiny_model_dir, tmp_path, str(bad))
    res = runner.invoke(app, ["train", *sets, "--set", "steps=1"])
    assert res.exit_code == 1, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith(f"error: ledger {bad} is not an SQLite database")
    assert "Traceback" not in res.output
