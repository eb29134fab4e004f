"""WebShop's official score on hand-made products: each wrong part lowers it as the formula says.

score = r_type · (n_att + n_opt + r_price) / (|goal attributes| + |goal options| + 1)
"""

import dataclasses

import pytest

from orsd.envs.webshop.catalog import Goal, Product
from orsd.envs.webshop.scoring import (
    fuzzy_ratio, normalize_color, option_matches, score_purchase, type_reward,
)

LEXICON = {"acme", "zenco", "hair", "extension", "kit", "set", "shampoo", "shirt", "neck"}


def nouns(title):
    return [w for w in title.lower().replace("-", " ").split() if w in LEXICON]


GOAL = Goal(
    asin="B0TARGET00", category="beauty", query="hair extensions",
    name="Acme Clip-In Hair Extension", product_category="Beauty › Hair Care › Hair Extensions",
    instruction_text="i need a heat resistant and natural looking clip-in hair extension with "
    "color: black, and length: 18 inch, and price lower than 40.00 dollars",
    attributes=("heat resistant", "natural looking"),
    goal_options=(("color", "black"), ("length", "18 inch")), price_upper=40.0,
    search_text="heat resistant natural looking clip-in hair extension",
)

RIGHT = Product(
    asin="B0RIGHT000", type_key="hair_extension", category="beauty",
    path=("Beauty", "Hair Care", "Hair Extensions"), query="hair extensions",
    title="Zenco Silky Clip-In Hair Extension", brand="Zenco", price=30.0, rating=4.0,
    attributes=("heat resistant", "natural looking", "tangle free"),
    options=(("color", ("black", "grey")), ("length", ("14 inch", "18 inch"))),
    bullet_points=("HEAT RESISTANT: fine.",), description="A product.", reviews=(),
)
GOOD_OPTIONS = {"color": "black", "length": "18 inch"}


def score(product=RIGHT, goal=GOAL, price=None, options=GOOD_OPTIONS, title_nouns=nouns):
    price = product.price if price is None else price
    return score_purchase(product, goal, price, options, title_nouns)


def test_right_product_scores_one():
    parts = score()
    assert parts.score == 1.0
    assert (parts.r_type, parts.num_attribute_matches, parts.num_option_matches, parts.r_price) == (
        1.0, 2, 2, 1.0)


def test_wrong_option():
    parts = score(options={"color": "grey", "length": "18 inch"})
    assert parts.num_option_matches == 1
    assert parts.score == pytest.approx((2 + 1 + 1) / 5)


def test_no_option_chosen():
    assert score(options={}).score == pytest.approx((2 + 0 + 1) / 5)


def test_missing_attribute():
    product = dataclasses.replace(RIGHT, attributes=("heat resistant", "tangle free"))
    parts = score(product)
    assert parts.num_attribute_matches == 1
    assert parts.score == pytest.approx((1 + 2 + 1) / 5)


def test_attribute_found_in_text_counts():
    # WebShop's fallback: a goal attribute written in the title, bullets or description matches
    for field, text in (("title", "Zenco Natural Looking Hair Extension"),
                        ("description", "Looks NATURAL LOOKING indeed.")):
        product = dataclasses.replace(RIGHT, attributes=("heat resistant",), **{field: text})
        assert score(product).num_attribute_matches == 2


def test_over_price():
    parts = score(price=45.0)
    assert parts.r_price == 0.0
    assert parts.score == pytest.approx((2 + 2 + 0) / 5)
    assert score(price=40.0).score == 1.0  # the bound itself is allowed


def test_wrong_type_scores_zero():
    shirt = dataclasses.replace(
        RIGHT, query="men t-shirt", path=("Clothing", "Men", "T-Shirts"),
        title="Zenco Crew Neck T-Shirt",
    )
    # goal nouns {acme, hair, extension}, shirt nouns {zenco, neck, shirt}: title score 0
    parts = score(shirt)
    assert parts.title_score == 0.0 and parts.r_type == 0.0 and parts.score == 0.0


def test_type_half_when_nothing_but_a_weak_title_matches():
    goal = dataclasses.replace(GOAL, name="Acme Hair Extension Kit Set")  # 5 nouns
    other = dataclasses.replace(
        RIGHT, query="shampoo", path=("Beauty", "Shampoo"), title="Zenco Hair Shampoo")
    r_type, query_match, category_match, title_score = type_reward(other, goal, nouns)
    # one of five goal nouns: 0.2 is not > 0.2, and neither query nor 2 path segments match
    assert (query_match, category_match, title_score, r_type) == (False, False, 0.2, 0.5)
    assert score(other, goal).score == pytest.approx(0.5 * (2 + 2 + 1) / 5)
    # the same weak title with the goal's query counts as the right type
    assert type_reward(dataclasses.replace(other, query=goal.query), goal, nouns)[0] == 1.0
    # ... and so does sharing two category path segments
    same_path = dataclasses.replace(other, path=("Beauty", "Hair Care"))
    assert type_reward(same_path, goal, nouns)[0] == 1.0


def test_type_tenth_when_title_score_is_below_a_tenth():
    goal = dataclasses.replace(GOAL, name="a b c d e f g h i j k")  # 11 nouns
    other = dataclasses.replace(RIGHT, title="a z")  # 1/11 < 0.1
    r_type, _, _, title_score = type_reward(other, goal, lambda t: t.split())
    assert title_score == pytest.approx(1 / 11) and r_type == 0.1


def test_goal_name_without_nouns_gives_title_score_point_two():
    goal = dataclasses.replace(GOAL, name="silky soft")
    assert type_reward(RIGHT, goal, nouns)[3] == 0.2


def test_goal_without_options():
    goal = dataclasses.replace(GOAL, goal_options=())
    assert score(goal=goal, options={}).score == 1.0
    assert score(goal=goal, price=99.0).score == pytest.approx((2 + 0) / 3)


def test_several_faults_combine():
    product = dataclasses.replace(RIGHT, attributes=("tangle free",), price=50.0,
                                  bullet_points=())
    parts = score(product, options={"color": "grey"})
    assert parts.score == pytest.approx((0 + 0 + 0) / 5)


def test_fuzzy_rules_follow_thefuzz():
    assert fuzzy_ratio("Heat-Resistant", "heat resistant") == 100  # case and punctuation
    assert fuzzy_ratio("", "black") == 0
    assert normalize_color("jet black") == "black"
    assert normalize_color("mustard") == "mustard"
    assert option_matches(["jet black"], ["black"]) == 1  # colour normalisation
    # WebShop quirk kept on purpose: a token subset counts as a match
    assert option_matches(["large"], ["x-large"]) == 1
    assert option_matches(["small"], ["large"]) == 0
    # a goal option is counted once however many chosen values match it
    assert option_matches(["black", "black"], ["black"]) == 1
