"""ALFRED rooms and the PDDL problems we write in them.

Rooms are the 120 ALFRED floor plans whose layouts ship inside the alfworld package
(`alfworld/gen/layouts/FloorPlanN-{openable,objects}.json`: receptacle ids with their
navigation poses, and the object types present). Object/receptacle compatibility, object
affordances (heatable, coolable, cleanable, ...) and the six goal forms and description
templates come from alfworld's own tables (`alfworld.gen.constants`, `alfworld.gen.goal_library`).
We choose which objects a problem holds and where they lie, then write the problem in ALFRED's
naming (`Mug|+00.12|+00.90|-01.50` -> `Mug_bar__plus_00_dot_12_...`), which alfworld's demangler
turns back into "mug 1".
"""

from __future__ import annotations

import collections
import functools
import importlib.resources
import json
import random
from dataclasses import dataclass
from typing import Any

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
ROOM_TYPES = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231),
              "Bedroom": range(301, 331), "Bathroom": range(401, 431)}
FLOOR_PLANS = tuple(n for numbers in ROOM_TYPES.values() for n in numbers)
#: the appliance each state-change task needs (type as in the PDDL domain's actions)
APPLIANCE = {"pick_clean_then_place_in_recep": "SinkBasin",
             "pick_heat_then_place_in_recep": "Microwave",
             "pick_cool_then_place_in_recep": "Fridge"}
LAMP = "DeskLamp"
#: receptacles a desk lamp stands on, most natural first
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "TVStand")
#: receptacle types ALFRED scenes list without a navigation pose; we add them (count per room)
_ADDED_COUNT = {"StoveBurner": 4}
#: rooms keep at most this many receptacles (surplus cabinets/drawers dropped): fast-downward's
#: replanner is a uniform-cost search whose time grows steeply with the number of places to go
MAX_RECEPTACLES = 24
#: distractor object kinds per problem (1-2 instances each), for the same reason
DISTRACTOR_KINDS = (3, 6)


def room_type(floor_plan: int) -> str:
    for name, numbers in ROOM_TYPES.items():
        if floor_plan in numbers:
            return name
    raise ValueError(f"floor_plan={floor_plan!r} is not an ALFRED floor plan (1-30, 201-230, 301-330, 401-430)")


def mangle(name: str) -> str:
    """ALFRED id -> PDDL identifier (`Mug|+00.12` -> `Mug_bar__plus_00_dot_12`)."""
    return (name.replace("|", "_bar_").replace("+", "_plus_")
            .replace("-", "_minus_").replace(".", "_dot_"))


@dataclass(frozen=True)
class Vocabulary:
    """alfworld's object/receptacle tables, as plain sets."""

    contains: dict[str, frozenset[str]]  # static receptacle type -> object types it can hold
    pickupable: frozenset[str]
    openable: frozenset[str]
    heatable: frozenset[str]
    coolable: frozenset[str]
    cleanable: frozenset[str]
    sliceable: frozenset[str]
    receptacle_objects: frozenset[str]  # movable containers (bowl, mug, ...), objects here
    goal_rooms: dict[str, frozenset[str]]  # task type -> room types where ALFRED poses it
    goal_pddl: dict[str, str]
    templates: dict[str, tuple[str, ...]]


@functools.lru_cache(maxsize=1)
def vocabulary() -> Vocabulary:
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as goals

    movable = frozenset(constants.MOVABLE_RECEPTACLES_SET)
    contains = {r: frozenset(o for o in objs if not o.endswith("Sliced"))
                for r, objs in constants.VAL_RECEPTACLE_OBJECTS.items() if r not in movable}
    actions = {k: frozenset(v) for k, v in constants.VAL_ACTION_OBJECTS.items()}
    return Vocabulary(
        contains=contains,
        pickupable=frozenset().union(*contains.values()),
        openable=frozenset(constants.OPENABLE_CLASS_SET),
        heatable=actions["Heatable"], coolable=actions["Coolable"],
        cleanable=actions["Cleanable"], sliceable=actions["Sliceable"],
        receptacle_objects=movable,
        goal_rooms={t: frozenset(constants.GOALS_VALID[t]) for t in TASK_TYPES},
        goal_pddl={t: goals.gdict[t]["pddl"] for t in TASK_TYPES},
        templates={t: tuple(goals.gdict[t]["templates"]) for t in TASK_TYPES},
    )


@dataclass(frozen=True)
class Receptacle:
    id: str  # ALFRED id, e.g. "Cabinet|+00.68|+00.50|-02.20" or "Sink|...|SinkBasin"
    type: str
    position: tuple[float, float, float]
    location: tuple[int, int, int, int]  # grid x, grid z, rotation/90, camera horizon


