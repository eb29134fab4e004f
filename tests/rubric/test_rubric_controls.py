"""The control bundles of rubric.delta_baseline (orsd/rubric/controls.py) on fixed inputs."""

import math
import random

from orsd.rubric import RubricBundle
from orsd.rubric.controls import (CONTENT_FREE_CRITERIA, CONTROLS, content_free_bundle, filler, rejected_bundle,
                                  shuffled_bundle)

B_STAR = RubricBundle(["Search with the words of the task.",  # 7 words
                       "Open a product whose title names the requested type before anything else is clicked.",  # 14
                       "Buy it."])  # 2


def bundle(*criteria):
    return RubricBundle(list(criteria), raw_text="\n".join(criteria))


def test_the_controls_and_their_order():
    assert CONTROLS == ("none", "content_free", "rejected", "shuffled")


def test_content_free_takes_the_unused_sentence_closest_in_words_at_each_position():
    control = content_free_bundle(B_STAR)
    # 7 words: the 7-word sentence; 14: the first 14-word one; 2: the 7-word one is used, so the 10-word one
    assert control.criteria == [CONTENT_FREE_CRITERIA[0], CONTENT_FREE_CRITERIA[3], CONTENT_FREE_CRITERIA[1]]
    assert control.source == "control:content_free"
    assert not set(control.criteria) & set(B_STAR.criteria)


def test_content_free_starts_the_pool_over_for_more_criteria_than_sentences():
    many = RubricBundle([f"The agent does thing number {i} of the list." for i in range(12)])
    control = content_free_bundle(many)
    assert len(control) == 12
    assert sorted(control.criteria[:10]) == sorted(CONTENT_FREE_CRITERIA)  # each once before any repeats
    assert set(control.criteria[10:]) <= set(CONTENT_FREE_CRITERIA)


def test_rejected_is_the_lowest_finite_rho_other_than_b_star():
    bundles = [bundle("a a a", "b b b"), bundle("c c c"), bundle("d d d"), bundle("e e e")]
    control = rejected_bundle(bundles, [0.9, -0.2, math.nan, 0.1], selected=0)
    assert control.criteria == ["c c c"] and control.source == "control:rejected"
    assert control.raw_text == "c c c"
    # B* itself is never the control, even with the lowest ρ
    assert rejected_bundle(bundles, [-1.0, 0.5, 0.2, None], selected=0).criteria == ["d d d"]


def test_rejected_without_any_finite_rho_is_the_first_other_candidate():
    bundles = [bundle("a a a"), bundle("b b b"), bundle("c c c")]
    assert rejected_bundle(bundles, [math.nan] * 3, selected=1).criteria == ["a a a"]
    assert rejected_bundle(bundles, [], selected=0).criteria == ["b b b"]  # no ρ recorded at all


def test_rejected_is_none_for_a_single_candidate():
    assert rejected_bundle([bundle("a a a")], [0.5], selected=0) is None


def test_shuffled_draws_b_stars_count_from_other_bundles_without_b_stars_own_criteria():
    others = [bundle("x one", "x two", "Buy it."), bundle("y one")]
    control = shuffled_bundle(B_STAR, others, random.Random(3))
    assert len(control) == len(B_STAR) and control.source == "control:shuffled"
    assert sorted(control.criteria) == ["x one", "x two", "y one"]  # "Buy it." is B*'s own
    again = shuffled_bundle(B_STAR, others, random.Random(3))
    assert again.criteria == control.criteria  # seeded


def test_shuffled_cycles_a_small_pool_and_is_none_without_one():
    control = shuffled_bundle(B_STAR, [bundle("only one")], random.Random(0))
    assert control.criteria == ["only one"] * 3
    assert shuffled_bundle(B_STAR, [], random.Random(0)) is None
    assert shuffled_bundle(B_STAR, [B_STAR], random.Random(0)) is None  # one rubric file for every task


def test_filler_cycles_the_content_free_sentences():
    assert filler(0) == ""
    assert filler(2) == f"{CONTENT_FREE_CRITERIA[0]} {CONTENT_FREE_CRITERIA[1]}"
    assert filler(len(CONTENT_FREE_CRITERIA) + 1).endswith(CONTENT_FREE_CRITERIA[0])
