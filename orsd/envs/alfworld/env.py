"""ALFWorld on its real text engine (TextWorld PDDL + alfworld's wrappers), offline.

By default the tasks are our own: PDDL problems for ALFWorld's six task types in the 120 ALFRED
rooms, each checked solvable by the planner expert and cached on disk
(`orsd.envs.alfworld.generator`). When `ALFWORLD_DATA` (or `data_dir=`) points at the official
games (`json_2.1.1/{train,valid_seen,valid_unseen}/**/game.tw-pddl`), those are played instead.

Reward (paper Eq. 12) is `info["won"]`; the horizon is `max_actions` attempted actions (50).
See docs/alfworld.md for the generator, the splits and every deviation from the benchmark.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from orsd.envs.alfworld import engine as engine_lib
from orsd.envs.alfworld.scenes import TASK_TYPES
from orsd.envs.base import Env, Task

SOURCES = ("auto", "generated", "official")
NOTHING_HAPPENS = "Nothing happens."
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"
# `import alfworld` sets ALFWORLD_DATA to this when it is unset; that alone is not a user's choice
_ALFWORLD_DEFAULT = Path("~/.cache/alfworld").expanduser()


def official_root(data_dir: str | os.PathLike[str] | None, source: str) -> Path | None:
    """Folder of the official ALFWorld data to play, or None for our generated tasks."""
    if source == "generated":
        return None
    value = data_dir if data_dir is not None else os.environ.get("ALFWORLD_DATA")
    if not value:
        if source == "official":
            raise ValueError("source='official' needs data_dir=... or the ALFWORLD_DATA environment variable")
        return None
    root = Path(value).expanduser()
    if (source == "auto" and data_dir is None and root == _ALFWORLD_DEFAULT
            and not (root / "json_2.1.1").is_dir()):
        return None
    if not (root / "json_2.1.1").is_dir():
        where = f"data_dir={str(value)!r}" if data_dir is not None else f"ALFWORLD_DATA={str(value)!r}"
        raise ValueError(
            f"{where} has no json_2.1.1 folder; expected the official ALFWorld games "
            f"(json_2.1.1/{{train,valid_seen,valid_unseen}}/**/game.tw-pddl, from alfworld-download), "
            f"or unset ALFWORLD_DATA / pass source='generated' to use orsd's generated tasks"
        )
    return root


def official_tasks(root: Path, split: str) -> list[dict[str, Any]]:
    """The solvable official games of `split` with ALFWorld's own filters (as AlfredTWEnv)."""
    split_dir = root / "json_2.1.1" / split
    entries = []
    for folder, subfolders, files in os.walk(split_dir):
        subfolders.sort()
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        if "movable" in folder or "Sliced" in folder:  # unsupported by the text engine
            continue
        with open(os.path.join(folder, "traj_data.json"), encoding="utf-8") as handle:
            traj = json.load(handle)
        if traj.get("task_type") not in TASK_TYPES:
            continue
        gamefile = os.path.join(folder, "game.tw-pddl")
        with open(gamefile, encoding="utf-8") as handle:
            game = json.load(handle)
        if not game.get("solvable"):
            continue
        entries.append({
            "id": f"{split}/{os.path.relpath(folder, split_dir)}",
            "description": engine_lib.task_sentence(game.get("grammar", "")) or "",
            "task_type": traj["task_type"], "gamefile": gamefile,
            "pddl_params": traj.get("pddl_params", {}),
            "floor_plan": traj.get("scene", {}).get("scene_num"),
        })
    if not entries:
        raise ValueError(
            f"no solvable ALFWorld games under {str(split_dir)!r}; expected "
            f"json_2.1.1/{split}/<task>/<trial>/game.tw-pddl with \"solvable\": true next to traj_data.json"
        )
    return entries


