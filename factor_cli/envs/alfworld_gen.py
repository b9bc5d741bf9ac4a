"""Offline ALFWorld games: ALFRED-style PDDL problems of all six task types for the shipped domain.

ALFWorld's games come from ALFRED trajectories (a download that cannot happen everywhere). This
module writes games of the same form so the real engine (:mod:`factor_cli.envs.alfworld`) runs
without it. Each game is a folder with the three files ALFWorld uses:

- ``initial_state.pddl``: the PDDL problem for ALFWorld's ``alfred.pddl`` domain: objects and
  receptacles with ALFRED-style ids (``Apple|+01.20|+00.91|-02.37`` mangled to
  ``Apple_bar__plus_01_dot_20_...``, which ALFWorld's demangler turns into ``apple 1``), their
  types and affordances, one location per receptacle, and the goal from ALFWorld's goal library
  (``alfworld.gen.goal_library``) for the task type.
- ``traj_data.json``: ``task_type``, ``pddl_params`` (object/parent/toggle targets, the keys
  ALFWorld's handcoded expert reads), ``goal_desc`` (the templated goal sentence, templates from
  ALFWorld's goal library), ``expert_plan`` (a winning command sequence), the scene and the
  generator's parameters.
- ``game.tw-pddl``: what the engine loads (the JSON ALFWorld's ``alfworld-generate`` writes):
  ``pddl_domain``, ``grammar`` (the shipped grammar with the goal sentence inserted),
  ``pddl_problem``, ``solvable`` and ``walkthrough`` (the expert plan).

Scenes follow ALFRED: each game takes the object and receptacle types of a real AI2-THOR floor
plan (the ``FloorPlan*-objects.json`` layouts shipped with alfworld), with instance counts of
openable furniture from its ``FloorPlan*-openable.json`` (at most :data:`MAX_PER_TYPE` per type).
The train fold uses ALFRED's train scenes and the eval fold its test scenes, so eval rooms are
unseen in training (as ALFWorld's valid_unseen). Room types per task follow ALFRED's
``GOALS_VALID`` (heat/cool in kitchens, clean in kitchens and bathrooms, look in living rooms and
bedrooms). Objects are placed only in receptacles that can hold them (ALFRED's
``VAL_RECEPTACLE_OBJECTS``); the target never starts in a receptacle of the goal's type.

Why every game is winnable: the expert plan is written from the known layout (go to the
receptacle holding the target, open it if openable, take the target, go to the sink / microwave /
fridge and clean / heat / cool it, or go to the lamp and use it, go to the goal receptacle, open
it if openable, put the target there; twice for pick-two), then played through the engine before
the files are written: every command must be admissible and the goal must hold exactly after the
last one, else generation fails. The engine names objects itself, so the plan uses its names.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from .alfworld import (
    GAME_FILE,
    GENERATED_FOLDS,
    GENERATED_MARKER,
    INSTALL,
    PROBLEM_FILE,
    TASK_TYPES,
    TRAJ_FILE,
    data_kind,
    list_games,
    make_engine,
    shipped_logic,
    task_type_of,
)
from .base import EnvError, EnvUnavailable

GENERATOR_VERSION = 1
"""Bump when the output of :func:`generate` changes for the same arguments."""

MAX_PER_TYPE = 4
"""At most this many receptacles of one type (kitchens have up to 13 cabinets): shorter intros."""

ROOMS = {
    "Kitchen": range(1, 31),
    "LivingRoom": range(201, 231),
    "Bedroom": range(301, 331),
    "Bathroom": range(401, 431),
}
ROOMS_FOR_TASK = {
    # ALFRED's GOALS_VALID (alfworld.gen.constants).
    "pick_and_place_simple": ("Kitchen", "LivingRoom", "Bathroom", "Bedroom"),
    "look_at_obj_in_light": ("LivingRoom", "Bedroom"),
    "pick_clean_then_place_in_recep": ("Kitchen", "Bathroom"),
    "pick_heat_then_place_in_recep": ("Kitchen",),
    "pick_cool_then_place_in_recep": ("Kitchen",),
    "pick_two_obj_and_place": ("Kitchen", "LivingRoom", "Bathroom", "Bedroom"),
}
TOOL_FOR_TASK = {
    # alfred.pddl: CleanObject needs a SinkBasinType receptacle (the bathtub case is commented out).
    "pick_clean_then_place_in_recep": ("SinkBasin", "clean"),
    "pick_heat_then_place_in_recep": ("Microwave", "heat"),
    "pick_cool_then_place_in_recep": ("Fridge", "cool"),
}
AFFORDANCE_FOR_TASK = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
LAMPS = ("DeskLamp", "FloorLamp")
LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "DiningTable", "CoffeeTable")
"""Where a lamp stands (ALFWorld's ToggleObject needs the lamp in a receptacle)."""
BASINS = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}
"""ALFRED ids of basins are 'Sink|x|y|z|SinkBasin'; the demangler names them 'sinkbasin N'."""


