"""The warm start's bundle demonstrations (warmstart.collect_bundle_demos): content-bearing ones
(warm_start.bundle_demos_kind=content, the default) and the criteria pool's (pool).

Each demonstration is written from its own group: one shop task played `group_size` times, by the
expert and by deliberate deviations from it (a search for another product, options skipped, a
product over the price limit or that the instruction does not describe opened and bought, Buy Now
never clicked). The prompt is the bundle prompt training renders (the task and the group's
transcripts, nothing else); the answer is 5–8 criteria that the better episodes of the group
satisfy and the worse ones do not, written from this task's own words (its product, attributes,
options, price limit) and from what these episodes did (the other product searched for, the
product over the limit). Each candidate criterion has a rule that decides it on an episode from
the shop's own record of what happened (`replay_facts`), so "better satisfies, worse does not" is
checked, not assumed. Which episodes were better (the shop's score of the purchase) is known
here, since this module builds them, and never enters the prompt.

Ours, not the paper's: its Qwen3 policies write such rubrics without demonstrations; a 135M policy
fitted on the fixed pool (criteria_pool.yaml) learned to copy the pool whatever the task (issue 67).
Only the generated shop has a writer; other envs keep the pool (`writes_content`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from orsd import rubric

from .bundles import transcripts
from .records import Group, Trajectory
from .rollout import render

#: how a group's episodes may deviate from the expert (besides the expert itself)
DEVIATIONS = ("wrong_search", "skip_options", "wrong_product", "no_buy")

#: the criterion templates, in the order a demonstration lists them (every demonstrated transition
#: moves forward through this order, as the pool's did: a small model learns to write distinct
#: criteria and stop). Placeholders are filled from the task and the group's episodes.
TEMPLATES = {
    "search_product": 'The agent searches for "{product}" before opening any product.',
    "search_attributes": "The agent's search includes {attributes} from the instruction.",
    "no_other_search": 'The agent does not search for "{other}", which is not {a_product}.',
    "open_product": "The agent opens {a_product} from the search results.",
    "no_wrong_product": "The agent does not open {asin}, {why}.",
    "option": 'On the product page the agent clicks the {name} option "{value}".',
    "options_before_buy": "The agent clicks Buy Now only after choosing {values}.",
    "buy_product": "The agent clicks Buy Now on the page of {a_product}.",
    "price": "The agent buys a product that costs less than {price} dollars.",
    "no_detail_page": "The agent does not open {label} on the product page; it clicks Buy Now.",
    "few_actions": "The agent buys the {product} in at most {count} actions.",
}
ORDER = {key: i for i, key in enumerate(TEMPLATES)}


def writes_content(env) -> bool:
    """Whether content demonstrations can be written for `env` (an env or its class): the generated
    shop, whose catalog and goals the rules read; ALFWorld and the real WebShop keep the pool."""
    from orsd.envs.webshop.env import WebShopEnv

    return issubclass(env if isinstance(env, type) else type(env), WebShopEnv)


@dataclass
class Facts:
    """What one episode did, as the shop recorded it: what a reader of its transcript could see, and
    its score, which no prompt shows."""

    searches: list[str] = field(default_factory=list)  # queries, lower-cased as the shop keeps them
    opened: list[str] = field(default_factory=list)  # asins of product pages entered from the results
    clicks: list[str] = field(default_factory=list)  # click labels as written, in order
    bought: str | None = None  # the asin bought with Buy Now
    bought_options: dict = field(default_factory=dict)  # option group -> value at the purchase
    actions: int = 0
    score: float = 0.0  # the shop's score of the purchase (0 without one): never shown


def replay_facts(env, task, actions: list[str | None]) -> Facts:
    """Play `actions` again on a fork of `env` and record what happened."""
    from orsd.envs.webshop.commands import split_command
    from orsd.envs.webshop.pages import ITEM, RESULTS

    shop, facts = env.fork(), Facts()
    shop.reset(task)
    for action in actions:
        before = shop.state.page
        _, done, info = shop.step(action)
        facts.actions += 1
        verb, argument = split_command(action)
        if info["valid_action"] and verb == "search":
            facts.searches.append(shop.state.query)
        elif info["valid_action"] and verb == "click":
            facts.clicks.append(argument)
        if before == RESULTS and shop.state.page == ITEM:
            facts.opened.append(shop.state.asin)
        if info.get("purchased"):
            facts.bought, facts.bought_options = info["purchased"], dict(shop.state.options)
        if done:
            break
    facts.score = shop.score
    return facts


@dataclass
class Episode:
    trajectory: Trajectory
    deviation: str  # "expert" or one of DEVIATIONS
    facts: Facts


def play_deviation(env, task, deviation: str, max_actions: int = 0, other_query: str = "") -> Episode:
    """One episode of `task`, the expert's except where `deviation` says otherwise (see DEVIATIONS);
    `other_query` is what wrong_search searches for."""
    from orsd.envs.webshop.pages import (BACK_TO_SEARCH, BUY_NOW, DETAIL_PAGES, ITEM, PREV, RESULTS, SEARCH,
                                         results_on_page)

    episode = env.fork()
    trajectory = Trajectory(task=task, observations=[episode.reset(task)], actions=[])
    goal, memo, done = episode.goal, {}, False
    values = {value for _, value in goal.goal_options}
    navigation = {f"click[{label}]" for label in (BUY_NOW, PREV, BACK_TO_SEARCH)}  # on a product page: not an option
    while not done and episode.num_actions < (max_actions or env.max_actions):
        action = expert = episode.expert_action()
        state = episode.state
        if deviation in ("wrong_search", "wrong_product"):
            if deviation == "wrong_search" and state.page == SEARCH:
                action = f"search[{other_query}]"
            elif state.page == RESULTS and "target" not in memo:
                shown = results_on_page(episode._results(), state.page_number, episode.results_per_page)
                first = (shown or [None])[0]
                memo["target"] = _wrong_product(episode, shown) if deviation == "wrong_product" else first
                action = f"click[{memo['target']}]" if memo["target"] else expert
            elif state.page == ITEM and state.asin == memo.get("target"):
                # the goal's options where this product offers them, then Buy Now: only the product is wrong
                product = episode.catalog.by_asin[state.asin]
                chosen = dict(state.options).values()
                offered = [v for _, vs in product.options for v in vs if v in values and v not in chosen]
                action = f"click[{offered[0]}]" if offered else f"click[{BUY_NOW}]"
        elif deviation == "skip_options" and state.page == ITEM and expert not in navigation:
            action = f"click[{BUY_NOW}]"
        elif deviation == "no_buy" and expert == f"click[{BUY_NOW}]":
            memo["details"] = memo.get("details", -1) + 1
            action = f"click[{DETAIL_PAGES[memo['details'] % len(DETAIL_PAGES)]}]"
        observation, done, _ = episode.step(action)
        trajectory.actions.append(action)
        trajectory.observations.append(observation)
    trajectory.score, trajectory.won = episode.score, episode.won
    return Episode(trajectory, deviation, replay_facts(env, task, trajectory.actions))


def _wrong_product(episode, shown) -> str | None:
    """A product on the results page that buying cannot score 1: over the price limit first."""
    catalog, goal = episode.catalog, episode.goal
    over = [a for a in shown if catalog.by_asin[a].price >= goal.price_upper]
    others = [a for a in shown if episode._plan(a) is None]
    return (over or others or [None])[0]


def product_phrase(goal) -> str:
    """The product as the instruction words it: the expert's search text without the attributes
    ("rubber sole running shoe" -> "running shoe"), else the goal's query."""
    text = goal.search_text
    for attribute in goal.attributes:
        text = text.replace(attribute, " ")
    text = " ".join(text.split())
    return text or goal.query


