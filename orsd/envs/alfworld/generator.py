"""Seeded ALFWorld task sets: sampling, the planner check, and the on-disk cache.

Splits (ALFWorld's names):
- `train`: tasks in the 112 seen floor plans;
- `valid_seen`: new goals in the same rooms: the goal object of each task lies in that room in
  some train problem (as goal or distractor), but no train task poses that goal (task type,
  object, receptacle or lamp) in that room;
- `valid_unseen`: tasks in 8 floor plans (2 per room type) that no train or valid_seen task
  uses, so every (object, room) combination is new.

Every task is checked before it is kept: fast-downward's plan from the start state is played on
the engine and must win (`alfworld_engine.play_planner`). Checked games are written once, in
ALFWorld's own layout (`<split>/<task folder>/trial_*/game.tw-pddl` + `traj_data.json`), under
`<cache_dir>/gen<version>-alfworld<version>-seed<seed>/<split>-<size>/`, with a manifest.
Over 400 lines because the split rules, the sampling that obeys them and the cache key that
names them must change together.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import logging
import os
import queue
import random
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from orsd.envs.alfworld import engine as engine_lib
from orsd.envs.alfworld.scenes import (APPLIANCE, FLOOR_PLANS, TASK_TYPES, TaskSpec, build_problem,
                                       load_scene, vocabulary)

GENERATOR_VERSION = 1
#: floor plans held out for valid_unseen (ALFRED's valid-unseen rooms 10/219/308/424, plus one more each)
UNSEEN_FLOOR_PLANS = (10, 20, 219, 224, 308, 318, 424, 430)
DEFAULT_SPLIT_SIZES = {"train": 600, "valid_seen": 144, "valid_unseen": 144}

log = logging.getLogger("orsd.envs.alfworld")
_OBJECT_TYPE = re.compile(r"\(objectType \S+ (\w+)Type\)")


def split_floor_plans(split: str) -> tuple[int, ...]:
    if split == "valid_unseen":
        return UNSEEN_FLOOR_PLANS
    return tuple(n for n in FLOOR_PLANS if n not in UNSEEN_FLOOR_PLANS)


def feasible_parents(floor_plan: int, task_type: str, object_target: str) -> list[str]:
    """Goal receptacles (or [""] for the lamp task) that make a solvable task in this room."""
    vocab, scene = vocabulary(), load_scene(floor_plan)
    if scene.room_type not in vocab.goal_rooms[task_type] or object_target not in scene.object_types:
        return []
    if task_type == "look_at_obj_in_light":
        return [""] if scene.has_lamp else []
    appliance = APPLIANCE.get(task_type)
    if appliance and appliance not in scene.receptacle_types:
        return []
    affordance = {"SinkBasin": vocab.cleanable, "Microwave": vocab.heatable, "Fridge": vocab.coolable}
    if appliance and object_target not in affordance[appliance]:
        return []
    parents = []
    for parent in sorted(scene.receptacle_types - {appliance}):
        if object_target not in vocab.contains[parent]:
            continue
        start_excluded = {parent, "Fridge"} if task_type == "pick_cool_then_place_in_recep" else {parent}
        if any(r.type not in start_excluded for r in scene.holders(object_target)):
            parents.append(parent)
    return parents


def _make_spec(rng: random.Random, task_type: str, floor_plan: int, object_target: str,
               parent: str) -> TaskSpec:
    return TaskSpec(task_type=task_type, floor_plan=floor_plan, object_target=object_target,
                    parent_target=parent,
                    toggle_target="DeskLamp" if task_type == "look_at_obj_in_light" else "",
                    template=rng.randrange(len(vocabulary().templates[task_type])),
                    placement_seed=rng.getrandbits(32))


def spec_stream(seed: int, split: str, task_type: str, avoid: set[tuple[Any, ...]],
                seen_pairs: list[tuple[int, str]] | None = None) -> Iterator[TaskSpec]:
    """The seeded stream of candidate tasks of `task_type` for `split`.

    Signatures in `avoid` are skipped and each drawn one is added to it (so goals never repeat
    within a split). With `seen_pairs` (valid_seen) the (floor plan, goal object) pair comes from
    that list: objects seen in that room in train.
    """
    rng = random.Random(f"orsd-alfworld/{GENERATOR_VERSION}/{seed}/{split}/{task_type}")
    if seen_pairs is None:
        choices = [(fp, obj) for fp in split_floor_plans(split) for obj in load_scene(fp).object_types]
    else:
        choices = sorted(set(seen_pairs))
    toggle = "DeskLamp" if task_type == "look_at_obj_in_light" else ""
    choices = [(fp, obj) for fp, obj in choices
               if any((fp, task_type, obj, parent, toggle) not in avoid
                      for parent in feasible_parents(fp, task_type, obj))]
    rooms = sorted({fp for fp, _ in choices})
    if not choices:
        if seen_pairs is not None:
            raise ValueError(f"valid_seen needs a new {task_type} goal for an object seen in a train "
                             f"room, and the train split leaves none; make train larger")
        raise ValueError(f"no room of split {split!r} admits a {task_type} task")
    misses = 0
    while True:
        floor_plan = rng.choice(rooms)  # rooms first, so small rooms are not crowded out
        obj = rng.choice([o for fp, o in choices if fp == floor_plan])
        spec = _make_spec(rng, task_type, floor_plan, obj, rng.choice(feasible_parents(floor_plan, task_type, obj)))
        if spec.signature in avoid:
            misses += 1
            if misses > 10_000:
                raise ValueError(f"split {split!r} ran out of distinct {task_type} goals "
                                 f"after {len(avoid)} tasks; ask for fewer tasks")
            continue
        misses = 0
        avoid.add(spec.signature)
        yield spec


def _quotas(size: int) -> dict[str, int]:
    return {t: size // len(TASK_TYPES) + (i < size % len(TASK_TYPES)) for i, t in enumerate(TASK_TYPES)}


def _write_game(root: Path, split: str, seed: int, index: int, spec: TaskSpec) -> tuple[str, Path]:
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    trial = f"trial_s{seed}_{index:05d}"
    folder = root / spec.folder / trial
    folder.mkdir(parents=True, exist_ok=True)
    description = spec.description()
    problem = build_problem(spec, name=f"plan_{trial}")
    game = {"pddl_domain": Path(ALFRED_PDDL_PATH).read_text(encoding="utf-8"),
            "grammar": Path(ALFRED_TWL2_PATH).read_text(encoding="utf-8").replace("UNKNOWN GOAL", description),
            "pddl_problem": problem, "solvable": False, "walkthrough": None}
    params = {"object_target": spec.object_target, "parent_target": spec.parent_target,
              "toggle_target": spec.toggle_target, "mrecep_target": "", "object_sliced": False}
    traj = {"task_id": f"{split}/{spec.folder}/{trial}", "task_type": spec.task_type, "pddl_params": params,
            "scene": {"floor_plan": f"FloorPlan{spec.floor_plan}", "scene_num": spec.floor_plan},
            "turk_annotations": {"anns": [{"task_desc": description}]},
            "orsd": {"generator_version": GENERATOR_VERSION, "seed": seed, "split": split,
                     "template": spec.template, "placement_seed": spec.placement_seed}}
    (folder / "game.tw-pddl").write_text(json.dumps(game), encoding="utf-8")
    (folder / "traj_data.json").write_text(json.dumps(traj, indent=1), encoding="utf-8")
    return traj["task_id"], folder / "game.tw-pddl"


#: a candidate whose planner check takes longer is dropped (the expert would be as slow on it)
CHECK_SECONDS_LIMIT = 120.0


def check_game(gamefile: str, engine: Any = None) -> dict[str, Any]:
    """{"plan": winning plan or None, "reason": why not, "seconds": ...} for one game."""
    started = time.perf_counter()
    try:
        plan = engine_lib.play_planner(gamefile, engine)
        return {"plan": plan, "reason": "", "seconds": time.perf_counter() - started}
    except Exception as error:  # one odd candidate must not stop the set; it is dropped and logged
        return {"plan": None, "reason": f"{type(error).__name__}: {error}", "seconds": time.perf_counter() - started}


def _worker_main() -> None:
    """Check the game files named on stdin, one per line; answer one JSON line each."""
    # answers go through a private copy of stdout; anything else printed (by Python or by
    # fast-downward's C++) goes to stderr and cannot corrupt them
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    engine_lib.require_alfworld()
    engine = engine_lib.new_engine()
    for line in sys.stdin:
        answers.write(json.dumps(check_game(line.strip(), engine)) + "\n")
        answers.flush()


class _CheckWorker:
    """A `python -m` worker process (independent of the caller's `__main__`, which
    multiprocessing's spawn would re-import), restarted when a check runs over its time limit:
    fast-downward's search is a C call that cannot be interrupted from Python."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        command = [sys.executable, "-m", "orsd.envs.alfworld.generator", "--check-worker"]
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=environment, text=True, bufsize=1)

    def check(self, gamefile: str, limit_seconds: float) -> dict[str, Any]:
        for attempt in range(2):  # a worker that died since its last answer is restarted once
            if self.process is None:
                self.process = self._start()
            try:
                self.process.stdin.write(gamefile + "\n")
                self.process.stdin.flush()
                break
            except OSError:
                self.close()
                if attempt:
                    raise
        ready, _, _ = select.select([self.process.stdout], [], [], limit_seconds)
        line = self.process.stdout.readline() if ready else ""
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            self.close()
            reason = f"planner check over {limit_seconds:.0f} s" if not ready else f"check worker failed: {line!r}"
            return {"plan": None, "reason": reason, "seconds": limit_seconds if not ready else 0.0}

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                try:
                    pipe.close()
                except OSError:  # a write to a killed worker may be pending
                    pass
            self.process = None


