"""The environment protocol every orsd environment follows.

An `Env` instance plays one episode at a time and owns all of that episode's state; immutable
data (task lists, a product catalog, PDDL templates) may be shared between instances. To run many
episodes at once (one per coroutine, thread or worker) call `env.fork()` for each: forks share the
read-only data and nothing else.

Actions are the environment's own commands (`search[red shirt]`, `go to fridge 1`). The policy's
text is turned into a command by `orsd.envs.parse_action`; a reply without a well-formed action is
passed to `step` as `None`. An unknown, malformed or `None` action is an *invalid action*: it is
counted, the observation says nothing happened, and the episode goes on. `step` never raises on
bad actions.
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One task: what the agent is asked to do, and what the env needs to set it up.

    `payload` is environment-specific, JSON-serialisable and enough for `reset` to rebuild the
    episode exactly (so tasks can be logged, shipped to workers and replayed).
    """

    id: str
    split: str
    description: str
    kind: str
    payload: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


# Keys every `info` dict returned by `Env.step` carries.
INFO_KEYS = ("won", "score", "valid_action", "no_progress")


class Env(abc.ABC):
    """One episode at a time of a text environment (see the module docstring)."""

    #: registry name, e.g. "webshop"
    name: str = ""
    #: the splits this environment offers, the first being the training split
    splits: tuple[str, ...] = ()
    #: the split `sample_task` draws from when none is given (set by `make`)
    split: str = ""
    #: default horizon in attempted actions (paper: 50 for ALFWorld, 15 for WebShop)
    max_actions: int = 0

    def __init__(self) -> None:
        self.task: Task | None = None
        self.num_actions = 0  # attempted actions this episode, invalid ones included
        self.num_invalid = 0
        self.num_no_progress = 0
        self.done = False
        # the info dict of the latest `step` (empty before the first one); implementations set it
        # in `reset` (to {}) and `step`, so `orsd.envs.rewards.episode_reward(env)` can read it
        self.last_info: dict[str, Any] = {}

    # -- tasks ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """All tasks of `split`, in a fixed order (seeded by the env's construction seed)."""

    def sample_task(self, rng: random.Random, split: str | None = None) -> Task:
        """One task of `split` (default: the env's own split) drawn with the caller's `rng`."""
        pool = self.tasks(split or self.split)
        if not pool:
            raise ValueError(f"split={split or self.split!r} of env {self.name!r} has no tasks")
        return pool[rng.randrange(len(pool))]

    def task_pool(self, size: int, split: str | None = None) -> list[Task]:
        """A fixed pool of `size` tasks of `split` (default: the env's own split): a draw seeded by
        the size alone, so runs of any seed and method that name the same size share the pool; the
        whole split when `size` is 0 or at least its length."""
        tasks = self.tasks(split or self.split)
        if not size or size >= len(tasks):
            return list(tasks)
        return random.Random(f"train_tasks:{size}").sample(tasks, size)

    # -- episode ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode of `task`; returns the first observation."""

    @abc.abstractmethod
    def step(self, action: str | None) -> tuple[str, bool, dict[str, Any]]:
        """Apply one command; returns (observation, done, info) with at least `INFO_KEYS` in info.

        Implementations also store that info in `self.last_info`.
        """

    @abc.abstractmethod
    def expert_action(self) -> str:
        """A command that moves the current episode toward success (planner or oracle)."""

    def admissible_actions(self) -> list[str] | None:
        """The commands valid now, where the environment exposes them (ALFWorld does)."""
        return None

    def random_action(self, rng: random.Random) -> str | None:
        """A command valid now, drawn with `rng` (the warm start's noise: a wrong step the expert
        then recovers from); by default one of `admissible_actions()`, None where there are none."""
        admissible = self.admissible_actions()
        return rng.choice(admissible) if admissible else None

    @abc.abstractmethod
    def fork(self) -> "Env":
        """A new env sharing this one's read-only data but no episode state."""
