"""One config hash: ``TrainConfig.digest()`` is the ledger's ``config_hash`` tag, for training
and evaluation runs alike; where-to-write fields do not change it, anything else does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason="install with: pip install 'mlflow>=3.10'")

from mlflow import MlflowClient

from factor_cli.ledger import canonical_json, config_hash, start_run, store
from factor_cli.train import run as run_mod
from factor_cli.train.config import load_config

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy")


def test_digest_is_sha256_of_canonical_json_without_where_to_write() -> None:
    cfg = load_config("smoke")
    data = cfg.model_dump(mode="json")
    del data["output_dir"], data["tracking_uri"]
    assert cfg.digest() == hashlib.sha256(canonical_json(data).encode("utf-8")).hexdigest()
    moved = load_config("smoke", ["output_dir=/elsewhere/runs", "tracking_uri=/tmp/other.db"])
    assert moved.digest() == cfg.digest()
    for change in ("seed=7", "method=grpo", "optim.lr=0.001", "env.games=[cookingworld]"):
        assert load_config("smoke", [change]).digest() != cfg.digest(), change
    assert config_hash(cfg) == cfg.digest()  # the ledger's definition defers to it


@pytest.fixture
def uri(tmp_path: Path) -> str:
    path = tmp_path / "mlflow.db"
    store.open_client(f"sqlite:///{path}", create=True)
    return f"sqlite:///{path}"


def test_ledger_tag_is_the_digest(uri: str) -> None:
    cfg = load_config("smoke", [f"tracking_uri={uri}"])
    with start_run(
        cfg, study=cfg.study, method=cfg.method, env=cfg.env.name, seed=cfg.seed, backbone="b",
        tracking_uri=uri,
    ) as run:  # fmt: skip
        pass
    got = MlflowClient(uri).get_run(run.run_id).data
    assert got.tags["config_hash"] == cfg.digest()
    assert got.params["output_dir"] == "runs" and got.params["rollout.k"] == "4"  # params kept


def test_train_opens_its_run_with_the_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """``train`` hands the config itself to the ledger, so its tag is ``cfg.digest()``."""
    seen: list[str] = []

    class Stop(Exception):
        pass

    def fake_start_run(config, **kwargs):
        seen.append(config_hash(config))
        raise Stop

    monkeypatch.setattr(run_mod, "init_distributed", lambda device: None)
    monkeypatch.setattr(run_mod, "warm_start", lambda cfg, progress, log: cfg.model.path)
    monkeypatch.setattr(run_mod, "start_run", fake_start_run)
    cfg = load_config("smoke", ["seed=3"])
    with pytest.raises(Stop):
        run_mod.train(cfg, lambda *a: None, lambda s: None)
    assert seen == [cfg.digest()]