def _quoted(items) -> str:
    items = [f'"{item}"' for item in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _has(text: str, phrase: str) -> bool:
    return phrase.lower() in text.lower()


def candidate_criteria(env, task, episodes: list[Episode]) -> list[tuple[str, str, object]]:
    """(template key, text, rule on Facts) of every criterion this task and group can ground."""
    from orsd.envs.webshop.pages import click_key

    catalog, goal = env.catalog, goal_of(task)
    product, price = product_phrase(goal), goal.price_upper
    a_product = ("an " if product[:1].lower() in "aeiou" else "a ") + product
    title = lambda asin: catalog.by_asin[asin].title  # noqa: E731
    clicked = lambda f, value: any(click_key(c) == click_key(value) for c in f.clicks)  # noqa: E731
    out = [("search_product", TEMPLATES["search_product"].format(product=product),
            lambda f: any(_has(q, product) for q in f.searches[:1]))]
    if goal.attributes:
        out.append(("search_attributes", TEMPLATES["search_attributes"].format(attributes=_quoted(goal.attributes)),
                    lambda f: any(all(_has(q, a) for a in goal.attributes) for q in f.searches)))
    for other in dict.fromkeys(q for e in episodes for q in e.facts.searches if not _has(q, product)):
        out.append(("no_other_search", TEMPLATES["no_other_search"].format(other=other, a_product=a_product),
                    lambda f, other=other: other not in f.searches))
    out.append(("open_product", TEMPLATES["open_product"].format(a_product=a_product),
                lambda f: any(_has(title(a), product) for a in f.opened)))
    right = {a for e in episodes if e.deviation == "expert" for a in e.facts.opened}
    for asin in dict.fromkeys(a for e in episodes if e.deviation == "wrong_product" for a in e.facts.opened
                              if a not in right):
        item = catalog.by_asin[asin]
        missing = [a for a in goal.attributes if not _has(item.title, a)]
        why = (f"which costs {item.price:.2f} dollars, more than {price:.2f}" if item.price >= price
               else f'whose title lacks "{missing[0]}"' if missing else f"which is not the {product} asked for")
        out.append(("no_wrong_product", TEMPLATES["no_wrong_product"].format(asin=asin, why=why),
                    lambda f, asin=asin: asin not in f.opened))
    for name, value in goal.goal_options:
        out.append(("option", TEMPLATES["option"].format(name=name, value=value),
                    lambda f, value=value: clicked(f, value)))
    values = [value for _, value in goal.goal_options]
    if values:
        out.append(("options_before_buy", TEMPLATES["options_before_buy"].format(values=_quoted(values)),
                    lambda f: f.bought is not None and all(v in f.bought_options.values() for v in values)))
    else:
        out.append(("buy_product", TEMPLATES["buy_product"].format(a_product=a_product),
                    lambda f: f.bought is not None and _has(title(f.bought), product)))
    out.append(("price", TEMPLATES["price"].format(price=f"{price:.2f}"),
                lambda f: f.bought is not None and catalog.by_asin[f.bought].price < price))
    for label in dict.fromkeys(c for e in episodes if e.deviation == "no_buy" for c in e.facts.clicks
                               if c in ("Description", "Features", "Reviews")):
        out.append(("no_detail_page", TEMPLATES["no_detail_page"].format(label=label),
                    lambda f, label=label: label not in f.clicks and f.bought is not None))
    best = [e.facts.actions for e in episodes if e.deviation == "expert"]
    if best:
        count = min(best)
        out.append(("few_actions", TEMPLATES["few_actions"].format(product=product, count=count),
                    lambda f: f.bought is not None and f.actions <= count and _has(title(f.bought), product)))
    return out


def goal_of(task):
    """The shop's Goal of `task` (what its instruction asks)."""
    from orsd.envs.webshop.catalog import Goal

    return Goal.from_dict(task.payload["goal"])


#: added to the expert's score when choosing criteria, below any difference of two shop scores
EXPERT_TIE_BREAK = 1e-6


def choose_criteria(candidates, episodes: list[Episode], rng: random.Random) -> list[str]:
    """5–8 criteria in template order, never one that a best episode of the group fails. First
    those that order the group (every episode that satisfies one scores at least as much as every
    episode that does not, and some episode fails it), then those that some worse episodes fail
    (the episodes that satisfy it score more on average than those that fail it), then those every
    episode satisfies (they still name the task)."""
    # the shop's score; between equal scores the expert's way of working is the better one (when
    # the horizon is too short for any purchase, the expert still got further)
    scores = [e.facts.score + EXPERT_TIE_BREAK * (e.deviation == "expert") for e in episodes]
    top = max(scores)
    tiers: list[list] = [[], [], []]
    for key, text, rule in candidates:
        met = [bool(rule(e.facts)) for e in episodes]
        yes = [s for s, m in zip(scores, met) if m]
        no = [s for s, m in zip(scores, met) if not m]
        if any(s == top and not m for s, m in zip(scores, met)):
            continue  # a best episode fails it: not a criterion of the better episodes
        if not no:
            tiers[2].append((ORDER[key], text))
        elif min(yes) >= max(no):
            tiers[0].append((ORDER[key], text))
        elif sum(yes) / len(yes) > sum(no) / len(no):
            tiers[1].append((ORDER[key], text))
    size = rng.randint(rubric.MIN_CRITERIA, rubric.MAX_CRITERIA)
    for tier in tiers:  # which of a tier's criteria are left out varies, their order does not
        rng.shuffle(tier)
    chosen = (tiers[0] + tiers[1] + tiers[2])[:size]
    return [text for _, text in sorted(chosen, key=lambda item: item[0])]


@dataclass
class BundleDemo:
    """One demonstration and what it was written from (for tests and measurements)."""

    task: object
    episodes: list[Episode]  # in the prompt's order (empty for a pool demonstration)
    transcripts: list[str]
    prompt_ids: list[int]
    criteria: list[str]

    @property
    def answer(self) -> str:
        return "\n".join(f"{i}. {criterion}" for i, criterion in enumerate(self.criteria, 1))


def content_demo(env, tokenizer, task, group_size: int, transcript_chars: int, rng: random.Random,
                 template=None, max_actions: int = 0) -> BundleDemo:
    """The demonstration of one group of `task`: one expert episode and `group_size` - 1 others,
    each the expert's or a deviation (distinct deviations while there are enough), in random order."""
    kinds = [k for k in DEVIATIONS if k != "skip_options" or goal_of(task).goal_options] + ["expert"]
    drawn = rng.sample(kinds, min(group_size - 1, len(kinds)))
    drawn += [rng.choice(kinds) for _ in range(group_size - 1 - len(drawn))]
    order = ["expert", *drawn]
    rng.shuffle(order)
    product = goal_of(task).query
    others = [t for t in env.tasks(task.split) if t.payload["goal"]["query"] != product]
    other_query = rng.choice(others).payload["goal"]["search_text"] if others else "something else"
    episodes = [play_deviation(env, task, kind, max_actions, other_query) for kind in order]
    # what training's bundle prompt shows of a group (bundles.write_bundles), nothing more
    shown = transcripts(Group(task, [e.trajectory for e in episodes]), transcript_chars)
    prompt = render(tokenizer, rubric.generation_messages(task.description, shown, template=template))
    criteria = choose_criteria(candidate_criteria(env, task, episodes), episodes, rng)
    return BundleDemo(task, episodes, shown, prompt, criteria)


#: tasks drawn for one content demonstration before it is written from the pool instead (a group
#: whose episodes yield fewer than MIN_CRITERIA criteria, e.g. when the horizon env.max_actions is
#: too short for the expert to buy, has too little to demonstrate)
TASK_TRIES = 8


def content_demos(env, tokenizer, count: int, group_size: int, transcript_chars: int, rng: random.Random,
                  template=None, max_actions: int = 0, log=None) -> list[BundleDemo]:
    """`count` content demonstrations, each of a task drawn with `rng` whose group yields at least
    MIN_CRITERIA criteria; after TASK_TRIES tasks without one, that demonstration is the pool's
    (`log` says how many were)."""
    out, pooled = [], 0
    for _ in range(count):
        for _ in range(TASK_TRIES):
            demo = content_demo(env, tokenizer, env.sample_task(rng), group_size, transcript_chars, rng, template,
                                max_actions)
            if len(demo.criteria) >= rubric.MIN_CRITERIA:
                break
        else:
            demo = pool_demo(env, tokenizer, criteria_pool(env.name), group_size, transcript_chars, rng, template,
                             max_actions)
            pooled += 1
        out.append(demo)
    if pooled and log is not None:
        log(f"bundle demonstrations: {pooled} of {count} drawn from the criteria pool: {TASK_TRIES} tasks in a row "
            f"gave too few criteria (does the expert buy within env.max_actions={max_actions or env.max_actions}?)")
    return out


def criteria_pool(env_name: str) -> list[str]:
    """The criteria pool demonstrations draw from (orsd/train/criteria_pool.yaml)."""
    from importlib import resources

    import yaml

    return yaml.safe_load(resources.files("orsd.train").joinpath("criteria_pool.yaml").read_text())[env_name]


def pool_demo(env, tokenizer, pool: list[str], group_size: int, transcript_chars: int, rng: random.Random,
              template=None, max_actions: int = 0) -> BundleDemo:
    """warm_start.bundle_demos_kind=pool: the generation prompt of one task's episodes with more or
    less noise (`play`) answered by 5–8 criteria of `pool`, whatever the task said."""

    task = env.sample_task(rng)
    runs = [play(env, task, rng, noise, max_actions)[0] for noise in
            [i / max(group_size - 1, 1) for i in range(group_size)]]
    shown = [rubric.format_transcript(t.observations, t.actions, max_chars=transcript_chars) for t in runs]
    prompt = render(tokenizer, rubric.generation_messages(task.description, shown, template=template))
    # A random subset kept in pool order: every demonstrated transition moves forward through the
    # pool, so a small model learns to write distinct criteria and then stop; with shuffled order
    # SmolLM2 learned "any criterion may follow any other" and repeated one line 9 times.
    size = rng.randint(rubric.MIN_CRITERIA, min(rubric.MAX_CRITERIA, len(pool)))
    criteria = [pool[i] for i in sorted(rng.sample(range(len(pool)), size))]
    return BundleDemo(task, [], shown, prompt, criteria)


def template_corpus() -> list[str]:
    """The templates' fixed words, one piece per stretch of two words or more between placeholders:
    what speculative bundle decoding may copy besides the prompt (where the words filled in, the
    task's and the transcripts', already are) and the other bundles."""
    return [piece for text in TEMPLATES.values() for piece in re.split(r"\{[a-z_]+\}", text)
            if len(piece.split()) >= 2]


def task_terms(task) -> list[str]:
    """What a criterion may name of a shop task: its product (as the instruction and the goal word
    it), attributes, option values and price limit."""
    goal = goal_of(task)
    price = goal.price_upper
    return [product_phrase(goal), goal.query, *goal.attributes, *(v for _, v in goal.goal_options),
            f"{price:.2f}", f"{price:g}"]


def names_task(criterion: str, task) -> bool:
    """Whether `criterion` names something of `task` (task_terms, whole words, any case)."""
    return any(re.search(rf"(?<![\w.]){re.escape(term.lower())}(?![\w])", criterion.lower())
               for term in task_terms(task))


def play(env, task, rng: random.Random, noise: float, max_actions: int, context_of=None):
    """One episode led by the expert; with probability `noise` a random valid command
    (`Env.random_action`: one of ALFWorld's admissible commands, a shop page's search or click) is
    executed instead (the label stays the expert's, so the next turns show the recovery). Returns
    the trajectory and, when `context_of` is given, (context ids, expert command) per turn."""
    episode = env.fork()
    trajectory = Trajectory(task=task, observations=[episode.reset(task)], actions=[])
    turns, done = [], False
    while not done and episode.num_actions < (max_actions or env.max_actions):
        expert = episode.expert_action()
        if context_of is not None:
            turns.append((context_of(episode, trajectory), expert))
        action = (episode.random_action(rng) or expert) if noise and rng.random() < noise else expert
        observation, done, _ = episode.step(action)
        trajectory.actions.append(action)
        trajectory.observations.append(observation)
    return trajectory, turns