# -- ALFRED's tables ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Tables:
    """ALFRED's object tables, as sorted tuples (its sets have no stable iteration order)."""

    holds: dict[str, tuple[str, ...]]
    """Receptacle type -> object types it can hold (VAL_RECEPTACLE_OBJECTS)."""
    affords: dict[str, frozenset[str]]
    """Affordance (Cleanable, Heatable, Coolable, Sliceable, Toggleable) -> object types."""
    openable: frozenset[str]
    movable: frozenset[str]
    templates: dict[str, tuple[str, ...]]
    goals: dict[str, str]
    train_scenes: tuple[int, ...]
    test_scenes: tuple[int, ...]
    layouts: Path


@cache
def tables() -> Tables:
    """Load ALFRED's constants and goal library from the installed alfworld package."""
    try:
        import alfworld.gen.constants as c
        import alfworld.gen.goal_library as gl
    except ImportError as err:
        raise EnvUnavailable(f"alfworld is not installed: {INSTALL}") from err
    return Tables(
        holds={r: tuple(sorted(v)) for r, v in sorted(c.VAL_RECEPTACLE_OBJECTS.items())},
        affords={k: frozenset(v) for k, v in c.VAL_ACTION_OBJECTS.items()},
        openable=frozenset(c.OPENABLE_CLASS_LIST),
        movable=frozenset(c.MOVABLE_RECEPTACLES),
        templates={t: tuple(gl.gdict[t]["templates"]) for t in TASK_TYPES},
        goals={t: str(gl.gdict[t]["pddl"]) for t in TASK_TYPES},
        train_scenes=tuple(c.TRAIN_SCENE_NUMBERS),
        test_scenes=tuple(c.TEST_SCENE_NUMBERS),
        layouts=Path(c.__file__).parent / "layouts",
    )


@dataclass(frozen=True)
class Scene:
    """The types of one AI2-THOR floor plan, as ALFRED's layouts list them."""

    number: int
    room: str
    receptacles: dict[str, int]
    """Receptacle type -> number of instances (1 unless the openable layout lists more)."""
    objects: tuple[str, ...]
    """Pickable object types present that some receptacle of the scene can hold."""
    lamps: tuple[str, ...]


@cache
def scene(number: int) -> Scene:
    """Read floor plan ``number`` from the layouts shipped with alfworld."""
    t = tables()
    names = json.loads((t.layouts / f"FloorPlan{number}-objects.json").read_text())
    openable = json.loads((t.layouts / f"FloorPlan{number}-openable.json").read_text())
    counts: dict[str, int] = {}
    for object_id in openable:
        kind = object_id.split("|")[0]
        kind = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}.get(kind, kind)
        counts[kind] = counts.get(kind, 0) + 1
    recs = {n for n in names if n in t.holds and n not in t.movable}
    holdable = {o for r in recs for o in t.holds[r]}
    room = next(r for r, numbers in ROOMS.items() if number in numbers)
    return Scene(
        number=number,
        room=room,
        receptacles={r: min(max(counts.get(r, 1), 1), MAX_PER_TYPE) for r in sorted(recs)},
        objects=tuple(sorted({n for n in names if n in holdable and not n.endswith("Sliced")})),
        lamps=tuple(sorted(n for n in names if n in LAMPS)),
    )