class _Catalog:
    """The task lists of every split, built on first use and shared read-only by all forks."""

    def __init__(self, seed: int, split_sizes: dict[str, int], cache_dir: Any, num_workers: int,
                 root: Path | None) -> None:
        self.seed, self.split_sizes, self.cache_dir = seed, split_sizes, cache_dir
        self.num_workers, self.root = num_workers, root
        self._lock = threading.Lock()
        self._tasks: dict[str, list[Task]] = {}
        self._entries: dict[str, list[dict[str, Any]]] = {}

    def tasks(self, split: str) -> list[Task]:
        with self._lock:
            if split not in self._tasks:
                entries = self._load(split)
                source = "official" if self.root else "generated"
                self._tasks[split] = [
                    Task(id=e["id"], split=split, description=e["description"], kind=e["task_type"],
                         payload={"gamefile": e["gamefile"], "task_type": e["task_type"],
                                  "pddl_params": e["pddl_params"], "floor_plan": e["floor_plan"],
                                  "source": source})
                    for e in entries
                ]
            return list(self._tasks[split])

    def _load(self, split: str) -> list[dict[str, Any]]:
        if split in self._entries:
            return self._entries[split]
        if self.root is not None:
            entries = official_tasks(self.root, split)
        else:
            from orsd.envs.alfworld import generator

            train = self._load("train") if split == "valid_seen" else None
            entries = generator.load_or_build(self.cache_dir, self.seed, split, self.split_sizes,
                                              self.num_workers, train)
        self._entries[split] = entries
        return entries


