"""ALFWorld adapter and offline game generator, on the real ALFWorld engine.

The engine tests generate one game per task type and fold in a temporary folder (the official data
needs a download) and play them; they skip with the install command when alfworld is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factor_cli.envs import RestoreMismatch, UnknownInstance, make_env
from factor_cli.envs import alfworld as aw
from factor_cli.envs.base import EnvError, EnvUnavailable

INSTALL = "pip install 'factor-cli[alfworld]'  (or: pip install alfworld==0.4.2)"
needs_alfworld = pytest.mark.skipif(
    importlib.util.find_spec("alfworld") is None, reason=f"alfworld is not installed: {INSTALL}"
)
SEED = 7


# -- without the engine -------------------------------------------------------------------------
def test_task_from_intro() -> None:
    intro = (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in a room.\n\n"
        "Your task is to: put a mug in desk."
    )
    assert aw.task_from_intro(intro) == "put a mug in desk."
    assert aw.task_from_intro("no task here") == ""


@pytest.mark.parametrize(
    "bad", ["", "/abs/path", "train/../../etc", "train//x", "./train/x", "train/nope/trial_0"]
)
def test_bad_instance_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UnknownInstance, match="alfworld"):
        aw.game_path(tmp_path, bad)


def test_unknown_data_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EnvUnavailable, match="alfworld-generate"):
        aw.resolve_data_root(empty)
    monkeypatch.setenv("ALFWORLD_DATA", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.cache/alfworld
    monkeypatch.setattr(aw, "DEFAULT_GENERATED_ROOT", tmp_path / "none")
    with pytest.raises(EnvUnavailable, match="ALFWORLD_DATA"):
        aw.resolve_data_root()
    expected = (
        f"alfworld is not installed: {aw.INSTALL}"
        if importlib.util.find_spec("alfworld") is None
        else aw.NO_DATA
    )
    assert aw.AlfWorldEnv.availability() == expected
    with pytest.raises(EnvUnavailable, match="alfworld"):
        make_env("alfworld")


def test_split_rows_rejects_unknown_data(tmp_path: Path) -> None:
    from factor_cli.envs.alfworld_gen import split_rows

    with pytest.raises(EnvUnavailable, match="alfworld-generate"):
        split_rows(tmp_path, SEED)


# -- on the engine ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gen_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("alfworld") is None:
        pytest.skip(f"alfworld is not installed: {INSTALL}")
    from factor_cli.envs.alfworld_gen import generate

    root = tmp_path_factory.mktemp("alfworld-gen")
    for split in ("train", "eval"):
        games = generate(root, per_category=1, seed=SEED, split=split)
        assert len(games) == 6
    return root


@pytest.fixture(scope="module")
def env(gen_root: Path):
    with aw.AlfWorldEnv(data_root=gen_root) as alf:
        yield alf


def _game_of(root: Path, split: str, task_type: str) -> str:
    ids = [i for i in aw.list_games(root, split) if i.split("/")[1].startswith(task_type + "-")]
    assert len(ids) == 1, ids
    return ids[0]


@needs_alfworld
@pytest.mark.parametrize("split", ["train", "eval"])
@pytest.mark.parametrize("task_type", aw.TASK_TYPES)
def test_every_category_expert_plan_wins(env, gen_root: Path, split: str, task_type: str) -> None:
    iid = _game_of(gen_root, split, task_type)
    assert env.category(iid) == task_type
    plan = env.gold_actions(iid)
    obs = env.reset(iid)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert env.task_description() and env.task_description() in obs
    for k, action in enumerate(plan):
        assert not env.done, f"won before action {k}"
        assert action in env.valid_actions()
        step = env.step(action)
        assert step.valid
    assert step.done and step.reward == 1.0
    out = env.outcome()
    assert (out.outcome, out.success, out.invalid_actions, out.turns) == (1.0, True, 0, len(plan))


@needs_alfworld
def test_generated_rows_cover_six_categories_per_fold(gen_root: Path) -> None:
    from factor_cli.envs.alfworld_gen import split_rows

    rows = split_rows(gen_root, SEED)
    assert [r["split"] for r in rows] == ["train"] * 6 + ["eval"] * 6
    for split in ("train", "eval"):
        assert {r["category"] for r in rows if r["split"] == split} == set(aw.TASK_TYPES)
    assert {r["episode"] for r in rows} == {0}
    train = {r["instance_id"] for r in rows if r["split"] == "train"}
    evals = {r["instance_id"] for r in rows if r["split"] == "eval"}
    assert not train & evals
    # Eval rooms are unseen: ALFRED's test floor plans (1-6, 201-206, 301-306, 401-406).
    for iid in evals:
        scene = json.loads((gen_root / iid / aw.TRAJ_FILE).read_text())["scene"]["scene_num"]
        assert scene % 100 <= 6
    with pytest.raises(EnvError, match="seed"):
        split_rows(gen_root, SEED + 1)


@needs_alfworld
def test_game_files_and_determinism(gen_root: Path) -> None:
    from factor_cli.envs.alfworld_gen import problem_pddl, sample_layout, tables

    iid = _game_of(gen_root, "train", "pick_heat_then_place_in_recep")
    folder = gen_root / iid
    game = json.loads((folder / aw.GAME_FILE).read_text())
    traj = json.loads((folder / aw.TRAJ_FILE).read_text())
    assert game["solvable"] is True and game["walkthrough"] == traj["expert_plan"]
    assert game["pddl_problem"] == (folder / aw.PROBLEM_FILE).read_text()
    assert f"Your task is to: {traj['goal_desc']}" in game["grammar"]
    assert traj["task_type"] == "pick_heat_then_place_in_recep"
    assert traj["pddl_params"]["object_target"] in iid
    # The files come from the per-game generator seeded by (seed, split, task type, index).
    rng = random.Random(f"{SEED}/train/pick_heat_then_place_in_recep/0")
    lay = sample_layout("pick_heat_then_place_in_recep", tables().train_scenes, rng)
    problem_id = f"train_pick_heat_then_place_in_recep_{SEED}_0"
    assert problem_pddl(lay, problem_id) == game["pddl_problem"]
    other = sample_layout(
        "pick_heat_then_place_in_recep",
        tables().train_scenes,
        random.Random(f"{SEED + 1}/train/pick_heat_then_place_in_recep/0"),
    )
    assert problem_pddl(other, "x") != problem_pddl(lay, "x")
    # Another process with another string-hash seed writes the same problem (no set order leaks).
    code = (
        "import random, sys; from factor_cli.envs.alfworld_gen import *; "
        "t = 'pick_heat_then_place_in_recep'; "
        f"rng = random.Random('{SEED}/train/' + t + '/0'); "
        "lay = sample_layout(t, tables().train_scenes, rng); "
        f"sys.stdout.write(problem_pddl(lay, '{problem_id}'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert out.stdout == game["pddl_problem"]


@needs_alfworld
def test_generate_refuses_to_mix_sets(gen_root: Path) -> None:
    from factor_cli.envs.alfworld_gen import generate

    before = sorted(p.as_posix() for p in gen_root.rglob("*"))
    with pytest.raises(EnvError, match="new folder"):
        generate(gen_root, per_category=2, seed=SEED, split="train")
    with pytest.raises(ValueError, match="split"):
        generate(gen_root, per_category=1, seed=SEED, split="valid_seen")
    with pytest.raises(ValueError, match="per_category"):
        generate(gen_root, per_category=0, seed=SEED, split="train")
    assert sorted(p.as_posix() for p in gen_root.rglob("*")) == before


@needs_alfworld
def test_split_rows_rejects_partial_or_foreign_sets(gen_root: Path, tmp_path: Path) -> None:
    from factor_cli.envs.alfworld_gen import generate, split_rows

    root = tmp_path / "copy"
    shutil.copytree(gen_root, root)
    (root / "train" / "stray").mkdir()
    record = json.loads((root / aw.GENERATED_MARKER).read_text())
    (root / aw.GENERATED_MARKER).write_text(json.dumps({"eval": record["eval"]}))
    with pytest.raises(EnvError, match="does not record"):  # an unrecorded train folder
        generate(root, per_category=1, seed=SEED, split="train")
    (root / aw.GENERATED_MARKER).write_text(
        json.dumps({**record, "train": {**record["train"], "games": None}})
    )
    with pytest.raises(EnvError, match="did not finish"):
        split_rows(root, SEED)
    (root / aw.GENERATED_MARKER).write_text(json.dumps(record))
    shutil.rmtree(root / _game_of(root, "eval", "pick_two_obj_and_place"))
    with pytest.raises(EnvError, match="has 5 playable games"):
        split_rows(root, SEED)


@needs_alfworld
def test_invalid_action_and_restore(env, gen_root: Path) -> None:
    iid = _game_of(gen_root, "train", "pick_clean_then_place_in_recep")
    plan = env.gold_actions(iid)
    env.reset(iid)
    prefix = ["look", "fly to the moon", *plan[:3], "inventory"]
    for action in prefix:
        step = env.step(action)
        assert step.valid == (action != "fly to the moon")
    assert env.observations[2] == aw.INVALID_REPLY and env.invalid_actions == 1
    recorded = list(env.observations)

    with aw.AlfWorldEnv(data_root=gen_root) as other:
        last = other.restore(iid, prefix, recorded)
        assert last == recorded[-1] and other.observations == recorded
        assert other.invalid_actions == 1
        for action in plan[3:]:  # the restored state is the real one: the plan still wins
            other.step(action)
        assert other.success

        tampered = list(recorded)
        tampered[4] = tampered[4].replace("You", "We", 1)
        with pytest.raises(RestoreMismatch, match="observation 4"):
            other.restore(iid, prefix, tampered)


@needs_alfworld
def test_bad_instance_on_the_engine(env, gen_root: Path, tmp_path: Path) -> None:
    with pytest.raises(UnknownInstance):
        env.reset("train/no_such_task-X-None-Y-1/trial_s0_0000")
    with pytest.raises(UnknownInstance):
        env.reset("../outside")
    broken = tmp_path / "train" / "pick_and_place_simple-A-None-B-7" / "trial_x"
    shutil.copytree(gen_root / _game_of(gen_root, "train", "pick_and_place_simple"), broken)
    game = json.loads((broken / aw.GAME_FILE).read_text())
    (broken / aw.GAME_FILE).write_text(json.dumps({**game, "pddl_problem": "(define (problem"}))
    (tmp_path / aw.GENERATED_MARKER).write_text("{}")
    with aw.AlfWorldEnv(data_root=tmp_path) as alf, pytest.raises(EnvError, match="cannot load"):
        alf.reset(broken.relative_to(tmp_path).as_posix())


@needs_alfworld
def test_registry_and_canonical_description(
    gen_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(gen_root))
    assert aw.AlfWorldEnv.availability() is None
    with make_env("alfworld") as alf:
        assert alf.root == gen_root and alf.kind == "generated"
        iid = _game_of(gen_root, "eval", "look_at_obj_in_light")
        assert alf.canonical_description(iid) == (gen_root / iid / aw.GAME_FILE).read_text()


@needs_alfworld
def test_official_layout_and_handcoded_expert(gen_root: Path, tmp_path: Path) -> None:
    """A tree laid out like the official data is read with ALFWorld's rules; a game without a
    walkthrough gets its gold actions from ALFWorld's handcoded expert, which must win."""
    from factor_cli.envs.alfworld_gen import split_rows

    src = gen_root / _game_of(gen_root, "train", "look_at_obj_in_light")
    official = tmp_path / "data"
    for fold, name in (
        ("json_2.1.1/train", "look_at_obj_in_light-A-None-B-301"),
        ("json_2.1.1/valid_unseen", "look_at_obj_in_light-A-None-B-302"),
        ("json_2.1.1/train", "pick_and_place_with_movable_recep-A-B-C-1"),
        ("json_2.1.1/valid_seen", "look_at_obj_in_light-A-None-B-303"),
    ):
        shutil.copytree(src, official / fold / name / "trial_T0")
    trial = official / "json_2.1.1/train/look_at_obj_in_light-A-None-B-301/trial_T0"
    game_file = trial / aw.GAME_FILE
    game = json.loads(game_file.read_text())
    game["walkthrough"] = None
    game_file.write_text(json.dumps(game))
    unsolvable = official / "json_2.1.1/valid_unseen/look_at_obj_in_light-A-None-B-302/trial_T1"
    shutil.copytree(src, unsolvable)
    (unsolvable / aw.GAME_FILE).write_text(json.dumps({**game, "solvable": False}))

    rows = split_rows(official, seed=0)
    assert [(r["instance_id"], r["split"]) for r in rows] == [
        ("json_2.1.1/train/look_at_obj_in_light-A-None-B-301/trial_T0", "train"),
        ("json_2.1.1/valid_unseen/look_at_obj_in_light-A-None-B-302/trial_T0", "eval"),
    ]
    with aw.AlfWorldEnv(data_root=official) as alf:
        assert alf.kind == "official"
        iid = rows[0]["instance_id"]
        plan = alf.gold_actions(iid)  # no walkthrough: the handcoded expert plays it
        alf.reset(iid)
        for action in plan:
            alf.step(action)
        assert alf.success and alf.outcome().outcome == 1.0