@dataclass(frozen=True)
class Scene:
    floor_plan: int
    room_type: str
    receptacles: tuple[Receptacle, ...]
    object_types: tuple[str, ...]  # pickupable types present that some receptacle here holds
    has_lamp: bool

    @functools.cached_property
    def receptacle_types(self) -> frozenset[str]:
        return frozenset(r.type for r in self.receptacles)

    def holders(self, object_type: str) -> list[Receptacle]:
        contains = vocabulary().contains
        return [r for r in self.receptacles if object_type in contains.get(r.type, ())]


def _layout(floor_plan: int, kind: str) -> Any:
    path = importlib.resources.files("alfworld.gen") / "layouts" / f"FloorPlan{floor_plan}-{kind}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _location(x: float, z: float, rotation: float, horizon: float) -> tuple[int, int, int, int]:
    # ALFRED's grid: 0.25 m cells, rotation in quarter turns
    return (round(x / 0.25), round(z / 0.25), round(rotation / 90) % 4, int(horizon))


def _receptacle_id(rtype: str, position: tuple[float, float, float]) -> str:
    coords = "|".join(f"{v:+06.2f}" for v in position)
    if rtype == "SinkBasin":
        return f"Sink|{coords}|SinkBasin"
    if rtype == "BathtubBasin":
        return f"Bathtub|{coords}|BathtubBasin"
    return f"{rtype}|{coords}"


@functools.lru_cache(maxsize=None)
def load_scene(floor_plan: int) -> Scene:
    """The receptacles and object types of an ALFRED floor plan (deterministic)."""
    vocab = vocabulary()
    receptacles = []
    for rid, pose in sorted(_layout(floor_plan, "openable").items()):
        parts = rid.split("|")
        rtype = parts[-1] if len(parts) == 5 else parts[0]
        if rtype not in vocab.contains:
            continue
        position = tuple(float(v) for v in parts[1:4])
        receptacles.append(Receptacle(rid, rtype, position, _location(*pose)))
    present = set(_layout(floor_plan, "objects"))
    # Appliances such as coffee machines and stove burners are listed without a pose: place
    # them at free grid cells inside the room's extent, seeded by the floor plan.
    rng = random.Random(f"orsd-alfworld-scene-{floor_plan}")
    xs = [r.position[0] for r in receptacles] or [0.0]
    zs = [r.position[2] for r in receptacles] or [0.0]
    used = {r.location[:2] for r in receptacles}
    for rtype in sorted(present & set(vocab.contains) - {r.type for r in receptacles}):
        for _ in range(_ADDED_COUNT.get(rtype, 1)):
            while True:
                x = round(rng.uniform(min(xs) - 0.5, max(xs) + 0.5) * 4) / 4
                z = round(rng.uniform(min(zs) - 0.5, max(zs) + 0.5) * 4) / 4
                if (round(x / 0.25), round(z / 0.25)) not in used:
                    break
            position = (x + rng.uniform(-0.3, 0.3), round(rng.uniform(0.1, 1.0), 2), z + rng.uniform(-0.3, 0.3))
            receptacle = Receptacle(_receptacle_id(rtype, position), rtype, position,
                                    _location(x, z, rng.choice((0, 90, 180, 270)), 30))
            used.add(receptacle.location[:2])
            receptacles.append(receptacle)
    while len(receptacles) > MAX_RECEPTACLES:
        counts = collections.Counter(r.type for r in receptacles)
        crowded, count = max(sorted(counts.items()), key=lambda item: item[1])
        if count == 1:
            break
        receptacles.remove(rng.choice([r for r in receptacles if r.type == crowded]))
    holdable = {o for r in receptacles for o in vocab.contains[r.type]}
    object_types = tuple(sorted(o for o in present if o in vocab.pickupable and o in holdable))
    has_lamp = LAMP in present and any(r.type in LAMP_HOLDERS for r in receptacles)
    return Scene(floor_plan, room_type(floor_plan), tuple(receptacles), object_types, has_lamp)


@dataclass(frozen=True)
class TaskSpec:
    """What a generated task asks and where; `placement_seed` fixes where objects lie."""

    task_type: str
    floor_plan: int
    object_target: str
    parent_target: str  # "" for look_at_obj_in_light
    toggle_target: str  # DeskLamp for look_at_obj_in_light, else ""
    template: int
    placement_seed: int

    @property
    def signature(self) -> tuple[Any, ...]:
        """The goal in its room, ignoring where objects start."""
        return (self.floor_plan, self.task_type, self.object_target, self.parent_target, self.toggle_target)

    @property
    def folder(self) -> str:
        """ALFWorld's folder name for a task (`pick_heat_then_place_in_recep-Mug-None-Cabinet-7`)."""
        last = self.parent_target or self.toggle_target
        return f"{self.task_type}-{self.object_target}-None-{last}-{self.floor_plan}"

    def description(self) -> str:
        template = vocabulary().templates[self.task_type][self.template]
        return template.format(obj=self.object_target.lower(), recep=self.parent_target.lower(),
                               toggle=self.toggle_target.lower(), mrecep="")


