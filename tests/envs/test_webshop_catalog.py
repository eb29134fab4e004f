"""The generated catalog: size, determinism, disjoint splits, and word lists the score tells
apart."""

import itertools
import re
from collections import Counter

import pytest

from orsd.envs.webshop.catalog import (
    NO_PRICE_BOUND, PRICE_STEPS, build_catalog, get_catalog,
)
from orsd.envs.webshop.pages import BACK_TO_SEARCH, BUY_NOW, DETAIL_PAGES, NEXT, PREV, click_key
from orsd.envs.webshop.scoring import (
    attribute_matches, fuzzy_ratio, normalize_color, score_purchase,
)
from orsd.envs.webshop.search import SearchIndex
from orsd.envs.webshop.vocab import CATEGORIES, PRODUCT_TYPES

TYPES = {t.key: t for t in PRODUCT_TYPES}


@pytest.fixture(scope="module")
def catalog():
    return get_catalog(0, 1500, 4)


def goal_key(goal):
    return (goal.asin, goal.attributes, goal.goal_options)


def test_size_and_categories(catalog):
    assert len(catalog.products) == 1500
    per_category = Counter(p.category for p in catalog.products)
    assert set(per_category) == set(CATEGORIES) and len(CATEGORIES) == 5
    assert min(per_category.values()) >= 250
    asins = [p.asin for p in catalog.products]
    assert len(set(asins)) == len(asins)
    assert all(re.fullmatch(r"B0[A-Z0-9]{8}", a) for a in asins)
    assert {name: len(goals) for name, goals in catalog.goals.items()} == {
        "train": 5000, "dev": 500, "test": 500}


def test_products_have_attributes_options_prices_and_text(catalog):
    for p in catalog.products:
        ptype = TYPES[p.type_key]
        assert len(p.attributes) == 3 and set(p.attributes) <= set(ptype.attributes)
        assert [name for name, _ in p.options] == [name for name, _ in ptype.options]
        assert all(len(values) >= 2 for _, values in p.options)
        low, high = ptype.price_range
        assert low - 1 <= p.price <= high and p.price > 0
        assert p.brand in p.title and p.bullet_points and p.description and p.reviews


def test_same_seed_same_catalog_and_other_seed_differs():
    first, second = build_catalog(7, 300, 2), build_catalog(7, 300, 2)
    assert first.products == second.products and first.goals == second.goals
    other = build_catalog(8, 300, 2)
    assert [p.asin for p in other.products] != [p.asin for p in first.products]


def test_splits_are_disjoint(catalog):
    keys = {name: {goal_key(g) for g in goals} for name, goals in catalog.goals.items()}
    assert sum(len(k) for k in keys.values()) == sum(len(g) for g in catalog.goals.values())
    for a, b in itertools.combinations(keys, 2):
        assert not keys[a] & keys[b], (a, b)


def test_every_goal_is_reachable_and_well_formed(catalog):
    for goals in catalog.goals.values():
        for goal in goals:
            target = catalog.by_asin[goal.asin]
            assert 1 <= len(goal.attributes) <= 3 and set(goal.attributes) <= set(target.attributes)
            assert dict(goal.goal_options).keys() == dict(target.options).keys()
            assert goal.price_upper == NO_PRICE_BOUND or (
                goal.price_upper in PRICE_STEPS and target.price < goal.price_upper)
            assert f"price lower than {goal.price_upper:.2f} dollars" in goal.instruction_text
            for name, value in goal.goal_options:
                assert f"{name}: {value}" in goal.instruction_text
            parts = score_purchase(target, goal, target.price, dict(goal.goal_options),
                                   catalog.title_nouns)
            assert parts.score == 1.0


def test_attributes_of_a_type_are_told_apart():
    for ptype in PRODUCT_TYPES:
        for a, b in itertools.combinations(ptype.attributes, 2):
            assert fuzzy_ratio(a, b) <= 85, (ptype.key, a, b)


def test_option_values_of_a_type_are_told_apart_and_clickable():
    reserved = {click_key(x) for x in (BACK_TO_SEARCH, PREV, NEXT, BUY_NOW, *DETAIL_PAGES)}
    for ptype in PRODUCT_TYPES:
        values = [v for _, vs in ptype.options for v in vs]
        keys = [click_key(v) for v in values]
        assert len(set(keys)) == len(keys) and not set(keys) & reserved, ptype.key
        for a, b in itertools.combinations(values, 2):
            assert fuzzy_ratio(normalize_color(a), normalize_color(b)) <= 85, (ptype.key, a, b)


def test_a_product_matches_exactly_its_own_attributes(catalog):
    # so a goal attribute the product lacks is really missed (no accidental text match)
    for p in catalog.products:
        for attribute in TYPES[p.type_key].attributes:
            expected = attribute in p.attributes
            assert attribute_matches(p, [attribute]) == expected, (p.asin, attribute)


def test_title_nouns_come_from_the_lexicon(catalog):
    p = next(p for p in catalog.products if p.type_key == "hair_extension")
    assert catalog.title_nouns(p.title) == (p.brand.lower(), "hair", "extension")


def test_search_finds_the_type_and_is_deterministic(catalog):
    index = SearchIndex(catalog)
    results = index.search("sulfate free shampoo")
    assert 0 < len(results) <= 50
    assert all(catalog.by_asin[a].type_key == "shampoo" for a in results[:10])
    assert index.search("Sulfate  FREE shampoo!") == results  # same words, cached
    assert index.search("the and of") == () and index.search("") == ()
    assert index.search("zzzqqq") == ()


@pytest.mark.parametrize("kwargs, match", [
    ({"seed": "1", "num_products": 100, "goals_per_product": 1}, "seed must be an int"),
    ({"seed": 1, "num_products": 5, "goals_per_product": 1}, "num_products must be an int >= 30"),
    ({"seed": 1, "num_products": 100, "goals_per_product": 0}, "goals_per_product must be"),
])
def test_build_catalog_errors(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        build_catalog(**kwargs)
