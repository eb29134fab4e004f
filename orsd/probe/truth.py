"""Shop episodes whose oracle criteria have a truth known by rule: the verifier check's cells.

Each criterion of a task's oracle rubric (`orsd.envs.webshop.oracle.oracle_rubric`) gets a kind
and a rule that decides from an episode's actions, replayed in the shop, whether the episode
satisfies it:

- `search`: a search whose first results page shows a product of the goal's type (its `query`);
- `product`: an opened product of the goal's type having every goal attribute (the shop's own
  `attribute_matches`, as its score reads "described as");
- `option`: the option's value was chosen on a product page (compared as the shop compares clicks);
- `price`: the product bought costs at most the goal's bound (the shop's `r_price`); an episode
  that buys nothing leaves "only buys ... lower than" undecided (None, not scored);
- `buy`: Buy Now was clicked with every goal option chosen;
- `title` (the filler of a goal without options): no rule, never scored.

Episodes per task: the expert's (`env.expert_action`) and deliberately corrupted ones, so that
each kind has satisfied and unsatisfied cells: `wrong_search` (another product type's search, its
first result bought), `skipped_option` (the expert without its first option click), `no_buy` (the
expert without Buy Now), `over_price` (a product of the goal's type above the price bound, the
goal's options chosen, bought); besides, the policy's own rollouts replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from orsd.envs.base import Task
from orsd.envs.webshop.commands import split_command
from orsd.envs.webshop.oracle import oracle_rubric
from orsd.envs.webshop.pages import BUY_NOW, ITEM, RESULTS, click_key, results_on_page
from orsd.envs.webshop.scoring import attribute_matches

KINDS = ("search", "product", "option", "price", "buy")
CORRUPTIONS = ("wrong_search", "skipped_option", "no_buy", "over_price")


@dataclass(frozen=True)
class Criterion:
    """One oracle criterion: its text, its kind and, for an option, the value it names."""

    kind: str
    text: str
    value: str = ""


@dataclass
class Step:
    """One action as the shop took it: the page before and after, what the page then showed."""

    action: str | None
    page: str
    page_after: str
    valid: bool
    asin: str  # the product shown after the action ("" when none)
    options: tuple[tuple[str, str], ...]  # the options chosen after the action
    results: tuple[str, ...] = ()  # product ids on the results page after the action


@dataclass
class Episode:
    """An episode replayed in the shop: its transcript's parts and the steps the rules read."""

    task: Task
    name: str  # expert | wrong_search | skipped_option | no_buy | over_price | policy_<n>
    observations: list[str]
    actions: list[str | None]
    steps: list[Step] = field(default_factory=list)
    purchased: str | None = None
    purchased_options: tuple[tuple[str, str], ...] = ()
    score: float = 0.0


def oracle_criteria(task: Task) -> list[Criterion]:
    """The task's oracle rubric with each criterion's kind, in oracle_rubric's order."""
    goal = task.payload["goal"]
    options = [("option", value) for _, value in goal["goal_options"]]
    kinds = [("search", ""), ("product", ""), *options, ("price", ""), ("buy", "")]
    if len(kinds) < 5:
        kinds.insert(2, ("title", ""))  # oracle_rubric's filler for a goal without options
    texts = oracle_rubric(task)
    kinds = kinds[:len(texts)]
    if len(kinds) != len(texts):
        raise AssertionError(f"oracle_rubric({task.id}) has {len(texts)} criteria, expected {len(kinds)}")
    return [Criterion(kind, text, value) for (kind, value), text in zip(kinds, texts)]


def play(env, task: Task, actions: list[str | None], name: str) -> Episode:
    """`actions` played from the start of `task` in a fork of `env` (stopping when it ends)."""
    shop = env.fork()
    episode = Episode(task, name, [shop.reset(task)], [])
    for action in actions:
        if shop.done:
            break
        page = shop.state.page
        observation, _, info = shop.step(action)
        state = shop.state
        shown = (results_on_page(shop.index.search(state.query), state.page_number, shop.results_per_page)
                 if state.page == RESULTS else ())
        episode.actions.append(action)
        episode.observations.append(observation)
        episode.steps.append(Step(action, page, state.page, bool(info["valid_action"]), state.asin, state.options,
                                  shown))
        if info.get("purchased"):
            episode.purchased, episode.purchased_options = info["purchased"], state.options
    episode.score = shop.score
    return episode