def _format_goal(spec: TaskSpec) -> str:
    text = vocabulary().goal_pddl[spec.task_type].format(
        obj=spec.object_target, recep=spec.parent_target, toggle=spec.toggle_target, mrecep="")
    return text.replace(" # ", " - ").strip()  # the library writes "?r # receptacle"


def _object_id(otype: str, near: Receptacle, rng: random.Random, taken: set[str]) -> str:
    while True:
        x, y, z = near.position
        position = (x + rng.uniform(-0.4, 0.4), y + rng.uniform(0.02, 0.3), z + rng.uniform(-0.4, 0.4))
        oid = f"{otype}|" + "|".join(f"{v:+06.2f}" for v in position)
        if oid not in taken:
            taken.add(oid)
            return oid


def build_problem(spec: TaskSpec, name: str) -> str:
    """The PDDL problem of `spec`: its room, the goal objects and a few kinds of distractors."""
    vocab, scene = vocabulary(), load_scene(spec.floor_plan)
    rng = random.Random(spec.placement_seed)
    excluded = {spec.parent_target}  # goal objects never start where the goal wants them
    if spec.task_type == "pick_cool_then_place_in_recep":
        excluded.add("Fridge")  # things in the fridge start cold (as in ALFRED)
    goal_count = rng.randint(2, 3) if spec.task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
    others = [t for t in scene.object_types if t != spec.object_target]
    distractors = rng.sample(others, min(len(others), rng.randint(*DISTRACTOR_KINDS)))
    placements: list[tuple[str, str, Receptacle]] = []  # (object type, object id, receptacle)
    taken: set[str] = set()
    goal_holders = [r for r in scene.holders(spec.object_target) if r.type not in excluded]
    if not goal_holders:
        raise ValueError(f"no receptacle can hold a {spec.object_target} in floor plan {spec.floor_plan}")
    for _ in range(goal_count):
        holder = rng.choice(goal_holders)
        placements.append((spec.object_target, _object_id(spec.object_target, holder, rng, taken), holder))
    for otype in sorted(distractors):
        for _ in range(rng.choice((1, 1, 2))):
            holder = rng.choice(scene.holders(otype))
            placements.append((otype, _object_id(otype, holder, rng, taken), holder))
    if spec.toggle_target:
        holders = next([r for r in scene.receptacles if r.type == t] for t in LAMP_HOLDERS
                       if any(r.type == t for r in scene.receptacles))
        holder = rng.choice(holders)
        placements.append((spec.toggle_target, _object_id(spec.toggle_target, holder, rng, taken), holder))

    used = {r.location[:2] for r in scene.receptacles}
    while True:  # the agent starts in the middle of the room, at no receptacle
        start = (rng.randint(-12, 12), rng.randint(-12, 12), rng.randint(0, 3), 30)
        if start[:2] not in used:
            break
    loc = {r.id: mangle("loc|%d|%d|%d|%d" % r.location) for r in scene.receptacles}
    start_loc = mangle("loc|%d|%d|%d|%d" % start)
    object_types = sorted({t for t, _, _ in placements})
    receptacle_types = sorted(scene.receptacle_types)

    objects = ["agent1 - agent"]
    objects += [f"{t}Type - otype" for t in object_types]
    objects += [f"{t}Type - rtype" for t in receptacle_types]
    objects += sorted(f"{mangle(oid)} - object" for _, oid, _ in placements)
    objects += sorted(f"{mangle(r.id)} - receptacle" for r in scene.receptacles)
    objects += sorted({f"{v} - location" for v in loc.values()} | {f"{start_loc} - location"})

    init = [f"(atLocation agent1 {start_loc})"]
    for r in scene.receptacles:
        init.append(f"(receptacleType {mangle(r.id)} {r.type}Type)")
        init.append(f"(receptacleAtLocation {mangle(r.id)} {loc[r.id]})")
        if r.type in vocab.openable:
            init.append(f"(openable {mangle(r.id)})")
    for rtype in receptacle_types:
        init += [f"(canContain {rtype}Type {t}Type)" for t in object_types if t in vocab.contains[rtype]]
    for otype, oid, holder in placements:
        o = mangle(oid)
        init += [f"(objectType {o} {otype}Type)", f"(inReceptacle {o} {mangle(holder.id)})",
                 f"(objectAtLocation {o} {loc[holder.id]})"]
        if otype == LAMP:
            init.append(f"(toggleable {o})")
            continue
        init.append(f"(pickupable {o})")
        for fact, kinds in (("isReceptacleObject", vocab.receptacle_objects), ("cleanable", vocab.cleanable),
                            ("heatable", vocab.heatable), ("coolable", vocab.coolable),
                            ("sliceable", vocab.sliceable)):
            if otype in kinds:
                init.append(f"({fact} {o})")
        if holder.type == "Fridge" and otype in vocab.coolable:
            init.append(f"(isCool {o})")
    lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects"]
    lines += [f"    {line}" for line in objects] + [")", "(:init"]
    lines += [f"    {line}" for line in sorted(init)] + [")", _format_goal(spec), ""]
    return "\n".join(lines)