class AlfworldEnv(Env):
    """ALFWorld text episodes (see the module docstring); one episode at a time, `fork` for more.

    Options: `max_actions` (horizon, 50), `split_sizes` (generated tasks per split, default
    train 600 / valid_seen 144 / valid_unseen 144), `cache_dir` (default ~/.cache/orsd/alfworld),
    `num_workers` (processes for the one-off solvability checks), `data_dir` (official data,
    overrides ALFWORLD_DATA), `source` ("auto", "generated" or "official").
    """

    name = "alfworld"
    splits = ("train", "valid_seen", "valid_unseen")
    max_actions = 50

    def __init__(self, split: str = "train", seed: int = 0, *, max_actions: int = 50,
                 split_sizes: dict[str, int] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 num_workers: int | None = None, data_dir: str | os.PathLike[str] | None = None,
                 source: str = "auto") -> None:
        super().__init__()
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not an ALFWorld split; expected one of {list(self.splits)}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed={seed!r} must be an int")
        if isinstance(max_actions, bool) or not isinstance(max_actions, int) or max_actions < 1:
            raise ValueError(f"max_actions={max_actions!r} must be a positive int")
        if source not in SOURCES:
            raise ValueError(f"source={source!r}; expected one of {list(SOURCES)}")
        from orsd.envs.alfworld.generator import DEFAULT_SPLIT_SIZES

        sizes = dict(DEFAULT_SPLIT_SIZES)
        for key, value in (split_sizes or {}).items():
            if key not in sizes:
                raise ValueError(f"split_sizes has unknown split {key!r}; expected keys among {list(sizes)}")
            if isinstance(value, bool) or not isinstance(value, int) or value < len(TASK_TYPES):
                raise ValueError(f"split_sizes[{key!r}]={value!r} must be an int >= {len(TASK_TYPES)} "
                                 f"(one task per type at least)")
            sizes[key] = value
        if num_workers is None:
            num_workers = max(1, min(8, os.cpu_count() or 1))
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be a positive int")
        engine_lib.require_alfworld()
        self.split = split
        self.seed = seed
        self.max_actions = max_actions
        self._catalog = _Catalog(seed, sizes, cache_dir, num_workers, official_root(data_dir, source))
        self._reset_episode_fields()

    def _reset_episode_fields(self) -> None:
        self._engine: Any = None
        self._loaded_gamefile: str | None = None
        self._game_state: Any = None
        self._history: list[str] = []
        self._plan: list[str] | None = None
        self._expert_engine: Any = None  # hand-coded expert's engine, made on first fallback
        self._expert_state: Any = None
        self._expert_replayed: int | None = None  # commands it has seen this episode
        #: which expert answered the last `expert_action` call: "planner" or "handcoded"
        self.last_expert: str | None = None
        self.num_expert_fallbacks = 0

    # -- tasks ---------------------------------------------------------------------------------
    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"split={split!r} is not an ALFWorld split; expected one of {list(self.splits)}")
        return self._catalog.tasks(split)

    # -- episode -------------------------------------------------------------------------------
    def reset(self, task: Task) -> str:
        if not isinstance(task, Task) or "gamefile" not in task.payload:
            raise TypeError(f"task={task!r} must be an ALFWorld Task (from env.tasks or env.sample_task)")
        gamefile = task.payload["gamefile"]
        if not os.path.isfile(gamefile):
            raise ValueError(f"task {task.id!r}: game file {gamefile!r} is missing (cache removed?)")
        if self._engine is None:
            self._engine = engine_lib.new_engine()
        if gamefile != self._loaded_gamefile:
            self._engine.load(gamefile)
            self._loaded_gamefile = gamefile
        self._game_state = self._engine.reset()
        self.task = task
        self.num_actions = self.num_invalid = self.num_no_progress = 0
        self.done = False
        self._history = []
        self._expert_replayed = None
        walkthrough = self._engine.unwrapped._game_data.get("walkthrough")
        self._plan = list(walkthrough) if walkthrough else None  # the check's planner plan
        text = self._game_state.feedback.strip()
        if text.startswith(_BANNER):
            text = text[len(_BANNER):].strip()
        return text

    def step(self, action: str | None) -> tuple[str, bool, dict[str, Any]]:
        if self.task is None or self._game_state is None:
            raise RuntimeError("step() before reset(task)")
        if self.done:
            raise RuntimeError(f"episode of task {self.task.id!r} is over; call reset(task)")
        self.num_actions += 1
        command = " ".join(action.split()).lower() if isinstance(action, str) else None
        admissible = self._game_state["admissible_commands"]
        valid = command is not None and command in admissible
        if valid:
            before = engine_lib.world_facts(self._game_state)
            self._game_state, _, _ = self._engine.step(command)
            no_progress = engine_lib.world_facts(self._game_state) == before
            observation = self._game_state.feedback.strip()
            self._history.append(command)
            if self._plan and command == self._plan[0]:
                self._plan.pop(0)  # the rest of a plan stays a plan after its first step
            elif not no_progress:
                self._plan = None
        else:
            self.num_invalid += 1
            no_progress = True
            observation = NOTHING_HAPPENS
        self.num_no_progress += no_progress
        won = bool(self._game_state["won"])
        self.done = won or self.num_actions >= self.max_actions
        info = {"won": won, "score": 1.0 if won else 0.0, "valid_action": valid,
                "no_progress": no_progress, "admissible_actions": self.admissible_actions(),
                "task_type": self.task.kind}
        self.last_info = info
        return observation, self.done, info

    def admissible_actions(self) -> list[str] | None:
        if self._game_state is None:
            return None
        return list(self._game_state["admissible_commands"])

    def expert_action(self) -> str:
        """fast-downward's next command from the current state (its plan is kept while followed);
        alfworld's hand-coded expert only if the planner finds nothing (see `last_expert`)."""
        if self.task is None or self._game_state is None:
            raise RuntimeError("expert_action() before reset(task)")
        if self.done:
            raise RuntimeError(f"episode of task {self.task.id!r} is over; no expert action")
        admissible = self._game_state["admissible_commands"]
        if not self._plan or self._plan[0] not in admissible:
            self._plan = engine_lib.planner_plan(self._engine)
        if self._plan and self._plan[0] in admissible:
            self.last_expert = "planner"
            return self._plan[0]
        self.last_expert = "handcoded"
        self.num_expert_fallbacks += 1
        return self._handcoded_action()

    def _handcoded_action(self) -> str:
        """alfworld's hand-coded expert. It tracks what it has seen, so it watches the whole
        episode: a second engine replays this episode's commands (only the new ones per call)."""
        from alfworld.agents.environment.alfred_tw_env import AlfredExpert

        try:
            if self._expert_engine is None:
                self._expert_engine = AlfredExpert(engine_lib.new_engine(facts=True), expert_type="handcoded")
            if self._expert_replayed is None:
                self._expert_engine.load(self._loaded_gamefile)
                self._expert_state, self._expert_replayed = self._expert_engine.reset(), 0
            for command in self._history[self._expert_replayed:]:
                self._expert_state, _, _ = self._expert_engine.step(command)
            self._expert_replayed = len(self._history)
            plan = self._expert_state.get("extra.expert_plan") or []
        except Exception as error:  # the hand-coded expert gives up by raising
            raise RuntimeError(f"neither the planner nor the hand-coded expert has an action for "
                               f"task {self.task.id!r}: {error}") from error
        if not plan or plan[0] not in self._game_state["admissible_commands"]:
            raise RuntimeError(f"neither the planner nor the hand-coded expert has an action for task {self.task.id!r}")
        return plan[0]

    def fork(self) -> "AlfworldEnv":
        other = object.__new__(type(self))
        Env.__init__(other)
        other.split, other.seed, other.max_actions = self.split, self.seed, self.max_actions
        other._catalog = self._catalog
        other._reset_episode_fields()
        return other

    def close(self) -> None:
        """Release this env's copy of the planner library (a fork holds one once it has played)."""
        for engine in (self._engine, self._expert_engine):
            if engine is not None:
                engine_lib.close_engine(engine)
        self._reset_episode_fields()
        self.task, self.done = None, False
