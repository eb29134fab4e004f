"""A WebShop-compatible shop: WebShop's text protocol and official score on a generated catalog.

Commands: `search[query]` (on the search page) and `click[text]` on anything clickable (a
product id on a results page, an option value, Description/Features/Reviews, Buy Now, < Prev,
Next >, Back to Search). Click texts are compared ignoring case and whitespace. An episode ends
with Buy Now (scored by `webshop_scoring.score_purchase`) or after `max_actions` attempted
actions (score 0). See docs/environments.md.

Per-step flags: `valid_action` is False for a None, unknown, malformed or unclickable command
(nothing changes; the observation says so). `no_progress` is True for a valid command whose
resulting `PageState` was already visited in this episode (the start page included): staying on
the same page, re-clicking a chosen option, going back to a page seen before. Invalid actions
count only as invalid.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

from orsd.envs.base import Env, Task
from orsd.envs.webshop.commands import SPLITS, WebShopBase, echo as _echo, split_command
from orsd.envs.webshop.catalog import Catalog, Goal, get_catalog
from orsd.envs.webshop.pages import (
    BACK_TO_SEARCH, BUY_NOW, DETAIL, DETAIL_PAGES, DONE, ITEM, NEXT, PREV, RESULTS, SEARCH,
    PageState, click_key, clickables, render, results_on_page,
)
from orsd.envs.webshop.scoring import ScoreParts, option_matches, score_purchase
from orsd.envs.webshop.search import SearchIndex, get_index


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@functools.lru_cache(maxsize=4)
def _tasks_of(seed: int, num_products: int, goals_per_product: int) -> dict[str, tuple[Task, ...]]:
    """The tasks of every split of one catalog, built once and shared."""
    catalog = get_catalog(seed, num_products, goals_per_product)
    key = {"seed": seed, "num_products": num_products, "goals_per_product": goals_per_product}
    return {
        split: tuple(
            Task(id=f"webshop-s{seed}-{split}-{i:05d}", split=split,
                 description=goal.instruction_text, kind=goal.category,
                 payload={"catalog": dict(key), "goal": goal.to_dict()})
            for i, goal in enumerate(catalog.goals[split])
        )
        for split in SPLITS
    }


class WebShopEnv(WebShopBase):
    """The generated shop (see the module docstring); `fork()` shares catalog, index and tasks."""

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        *,
        num_products: int = 1500,
        goals_per_product: int = 4,
        max_actions: int = 15,
        results_per_page: int = 10,
        list_admissible: bool = False,
    ) -> None:
        super().__init__()
        self.check_split(split)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.split = split
        self.seed = seed
        self.max_actions = _positive_int("max_actions", max_actions)
        self.results_per_page = _positive_int("results_per_page", results_per_page)
        self.list_admissible = bool(list_admissible)
        self.catalog: Catalog = get_catalog(seed, num_products, goals_per_product)
        self.index: SearchIndex = get_index(seed, num_products, goals_per_product)
        self._catalog_key = {"seed": seed, "num_products": num_products,
                             "goals_per_product": goals_per_product}
        self._tasks = _tasks_of(seed, num_products, goals_per_product)
        self._clear_episode()

    # -- tasks ---------------------------------------------------------------------------------
    def tasks(self, split: str) -> list[Task]:
        self.check_split(split)
        return list(self._tasks[split])

    def fork(self) -> "WebShopEnv":
        clone = copy.copy(self)
        Env.__init__(clone)
        clone._clear_episode()
        return clone

    # -- episode -------------------------------------------------------------------------------
    def _clear_episode(self) -> None:
        self.goal: Goal | None = None
        self.state = PageState(SEARCH)
        self.score = 0.0
        self.won = False
        self.score_parts: ScoreParts | None = None
        self._seen: set[PageState] = set()
        self._plans: dict[str, tuple[tuple[str, str], ...] | None] = {}
        self._expert_query: str | None = None

    def reset(self, task: Task) -> str:
        if not isinstance(task, Task):
            raise TypeError(f"task must be an orsd.envs.Task, got {type(task).__name__}")
        if task.payload.get("catalog") != self._catalog_key or "goal" not in task.payload:
            raise ValueError(
                f"task {task.id!r} was not made by a webshop env with catalog {self._catalog_key}"
                f" (its payload catalog is {task.payload.get('catalog')!r})"
            )
        Env.__init__(self)
        self._clear_episode()
        self.task = task
        self.goal = Goal.from_dict(task.payload["goal"])
        self._seen.add(self.state)
        return self.observation()

    def observation(self) -> str:
        """The current page as text."""
        if self.goal is None:
            raise RuntimeError("no episode: call reset(task) first")
        return render(self.state, self.catalog, self._results(), self.results_per_page,
                      self.goal.instruction_text)

    def _results(self, query: str | None = None) -> tuple[str, ...]:
        query = self.state.query if query is None else query
        return self.index.search(query) if query else ()

    def available_actions(self) -> dict[str, Any]:
        """WebShop's `get_available_actions()`: {'has_search_bar': bool, 'clickables': [...]}."""
        if self.goal is None:
            raise RuntimeError("no episode: call reset(task) first")
        return {
            "has_search_bar": self.state.page == SEARCH,
            "clickables": clickables(self.state, self.catalog, self._results(),
                                     self.results_per_page),
        }

    def admissible_actions(self) -> list[str] | None:
        """With `list_admissible=True`: `search[<query>]` or one `click[...]` per clickable."""
        if not self.list_admissible or self.goal is None or self.done:
            return None
        available = self.available_actions()
        if available["has_search_bar"]:
            return ["search[<query>]"]
        return [f"click[{label}]" for label in available["clickables"]]

    def random_action(self, rng) -> str | None:
        """A valid command drawn with `rng` whatever `list_admissible` says (the shop knows its
        valid commands on every page): on the search page a search for another task's product (its
        results rarely hold one the goal accepts, so the expert goes back to search), elsewhere a
        click on the page, but not Buy Now, whose random purchase would end the episode with
        nothing left to recover from."""
        if self.goal is None or self.done:
            return None
        available = self.available_actions()
        if available["has_search_bar"]:
            other = rng.choice(self._tasks[self.split])
            return f"search[{other.payload['goal']['search_text']}]"
        labels = [label for label in available["clickables"] if label != BUY_NOW]
        return f"click[{rng.choice(labels)}]" if labels else None

    def step(self, action: str | None) -> tuple[str, bool, dict[str, Any]]:
        if self.goal is None:
            raise RuntimeError("no episode: call reset(task) before step")
        if self.done:
            raise RuntimeError("the episode is over: call reset(task) to start another")
        self.num_actions += 1
        new_state, message = self._transition(action)
        valid = new_state is not None
        no_progress = False
        if valid:
            no_progress = new_state in self._seen
            self._seen.add(new_state)
            self.state = new_state
            observation = message or self.observation()
            if new_state.page == DONE:
                self._buy()
        else:
            self.num_invalid += 1
            observation = f"Invalid action: {message} Nothing happened."
        self.num_no_progress += int(no_progress)
        truncated = self.state.page != DONE and self.num_actions >= self.max_actions
        self.done = self.state.page == DONE or truncated
        info = {
            "won": self.won, "score": self.score, "valid_action": valid,
            "no_progress": no_progress, "page": self.state.page, "truncated": truncated,
            "purchased": self.state.asin if self.state.page == DONE else None,
        }
        if self.score_parts is not None and valid and new_state.page == DONE:
            info["score_parts"] = dataclasses.asdict(self.score_parts)
        self.last_info = info
        return observation, self.done, info

    def _buy(self) -> None:
        product = self.catalog.by_asin[self.state.asin]
        self.score_parts = score_purchase(product, self.goal, product.price,
                                          dict(self.state.options), self.catalog.title_nouns)
        self.score = self.score_parts.score
        self.won = self.score == 1.0

    def _transition(self, action: str | None) -> tuple[PageState | None, str]:
        """(new state, optional observation override) or (None, why it was invalid)."""
        verb, argument = split_command(action)
        if verb is None:
            return None, argument
        state = self.state
        if verb == "search":
            if state.page != SEARCH:
                return None, "search is only possible on the search page (click Back to Search)."
            query = " ".join(argument.lower().split())
            if not query:
                return None, "the search query is empty."
            return PageState(RESULTS, query=query), ""
        labels = clickables(state, self.catalog, self._results(), self.results_per_page)
        by_key = {click_key(label): label for label in labels}
        label = by_key.get(click_key(argument))
        if label is None:
            return None, f"{_echo(argument)} is not clickable on this page."
        if label == BACK_TO_SEARCH:
            return PageState(SEARCH), ""
        if state.page == RESULTS:
            if label in (PREV, NEXT):
                step = -1 if label == PREV else 1
                return PageState(RESULTS, state.query, state.page_number + step), ""
            return PageState(ITEM, state.query, state.page_number, asin=label), ""
        if state.page == DETAIL:  # only < Prev is left
            return PageState(ITEM, state.query, state.page_number, state.asin,
                             options=state.options), ""
        # item page
        if label == PREV:
            return PageState(RESULTS, state.query, state.page_number), ""
        if label in DETAIL_PAGES:
            return PageState(DETAIL, state.query, state.page_number, state.asin, label,
                             state.options), ""
        if label == BUY_NOW:
            return PageState(DONE, state.query, state.page_number, state.asin,
                             options=state.options), ""
        product = self.catalog.by_asin[state.asin]
        chosen = dict(state.options)
        chosen[product.option_group(label)] = label
        options = tuple((name, chosen[name]) for name, _ in product.options if name in chosen)
        return (PageState(ITEM, state.query, state.page_number, state.asin, options=options),
                f"You have clicked {label}.")

    # -- oracle --------------------------------------------------------------------------------
    def _plan(self, asin: str) -> tuple[tuple[str, str], ...] | None:
        """Option choices that make buying `asin` score 1.0 for this goal, or None."""
        if asin not in self._plans:
            product = self.catalog.by_asin[asin]
            plan = []
            for name, wanted in self.goal.goal_options:
                groups = sorted(product.options, key=lambda group: group[0] != name)
                value = next((v for _, values in groups for v in values if v == wanted), None)
                if value is None:
                    value = next((v for _, values in groups for v in values
                                  if option_matches([v], [wanted])), None)
                if value is not None:
                    plan.append((product.option_group(value), value))
            parts = score_purchase(product, self.goal, product.price, dict(plan),
                                   self.catalog.title_nouns)
            self._plans[asin] = tuple(plan) if parts.score == 1.0 else None
        return self._plans[asin]

    def _candidates(self, results: tuple[str, ...]) -> list[int]:
        return [i for i, asin in enumerate(results) if self._plan(asin) is not None]

    def expert_query(self) -> str:
        """The oracle's search: the instruction's attributes and product phrase, or the target's
        title when that finds no product that can score 1.0."""
        if self._expert_query is None:
            query = self.goal.search_text
            if not self._candidates(self._results(query)):
                query = self.goal.name
            self._expert_query = query
        return self._expert_query

    def expert_action(self) -> str:
        """The oracle: from any page, navigate to a product that can score 1.0 (the first one in
        the results), choose the goal's options and buy; searches again when the results hold
        none."""
        if self.goal is None or self.done:
            raise RuntimeError("expert_action() needs an episode in progress (reset, not done)")
        state = self.state
        if state.page == SEARCH:
            return f"search[{self.expert_query()}]"
        if state.page == DETAIL:
            return f"click[{PREV}]"
        results = self._results()
        candidates = self._candidates(results)
        if state.page == ITEM:
            plan = self._plan(state.asin)
            if plan is None:
                return f"click[{PREV}]" if candidates else f"click[{BACK_TO_SEARCH}]"
            chosen = dict(state.options)
            for name, value in plan:
                if chosen.get(name) != value:
                    return f"click[{value}]"
            return f"click[{BUY_NOW}]"
        if not candidates:
            return f"click[{BACK_TO_SEARCH}]"
        on_page = results_on_page(results, state.page_number, self.results_per_page)
        for i in candidates:
            if results[i] in on_page:
                return f"click[{results[i]}]"
        first_page = candidates[0] // self.results_per_page + 1
        return f"click[{PREV if first_page < state.page_number else NEXT}]"
