"""Adapter for a real WebShop install (`WebAgentTextEnv` via gym) behind the orsd Env protocol.

NOT exercised here: WebShop needs Python <= 3.10, Java, pyserini and its downloaded product data,
none of which this project's CI has. The adapter's own logic is unit-tested against a fake env
with WebShop's interface (`reset(session=...)`, `step(action)`, `get_available_actions()`,
`server.goals`). Goal splits follow WebShop's convention: test = goals 0–499, dev = 500–1499,
train = the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orsd.envs.base import Env, Task
from orsd.envs.webshop.commands import WebShopBase, split_command

_SPLIT_RANGES = {"test": (0, 500), "dev": (500, 1500), "train": (1500, None)}


def _gym_factory(**kwargs: Any) -> Any:
    """Build WebShop's text env through gym (imported only here)."""
    try:
        import gym
        import web_agent_site.envs  # noqa: F401  (registers WebAgentTextEnv-v0)
    except ImportError as error:
        raise ImportError(
            "the real WebShop backend needs WebShop installed (github.com/princeton-nlp/WebShop: "
            "`web_agent_site` importable, gym, its data and search index); see "
            "docs/environments.md"
        ) from error
    return gym.make("WebAgentTextEnv-v0", observation_mode="text", **kwargs)


class WebShopRealEnv(WebShopBase):
    """The official WebShop text environment with orsd's flags and horizon."""

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        *,
        num_products: int | None = None,
        human_goals: bool = True,
        max_actions: int = 15,
        env_factory: Callable[..., Any] | None = None,
        _shared: Any = None,
    ) -> None:
        super().__init__()
        self.check_split(split)
        if isinstance(max_actions, bool) or not isinstance(max_actions, int) or max_actions < 1:
            raise ValueError(f"max_actions must be a positive int, got {max_actions!r}")
        self.split, self.seed, self.max_actions = split, seed, max_actions
        self._factory = env_factory or _gym_factory
        self._kwargs = {"num_products": num_products, "human_goals": human_goals}
        # a fork reuses WebShop's server (products, goals, search engine): only the session
        # state differs between forks
        self._env = self._factory(**self._kwargs) if _shared is None else self._factory(
            server=_shared, **self._kwargs)
        self._num_goals = len(self._env.server.goals)
        self._clear_episode()

    def _clear_episode(self) -> None:
        self.observation_text = ""
        self.score, self.won = 0.0, False
        self._seen: set[str] = set()

    def tasks(self, split: str) -> list[Task]:
        self.check_split(split)
        start, stop = _SPLIT_RANGES[split]
        stop = self._num_goals if stop is None else min(stop, self._num_goals)
        goals = self._env.server.goals
        return [
            Task(id=f"webshop-real-{i:05d}", split=split,
                 description=str(goals[i].get("instruction_text", "")),
                 kind=str(goals[i].get("category", "")), payload={"goal_index": i})
            for i in range(start, stop)
        ]

    def fork(self) -> "WebShopRealEnv":
        return WebShopRealEnv(self.split, self.seed, max_actions=self.max_actions,
                              env_factory=self._factory, _shared=self._env.server,
                              **self._kwargs)

    def reset(self, task: Task) -> str:
        index = task.payload.get("goal_index") if isinstance(task, Task) else None
        if not isinstance(index, int) or not 0 <= index < self._num_goals:
            raise ValueError(f"task must be a real-WebShop task with a goal_index, got {task!r}")
        Env.__init__(self)
        self._clear_episode()
        self.task = task
        observation, _ = self._env.reset(session=index)
        self.observation_text = observation
        self._seen.add(observation)
        return observation

    def _clickable(self, action: str | None) -> tuple[str | None, str]:
        """The exact command to send to WebShop, or None and why the action is invalid."""
        verb, argument = split_command(action)
        if verb is None:
            return None, argument
        available = self._env.get_available_actions()
        if verb == "search":
            if not available["has_search_bar"] or not argument:
                return None, "search is only possible on the search page, with a query."
            return f"search[{argument}]", ""
        wanted = "".join(argument.lower().split())
        for label in available["clickables"]:
            if "".join(label.lower().split()) == wanted:
                return f"click[{label}]", ""
        return None, f"{argument[:60]!r} is not clickable on this page."

    def step(self, action: str | None) -> tuple[str, bool, dict[str, Any]]:
        if self.task is None or self.done:
            raise RuntimeError("step needs an episode in progress: call reset(task)")
        self.num_actions += 1
        command, why = self._clickable(action)
        no_progress = False
        if command is None:
            self.num_invalid += 1
            observation = f"Invalid action: {why} Nothing happened."
            bought = False
        else:
            observation, reward, bought, _ = self._env.step(command)
            if bought:
                self.score = float(reward)
                self.won = self.score == 1.0
                # WebShop's end page shows the score; transcripts go to the rubric writer,
                # which must never see rewards
                observation = "Thank you for shopping with us!"
            no_progress = observation in self._seen
            self._seen.add(observation)
            self.num_no_progress += int(no_progress)
            self.observation_text = observation
        truncated = not bought and self.num_actions >= self.max_actions
        self.done = bool(bought) or truncated
        info = {"won": self.won, "score": self.score, "valid_action": command is not None,
                "no_progress": no_progress, "truncated": truncated}
        self.last_info = info
        return observation, self.done, info

    def admissible_actions(self) -> list[str] | None:
        available = self._env.get_available_actions()
        commands = ["search[<query>]"] if available["has_search_bar"] else []
        return commands + [f"click[{label}]" for label in available["clickables"]]

    def expert_action(self) -> str:
        raise NotImplementedError(
            "the real WebShop has no oracle; use WebShopEnv (the generated shop) for expert "
            "demonstrations"
        )