def truth(criterion: Criterion, episode: Episode, catalog) -> bool | None:
    """Whether `episode` satisfies `criterion` by its kind's rule (module docstring); None where
    the rule does not decide (`title`; `price` without a purchase)."""
    goal = episode.task.payload["goal"]
    kind = criterion.kind
    if kind == "search":
        return any(step.action is not None and step.action.startswith("search[") and step.valid
                   and any(catalog.by_asin[a].query == goal["query"] for a in step.results) for step in episode.steps)
    if kind == "product":
        opened = {step.asin for step in episode.steps
                  if step.valid and step.page == RESULTS and step.page_after == ITEM}
        return any(catalog.by_asin[a].query == goal["query"]
                   and attribute_matches(catalog.by_asin[a], goal["attributes"]) == len(goal["attributes"])
                   for a in opened)
    if kind == "option":
        wanted = click_key(criterion.value)
        return any(click_key(value) == wanted for step in episode.steps for _, value in step.options)
    if kind == "price":
        return None if episode.purchased is None else catalog.by_asin[episode.purchased].price <= goal["price_upper"]
    if kind == "buy":
        chosen = {click_key(value) for _, value in episode.purchased_options}
        return episode.purchased is not None and all(click_key(v) in chosen for _, v in goal["goal_options"])
    return None


def expert_actions(env, task: Task) -> list[str]:
    """The expert's actions from the start of `task` to its end (the env's horizon)."""
    shop = env.fork()
    shop.reset(task)
    actions = []
    while not shop.done:
        actions.append(shop.expert_action())
        shop.step(actions[-1])
    return actions


def first_result(env, task: Task, search: str) -> str | None:
    shop = env.fork()
    shop.reset(task)
    shop.step(search)
    shown = results_on_page(shop.index.search(shop.state.query), 1, shop.results_per_page)
    return shown[0] if shown else None


def corrupted(env, task: Task, expert: Episode, rng: random.Random) -> list[Episode]:
    """The corruptions of `expert` that exist for `task` (CORRUPTIONS' order), each played."""
    goal, catalog = task.payload["goal"], env.catalog
    out = []
    others = [t for t in env.tasks(task.split) if t.payload["goal"]["query"] != goal["query"]]
    other = rng.choice(others)
    search = f"search[{other.payload['goal']['search_text']}]"
    first = first_result(env, task, search)
    if first is not None:
        out.append(play(env, task, [search, f"click[{first}]", f"click[{BUY_NOW}]"], "wrong_search"))
    option_steps = [t for t, step in enumerate(expert.steps) if step.page == ITEM and step.page_after == ITEM
                    and split_command(step.action)[0] == "click" and step.valid]
    if option_steps:
        skipped = expert.actions[:option_steps[0]] + expert.actions[option_steps[0] + 1:]
        out.append(play(env, task, skipped, "skipped_option"))
    if expert.purchased is not None:
        out.append(play(env, task, expert.actions[:-1], "no_buy"))
    dear = over_price_path(env, task, catalog)
    if dear is not None:
        out.append(play(env, task, dear, "over_price"))
    return out


def over_price_path(env, task: Task, catalog) -> list[str] | None:
    """Search, open a product priced above the goal's bound, choose the goal's options it offers,
    buy. The product is of the goal's type where the catalog has one (through the goal's own search
    when its first page shows one, else a search for its title); for a type never priced that high,
    the product just above the bound (searched by its title). None when no search finds one on a
    first results page."""
    goal = task.payload["goal"]
    bound = goal["price_upper"]
    dear = [p for p in catalog.products if p.price > bound]
    same = sorted((p for p in dear if p.query == goal["query"]), key=lambda p: p.asin)
    near = sorted((p for p in dear if p.query != goal["query"]), key=lambda p: (p.price, p.asin))
    searches = ([(goal["search_text"], None)] if same else []) + [(p.title, p.asin) for p in (same or near)[:8]]
    for text, wanted in searches:
        shown = results_on_page(env.index.search(" ".join(text.lower().split())), 1, env.results_per_page)
        pick = next((a for a in shown if a == wanted or (wanted is None and catalog.by_asin[a].query == goal["query"]
                                                          and catalog.by_asin[a].price > bound)), None)
        if pick is None:
            continue
        offered = {click_key(v) for _, values in catalog.by_asin[pick].options for v in values}
        options = [f"click[{v}]" for _, v in goal["goal_options"] if click_key(v) in offered]
        return [f"search[{text}]", f"click[{pick}]", *options, f"click[{BUY_NOW}]"]
    return None


def task_episodes(env, task: Task, seed: int) -> list[Episode]:
    """The expert's episode on `task`, then its corruptions."""
    expert = play(env, task, expert_actions(env, task), "expert")
    return [expert, *corrupted(env, task, expert, random.Random(f"verifier-check:{seed}:{task.id}"))]