_WORKERS: list[_CheckWorker] = []  # idle workers, reused by later splits of this process
_WORKERS_LOCK = threading.Lock()


def _close_workers() -> None:
    with _WORKERS_LOCK:
        while _WORKERS:
            _WORKERS.pop().close()


atexit.register(_close_workers)


def _check_all(gamefiles: list[str], num_workers: int, limit_seconds: float) -> list[dict[str, Any]]:
    """Check games on `num_workers` worker processes; results in input order."""
    pending: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
    for item in enumerate(gamefiles):
        pending.put(item)
    results: list[dict[str, Any]] = [{} for _ in gamefiles]

    def drive() -> None:
        with _WORKERS_LOCK:
            worker = _WORKERS.pop() if _WORKERS else _CheckWorker()
        try:
            while True:
                try:
                    index, gamefile = pending.get_nowait()
                except queue.Empty:
                    return
                results[index] = worker.check(gamefile, limit_seconds)
        finally:
            with _WORKERS_LOCK:
                _WORKERS.append(worker)

    threads = [threading.Thread(target=drive) for _ in range(max(1, min(num_workers, len(gamefiles))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def cache_root(cache_dir: str | os.PathLike[str] | None, seed: int) -> Path:
    base = Path(cache_dir) if cache_dir else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orsd" / "alfworld"
    alfworld_version = importlib.metadata.version("alfworld")
    return base / f"gen{GENERATOR_VERSION}-alfworld{alfworld_version}-seed{seed}"


def split_folder(split: str, sizes: dict[str, int]) -> str:
    if split == "valid_seen":
        return f"valid_seen-{sizes['valid_seen']}-of-train-{sizes['train']}"
    return f"{split}-{sizes[split]}"


def build_split(root: Path, seed: int, split: str, sizes: dict[str, int], num_workers: int,
                train: list[dict[str, Any]] | None = None, keep_workers: bool = False) -> list[dict[str, Any]]:
    """Generate, check and write one split; returns its manifest entries (see module doc).

    The check workers are stopped at the end unless `keep_workers` (another split follows).
    """
    engine_lib.require_alfworld()
    target = root / split_folder(split, sizes)
    staging = root / f"{target.name}.tmp-{os.getpid()}-{random.getrandbits(32):08x}"
    started = time.perf_counter()
    avoid: set[tuple[Any, ...]] = set()
    seen_pairs = None
    if split == "valid_seen":
        if train is None:
            raise ValueError("valid_seen is drawn from the train split's rooms: pass `train`")
        avoid = {tuple(t["signature"]) for t in train}
        seen_pairs = [(t["floor_plan"], obj) for t in train for obj in t["object_types"]]
    check_seconds, rejected = 0.0, 0
    quotas = _quotas(sizes[split])
    log.info("generating %d ALFWorld %s tasks (seed %d) into %s", sizes[split], split, seed, target)
    streams = {t: spec_stream(seed, split, t, avoid, seen_pairs) for t in TASK_TYPES}
    kept: dict[str, list[dict[str, Any]]] = {t: [] for t in TASK_TYPES}
    drawn = dict.fromkeys(TASK_TYPES, 0)
    while any(len(kept[t]) < quotas[t] for t in TASK_TYPES):
        # one batch for all types (workers start once); rejected candidates are replaced by the
        # next ones of their type's stream in the following batch
        written = []
        for task_type in TASK_TYPES:
            for _ in range(quotas[task_type] - len(kept[task_type])):
                spec = next(streams[task_type])
                written.append((spec, *_write_game(staging, split, seed, drawn[task_type], spec)))
                drawn[task_type] += 1
        try:
            results = _check_all([str(path) for _, _, path in written], num_workers, CHECK_SECONDS_LIMIT)
        finally:
            if not keep_workers:
                _close_workers()
        for (spec, task_id, path), result in zip(written, results):
            plan, reason, seconds = result["plan"], result["reason"], result["seconds"]
            check_seconds += seconds
            if plan is None:
                rejected += 1
                log.warning("dropped ALFWorld candidate %s: %s", task_id, reason)
                shutil.rmtree(path.parent)
                continue
            game = json.loads(path.read_text(encoding="utf-8"))
            game.update(solvable=True, walkthrough=plan)
            path.write_text(json.dumps(game), encoding="utf-8")
            kept[spec.task_type].append({
                "id": task_id, "description": spec.description(), "task_type": spec.task_type,
                "gamefile": str(path.relative_to(staging)), "floor_plan": spec.floor_plan,
                "room_type": load_scene(spec.floor_plan).room_type,
                "pddl_params": {"object_target": spec.object_target, "parent_target": spec.parent_target,
                                "toggle_target": spec.toggle_target},
                "signature": list(spec.signature), "plan_length": len(plan),
                "object_types": sorted(set(_OBJECT_TYPE.findall(game["pddl_problem"]))),
                "problem_sha256": hashlib.sha256(game["pddl_problem"].encode()).hexdigest(),
                "check_seconds": round(seconds, 4),
            })
    entries = [entry for task_type in TASK_TYPES for entry in kept[task_type]]
    manifest = {"generator_version": GENERATOR_VERSION, "alfworld_version": importlib.metadata.version("alfworld"),
                "seed": seed, "split": split, "sizes": sizes, "num_rejected": rejected,
                "check_seconds": round(check_seconds, 2), "build_seconds": round(time.perf_counter() - started, 2),
                "tasks": entries}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    try:
        staging.rename(target)
    except OSError:  # another process finished the same split first: keep theirs
        shutil.rmtree(staging, ignore_errors=True)
    log.info("ALFWorld %s: %d tasks, %d rejected, %.1f s (checks %.1f s)", split, len(entries), rejected,
             manifest["build_seconds"], check_seconds)
    return load_manifest(target)


def load_manifest(folder: Path) -> list[dict[str, Any]]:
    """Manifest entries of a built split, with `gamefile` made absolute."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    for entry in manifest["tasks"]:
        entry["gamefile"] = str(folder / entry["gamefile"])
    return manifest["tasks"]


def load_or_build(cache_dir: str | os.PathLike[str] | None, seed: int, split: str, sizes: dict[str, int],
                  num_workers: int, train: list[dict[str, Any]] | None = None,
                  keep_workers: bool = False) -> list[dict[str, Any]]:
    """Manifest entries of a split from the cache, generating and checking it first if needed."""
    root = cache_root(cache_dir, seed)
    folder = root / split_folder(split, sizes)
    if (folder / "manifest.json").is_file():
        return load_manifest(folder)
    root.mkdir(parents=True, exist_ok=True)
    return build_split(root, seed, split, sizes, num_workers, train, keep_workers)


def prepare(cache_dir: str | os.PathLike[str] | None, seed: int, sizes: dict[str, int],
            num_workers: int) -> dict[str, list[dict[str, Any]]]:
    """Build (or load) all three splits, sharing one set of check workers."""
    try:
        train = load_or_build(cache_dir, seed, "train", sizes, num_workers, keep_workers=True)
        return {"train": train,
                "valid_seen": load_or_build(cache_dir, seed, "valid_seen", sizes, num_workers, train, True),
                "valid_unseen": load_or_build(cache_dir, seed, "valid_unseen", sizes, num_workers, keep_workers=True)}
    finally:
        _close_workers()


def main(argv: list[str] | None = None) -> None:
    """`python -m orsd.envs.alfworld.generator [--seed N] [--train N] ...`: pre-build the cache."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    for split, size in DEFAULT_SPLIT_SIZES.items():
        parser.add_argument(f"--{split.replace('_', '-')}", type=int, default=size, dest=split)
    parser.add_argument("--check-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check_worker:
        _worker_main()
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sizes = {split: getattr(args, split) for split in DEFAULT_SPLIT_SIZES}
    for split, entries in prepare(args.cache_dir, args.seed, sizes, args.workers).items():
        print(f"{split}: {len(entries)} tasks")


if __name__ == "__main__":
    main()