# -- one game ------------------------------------------------------------------------------------
@dataclass
class Layout:
    """A sampled game: receptacles and objects with ALFRED ids, and where each object is."""

    task_type: str
    scene: Scene
    target: str
    parent: str | None
    toggle: str | None
    receptacles: dict[str, str] = field(default_factory=dict)
    """ALFRED receptacle id -> type."""
    objects: dict[str, str] = field(default_factory=dict)
    """ALFRED object id -> type."""
    inside: dict[str, str] = field(default_factory=dict)
    """Object id -> receptacle id holding it."""
    location: dict[str, str] = field(default_factory=dict)
    """Receptacle id -> location id."""
    start: str = ""
    goal_desc: str = ""
    _taken: set[str] = field(default_factory=set)

    def new_id(self, kind: str, rng: random.Random) -> str:
        """A fresh ALFRED-style id 'Kind|x|y|z' ('Sink|x|y|z|SinkBasin' for basins)."""
        while True:
            coords = "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))
            ident = f"{BASINS[kind]}|{coords}|{kind}" if kind in BASINS else f"{kind}|{coords}"
            if ident not in self._taken:
                self._taken.add(ident)
                return ident

    def new_location(self, rng: random.Random) -> str:
        """A fresh ALFRED-style location 'loc|x|z|rotation|horizon'."""
        while True:
            loc = (
                f"loc|{rng.randint(-12, 12)}|{rng.randint(-12, 12)}|{rng.randint(0, 3)}|"
                f"{rng.choice((0, 15, 30, 45, 60))}"
            )
            if loc not in self._taken:
                self._taken.add(loc)
                return loc

    def of_type(self, kind: str) -> list[str]:
        """Receptacle ids of one type, in creation order."""
        return [r for r, k in self.receptacles.items() if k == kind]

    def place(self, obj: str, kinds: list[str], rng: random.Random, avoid: str = "") -> str:
        """Put a new ``obj`` in a receptacle of one of ``kinds`` (type first, then instance),
        never in receptacle ``avoid``; returns the object's id."""
        kinds = [k for k in kinds if any(r != avoid for r in self.of_type(k))]
        oid = self.new_id(obj, rng)
        self.objects[oid] = obj
        self.inside[oid] = rng.choice([r for r in self.of_type(rng.choice(kinds)) if r != avoid])
        return oid


def _eligible(task_type: str, sc: Scene) -> bool:
    if sc.room not in ROOMS_FOR_TASK[task_type]:
        return False
    if task_type == "look_at_obj_in_light":
        return bool(sc.lamps) and any(h in sc.receptacles for h in LAMP_HOSTS)
    tool = TOOL_FOR_TASK.get(task_type)
    return tool is None or tool[0] in sc.receptacles


