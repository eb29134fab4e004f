"""WebShop's official episode score for buying a product with chosen options.

    score = r_type · (n_att + n_opt + r_price) / (|goal attributes| + |goal options| + 1)

following the public WebShop goal module (see docs/environments.md for the formula in full and
the places where we differ): fuzzy matching is `rapidfuzz`'s token-set ratio with thefuzz's
default preprocessing and integer rounding, and the nouns of a title come from the catalog's
noun lexicon instead of spaCy POS tags.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from rapidfuzz import fuzz, utils

from orsd.envs.webshop.catalog import Goal, Product
from orsd.envs.webshop.vocab import COLOR_SET

#: a fuzzy similarity strictly above this (0–100 scale) counts as a match
FUZZY_THRESHOLD = 85


@dataclass(frozen=True)
class ScoreParts:
    """The official score and its parts (WebShop's verbose reward info)."""

    score: float
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float
    num_attribute_matches: int
    num_option_matches: int
    r_price: float


def fuzzy_ratio(a: str, b: str) -> int:
    """thefuzz's `token_set_ratio`: lower-cased, punctuation-stripped, rounded to an int."""
    return int(round(fuzz.token_set_ratio(a, b, processor=utils.default_process)))


def normalize_color(value: str) -> str:
    """The first colour of COLOR_SET contained in `value`, else `value` (WebShop's rule)."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def type_reward(
    product: Product, goal: Goal, title_nouns: Callable[[str], Iterable[str]]
) -> tuple[float, bool, bool, float]:
    """r_type with its parts (query match, category match, title score).

    r_type = 1 if the queries are equal, the category paths share ≥ 2 segments or the title
    score exceeds 0.2, else 0.5; then 0.1 if the title score is below 0.1 and 0 if it is 0.
    The title score is the fraction of the goal name's nouns found among the product title's.
    """
    query_match = product.query == goal.query
    goal_path = {s.strip() for s in goal.product_category.split("›")}
    category_match = len(set(product.path) & goal_path) >= 2
    wanted = set(title_nouns(goal.name))
    found = set(title_nouns(product.title))
    title_score = 0.2 if not wanted else len(wanted & found) / len(wanted)
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal_attributes: Iterable[str]) -> int:
    """Goal attributes the product has: fuzzy > 85 with one of its attributes, else found
    (lower-cased) in its title, bullet points or description."""
    text_fields = (
        product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower()
    )
    count = 0
    for wanted in goal_attributes:
        if any(fuzzy_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.attributes):
            count += 1
        elif any(wanted in text for text in text_fields):
            count += 1
    return count


def option_matches(chosen_values: Iterable[str], goal_values: Iterable[str]) -> int:
    """Goal option values matched (colour-normalised, fuzzy > 85) by some chosen value."""
    chosen = [normalize_color(v) for v in chosen_values]
    count = 0
    for wanted in goal_values:
        wanted = normalize_color(wanted)
        if any(fuzzy_ratio(have, wanted) > FUZZY_THRESHOLD for have in chosen):
            count += 1
    return count


def score_purchase(
    product: Product,
    goal: Goal,
    price: float,
    options: Mapping[str, str],
    title_nouns: Callable[[str], Iterable[str]],
) -> ScoreParts:
    """The official score of buying `product` at `price` with `options` ({group: value})."""
    r_type, query_match, category_match, title_score = type_reward(product, goal, title_nouns)
    r_price = 1.0 if price <= goal.price_upper else 0.0
    n_att = attribute_matches(product, goal.attributes)
    n_opt = option_matches(options.values(), [value for _, value in goal.goal_options])
    total = (n_att + n_opt + r_price) / (len(goal.attributes) + len(goal.goal_options) + 1)
    return ScoreParts(
        score=total * r_type, r_type=r_type, query_match=query_match,
        category_match=category_match, title_score=title_score,
        num_attribute_matches=n_att, num_option_matches=n_opt, r_price=r_price,
    )