def _holders(sc: Scene, obj: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Receptacle types of the scene that can hold ``obj``, minus ``exclude``."""
    t = tables()
    return [r for r in sc.receptacles if obj in t.holds[r] and r not in exclude]


def _sample_targets(
    task_type: str, sc: Scene, rng: random.Random
) -> tuple[str, str | None, str | None] | None:
    """(target object type, goal receptacle type, lamp type), or None if the scene has none."""
    t = tables()
    objs = list(sc.objects)
    affordance = AFFORDANCE_FOR_TASK.get(task_type)
    if affordance:
        objs = [o for o in objs if o in t.affords[affordance]]
    if task_type == "look_at_obj_in_light":
        objs = [o for o in objs if len(_holders(sc, o)) >= 2]
        return (rng.choice(objs), None, rng.choice(sc.lamps)) if objs else None
    tool = TOOL_FOR_TASK.get(task_type, ("",))[0]
    excluded = (tool, "BathtubBasin") if tool == "SinkBasin" else (tool,)  # no basin as the goal
    # The goal type must hold the target, and the target must fit somewhere else to start.
    pairs = [
        (o, p)
        for o in objs
        for p in _holders(sc, o, excluded)
        if [r for r in _holders(sc, o) if r != p]
    ]
    if not pairs:
        return None
    obj, parent = rng.choice(pairs)
    return obj, parent, None


def sample_layout(task_type: str, scenes: tuple[int, ...], rng: random.Random) -> Layout:
    """Sample a game of ``task_type`` in one of ``scenes`` (see the module docstring)."""
    candidates = [n for n in scenes if _eligible(task_type, scene(n))]
    for _ in range(100):
        sc = scene(rng.choice(candidates))
        targets = _sample_targets(task_type, sc, rng)
        if targets is not None:
            return _furnish(Layout(task_type, sc, *targets), rng)
    raise EnvError(f"alfworld_gen: could not sample a {task_type} game in scenes {scenes[:3]}...")


def _furnish(lay: Layout, rng: random.Random) -> Layout:
    """Add receptacles, the lamp, the targets, 6-12 distractors and the goal sentence."""
    sc = lay.scene
    lay.start = lay.new_location(rng)
    for kind, count in sc.receptacles.items():
        for _ in range(count):
            rid = lay.new_id(kind, rng)
            lay.receptacles[rid] = kind
            lay.location[rid] = lay.new_location(rng)
    lamp_host = ""
    if lay.toggle:
        lamp = lay.place(lay.toggle, [h for h in LAMP_HOSTS if h in sc.receptacles], rng)
        lamp_host = lay.inside[lamp]
    two = lay.task_type == "pick_two_obj_and_place"
    for _ in range(rng.randint(2, 3) if two else rng.randint(1, 2)):
        lay.place(
            lay.target,
            [r for r in _holders(sc, lay.target) if r != lay.parent],
            rng,
            avoid=lamp_host,
        )
    others = [o for o in sc.objects if o != lay.target]
    for _ in range(rng.randint(6, 12)):
        obj = rng.choice(others)
        lay.place(obj, _holders(sc, obj), rng)
    template = rng.choice(tables().templates[lay.task_type])
    lay.goal_desc = template.format(
        obj=lay.target.lower(),
        recep=(lay.parent or "").lower(),
        toggle=(lay.toggle or "").lower(),
        mrecep="",
    )
    return lay


def mangle(name: str) -> str:
    """ALFRED's PDDL-safe form of an id (``PlannedGameState.fix_pddl_str_chars``)."""
    for old, new in (
        ("-", "_minus_"),
        ("|", "_bar_"),
        ("+", "_plus_"),
        (".", "_dot_"),
        (",", "_comma_"),
    ):
        name = name.replace(old, new)
    return name


def problem_pddl(lay: Layout, problem_id: str) -> str:
    """The PDDL problem of a layout for ALFWorld's alfred.pddl domain."""
    t = tables()
    m = mangle
    otypes = sorted({*lay.objects.values(), lay.target, *([lay.toggle] if lay.toggle else [])})
    rtypes = sorted(set(lay.receptacles.values()) | ({lay.parent} if lay.parent else set()))
    objects = ["agent1 - agent"]
    objects += [f"{o}Type - otype" for o in otypes] + [f"{r}Type - rtype" for r in rtypes]
    objects += [f"{m(o)} - object" for o in sorted(lay.objects)]
    objects += [f"{m(r)} - receptacle" for r in sorted(lay.receptacles)]
    objects += [f"{m(loc)} - location" for loc in sorted({lay.start, *lay.location.values()})]
    init = [f"(atLocation agent1 {m(lay.start)})"]
    for rid, kind in sorted(lay.receptacles.items()):
        init += [
            f"(receptacleType {m(rid)} {kind}Type)",
            f"(receptacleAtLocation {m(rid)} {m(lay.location[rid])})",
        ]
        if kind in t.openable:
            init.append(f"(openable {m(rid)})")
    for oid, kind in sorted(lay.objects.items()):
        rid = lay.inside[oid]
        init += [
            f"(objectType {m(oid)} {kind}Type)",
            f"(inReceptacle {m(oid)} {m(rid)})",
            f"(objectAtLocation {m(oid)} {m(lay.location[rid])})",
        ]
        if kind in LAMPS:
            init.append(f"(toggleable {m(oid)})")
            continue
        init.append(f"(pickupable {m(oid)})")
        if kind in t.movable:
            init.append(f"(isReceptacleObject {m(oid)})")
        for affordance, pred in (
            ("Cleanable", "cleanable"),
            ("Heatable", "heatable"),
            ("Coolable", "coolable"),
            ("Sliceable", "sliceable"),
        ):
            if kind in t.affords[affordance]:
                init.append(f"({pred} {m(oid)})")
    init += [
        f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes if o in t.holds.get(r, ())
    ]
    goal = (
        t.goals[lay.task_type]
        .replace("#", "-")
        .format(obj=lay.target, recep=lay.parent or "", toggle=lay.toggle or "", mrecep="")
    )
    # The goal library's text closes the (define ...) form itself.
    return (
        f"(define (problem {problem_id})\n    (:domain alfred)\n    (:objects\n        "
        + "\n        ".join(objects)
        + "\n    )\n    (:init\n        "
        + "\n        ".join(init)
        + "\n    )\n"
        + goal.rstrip()
        + "\n"
    )


def expert_plan(lay: Layout, names: dict[str, str]) -> list[str]:
    """A winning command sequence for ``lay``; ``names`` maps mangled ids to the engine's names."""
    plan: list[str] = []
    here, opened = lay.start, set()

    def name(ident: str) -> str:
        return names[mangle(ident).lower()]

    def go(rid: str) -> None:
        nonlocal here
        if here != lay.location[rid]:
            plan.append(f"go to {name(rid)}")
            here = lay.location[rid]
        if lay.receptacles[rid] in tables().openable and rid not in opened:
            plan.append(f"open {name(rid)}")
            opened.add(rid)

    targets = sorted(o for o, k in lay.objects.items() if k == lay.target)
    goal_rec = sorted(r for r, k in lay.receptacles.items() if k == lay.parent)
    for oid in targets[: 2 if lay.task_type == "pick_two_obj_and_place" else 1]:
        go(lay.inside[oid])
        plan.append(f"take {name(oid)} from {name(lay.inside[oid])}")
        if lay.task_type in TOOL_FOR_TASK:
            tool, verb = TOOL_FOR_TASK[lay.task_type]
            station = sorted(r for r, k in lay.receptacles.items() if k == tool)[0]
            if here != lay.location[station]:
                plan.append(f"go to {name(station)}")
                here = lay.location[station]
            plan.append(f"{verb} {name(oid)} with {name(station)}")
        if lay.task_type == "look_at_obj_in_light":
            lamp = next(o for o, k in lay.objects.items() if k == lay.toggle)
            if here != lay.location[lay.inside[lamp]]:
                plan.append(f"go to {name(lay.inside[lamp])}")
            plan.append(f"use {name(lamp)}")
            return plan
        go(goal_rec[0])
        plan.append(f"move {name(oid)} to {name(goal_rec[0])}")
    return plan


def _play(engine: Any, plan: list[str], where: str) -> None:
    """Play ``plan`` through a loaded engine: every command admissible, won exactly at the end."""
    state = engine.reset()
    for k, command in enumerate(plan):
        if state["won"]:
            raise EnvError(f"alfworld_gen: {where} is won before command {k} ({command!r})")
        if command not in state["admissible_commands"]:
            raise EnvError(
                f"alfworld_gen: {where}: expert command {k} {command!r} is not admissible"
            )
        state, _, _ = engine.step(command)
    if not state["won"]:
        raise EnvError(f"alfworld_gen: {where}: the expert plan does not win")


# -- the public functions ---------------------------------------------------------------------
def generate(out_dir: Path, per_category: int, seed: int, split: str) -> list[Path]:
    """Write ``per_category`` games of each of the six task types for fold ``split``.

    Args:
        out_dir: the data root; games go to ``out_dir/{split}/{task_type}-{Target}-None-
            {Parent|Lamp}-{scene}/trial_s{seed}_{k:04d}/`` (k = 0..per_category-1), and
            ``out_dir/factor_alfworld_gen.json`` records each fold's seed, per_category and game
            count. Play them with ``AlfWorldEnv(data_root=out_dir)`` or ALFWORLD_DATA=out_dir.
        per_category: games per task type (>= 1); 6 * per_category games in all.
        seed: with ``split`` and the task type, seeds each game's own generator
            (``random.Random(f"{seed}/{split}/{task_type}/{k}")``), so the output is the same
            bytes for the same arguments (in any process), and game k does not depend on
            ``per_category``.
        split: 'train' (ALFRED's train scenes) or 'eval' (its test scenes: unseen rooms).

    Every game is checked before it is written: its expert plan is played through the ALFWorld
    engine and must win (see the module docstring), else :class:`EnvError`.

    Running it again with the same arguments rewrites the same files (and completes an
    interrupted run). Writing a fold with other arguments, or into a fold folder the marker does
    not record, is refused (a manifest must describe one set): use a new folder.

    Returns:
        The game folders written, in order (task type in ALFWorld's order, then k).
    """
    if split not in GENERATED_FOLDS:
        raise ValueError(f"alfworld_gen split {split!r} is not one of {', '.join(GENERATED_FOLDS)}")
    if per_category < 1:
        raise ValueError(f"alfworld_gen per_category must be >= 1, got {per_category}")
    out_dir = Path(out_dir)
    if data_kind(out_dir) == "official":
        raise EnvError(
            f"alfworld_gen: {out_dir} holds the official json_2.1.1 data; write the "
            "generated set to another folder"
        )
    marker = out_dir / GENERATED_MARKER
    record = json.loads(marker.read_text()) if marker.is_file() else {}
    params = {"seed": seed, "per_category": per_category, "version": GENERATOR_VERSION}
    old, folder = record.get(split), out_dir / GENERATED_FOLDS[split]
    if old is not None and {k: old.get(k) for k in params} != params:
        raise EnvError(
            f"alfworld_gen: {folder} was generated with {old}; refusing to mix it "
            f"with {params}: write to a new folder or delete {folder}"
        )
    if old is None and folder.is_dir() and any(folder.iterdir()):
        raise EnvError(
            f"alfworld_gen: {folder} holds files that {marker} does not record; "
            f"write to a new folder or delete {folder}"
        )
    record[split] = {**params, "games": None}  # None until every game is written
    out_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    t = tables()
    scenes = t.train_scenes if split == "train" else t.test_scenes
    domain, grammar = shipped_logic()
    engine = make_engine()
    written: list[Path] = []
    try:
        for task_type in TASK_TYPES:
            for k in range(per_category):
                written.append(
                    _write_game(out_dir, split, seed, task_type, k, scenes, domain, grammar, engine)
                )
    finally:
        engine.close()
    record[split]["games"] = len(written)
    marker.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return written


def _write_game(
    out_dir: Path,
    split: str,
    seed: int,
    task_type: str,
    k: int,
    scenes: tuple[int, ...],
    domain: str,
    grammar: str,
    engine: Any,
) -> Path:
    rng = random.Random(f"{seed}/{split}/{task_type}/{k}")
    lay = sample_layout(task_type, scenes, rng)
    trial = f"trial_s{seed}_{k:04d}"
    folder = (
        out_dir / split / f"{task_type}-{lay.target}-None-{lay.parent or lay.toggle}-"
        f"{lay.scene.number}" / trial
    )
    problem = problem_pddl(lay, f"{split}_{task_type}_{seed}_{k}")
    game = {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", lay.goal_desc),
        "pddl_problem": problem,
        "solvable": False,
        "walkthrough": None,
    }
    engine.load(game)
    names = {info.id: info.name for info in engine._entity_infos.values()}
    plan = expert_plan(lay, names)
    _play(engine, plan, f"{folder.relative_to(out_dir)}")
    game.update(solvable=True, walkthrough=plan)
    traj = {
        "task_type": task_type,
        "task_id": f"{split}/{task_type}/{seed}/{k}",
        "pddl_params": {
            "object_target": lay.target,
            "parent_target": lay.parent or "",
            "toggle_target": lay.toggle or "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "goal_desc": lay.goal_desc,
        "expert_plan": plan,
        "scene": {
            "floor_plan": f"FloorPlan{lay.scene.number}",
            "scene_num": lay.scene.number,
            "room_type": lay.scene.room,
        },
        "generator": {
            "module": __name__,
            "version": GENERATOR_VERSION,
            "seed": seed,
            "split": split,
            "index": k,
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROBLEM_FILE).write_text(problem)
    (folder / TRAJ_FILE).write_text(json.dumps(traj, indent=2, sort_keys=True) + "\n")
    (folder / GAME_FILE).write_text(json.dumps(game, sort_keys=True))
    return folder


def split_rows(data_root: Path, seed: int) -> list[dict]:
    """One row per playable instance under ``data_root``: the ALFWorld split manifest.

    Rows are dicts with keys ``instance_id`` (the game folder relative to ``data_root``),
    ``split`` ('train' | 'eval'), ``category`` (the task type, one of the six) and ``episode``
    (always 0: every game is one episode; no game repeats), sorted by split ('train' first)
    then instance id.

    Official data (``data_root/json_2.1.1``): train = every playable game of json_2.1.1/train,
    eval = every playable game of json_2.1.1/valid_unseen (ALFWorld's rule: a solvable game file
    of one of the six task types, no movable/sliced trajectory). ALFWorld fixes these folds, so
    nothing is sampled and ``seed`` is not used.

    Generated set (``factor_alfworld_gen.json`` at the root): train = the generated train fold,
    eval = the generated eval fold. ``seed`` must be the seed both folds were generated with, each
    fold's generation must have finished and left exactly the games it recorded (all read from
    the marker); otherwise :class:`EnvError`, so a manifest cannot describe another or a partial
    set.

    The folds are disjoint by construction (different folders; for a generated set also different
    scenes); a game id in both raises :class:`EnvError`.
    """
    data_root = Path(data_root)
    kind = data_kind(data_root)
    if kind is None:
        raise EnvUnavailable(
            f"alfworld: {data_root} holds neither json_2.1.1/ nor a generated set "
            f"({GENERATED_MARKER}); run `factor envs alfworld-generate --out {data_root}`"
        )
    record = json.loads((data_root / GENERATED_MARKER).read_text()) if kind == "generated" else {}
    rows: list[dict] = []
    for split in ("train", "eval"):
        ids = list_games(data_root, split)
        if kind == "generated":
            _check_fold(data_root, split, record.get(split) or {}, seed, len(ids))
        for instance_id in ids:
            category = task_type_of(data_root / instance_id)
            rows.append(
                {"instance_id": instance_id, "split": split, "category": category, "episode": 0}
            )
    ids = [r["instance_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise EnvError(f"alfworld: a game of {data_root} is in both folds")
    return rows


def _check_fold(root: Path, split: str, record: dict, seed: int, n_games: int) -> None:
    """A generated fold must be complete, of ``seed``, with exactly the games it recorded."""
    fix = f"regenerate it: `factor envs alfworld-generate --out {root} --seed {seed}`"
    got = record.get("seed")
    if got != seed:
        raise EnvError(
            f"alfworld: the {split} fold of {root} was generated with seed {got}, not "
            f"{seed}; use --seed {got} or {fix}"
        )
    if record.get("games") is None:
        raise EnvError(f"alfworld: generating the {split} fold of {root} did not finish; {fix}")
    if record["games"] != n_games:
        raise EnvError(
            f"alfworld: the {split} fold of {root} has {n_games} playable games, its "
            f"generation wrote {record['games']}; {fix}"
        )
