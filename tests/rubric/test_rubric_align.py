import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orsd.rubric import align, satisfaction, select, select_random, select_single, spearman_rho

nan = math.nan


def test_satisfaction_is_mean_of_finite_scores_eq5():
    scores = np.array([[1.0, 0.0, 0.5], [nan, 1.0, 0.0], [nan, nan, nan]])
    s = satisfaction(scores)
    assert s[0] == pytest.approx(0.5) and s[1] == pytest.approx(0.5) and math.isnan(s[2])


def test_hand_computed_rho_and_argmax_eq6_eq7():
    rewards = np.array([0.0, 1.0, 1.0, 0.0])
    # bundle 0: s = [0.2, 0.9, 0.6, 0.1] -> ranks s [2,4,3,1], r ranks avg [1.5,3.5,3.5,1.5]
    b0 = np.array([[0.2], [0.9], [0.6], [0.1]])
    # bundle 1: s reversed relation
    b1 = np.array([[0.9], [0.1], [0.2], [0.8]])
    # bundle 2: s = [0, 1, 0.5, 0.5] (mean of two criteria)
    b2 = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    result = align([b0, b1, b2], rewards)
    # Pearson on ranks, by hand: rank_s0 = [2,4,3,1], rank_r = [1.5,3.5,3.5,1.5]
    rs, rr = np.array([2, 4, 3, 1.0]), np.array([1.5, 3.5, 3.5, 1.5])
    by_hand0 = ((rs - rs.mean()) @ (rr - rr.mean())) / math.sqrt(((rs - rs.mean()) ** 2).sum() * ((rr - rr.mean()) ** 2).sum())
    assert by_hand0 == pytest.approx(2 / math.sqrt(5))
    assert result.rho[0] == pytest.approx(by_hand0)
    assert result.rho[1] == pytest.approx(-by_hand0)
    # bundle 2: s ranks [1, 4, 2.5, 2.5] -> centred [-1.5, 1.5, 0, 0]; r centred [-1, 1, 1, -1]
    assert result.rho[2] == pytest.approx(3.0 / math.sqrt(4.5 * 4.0))
    assert result.index == 0 and result.reason == "max_rho" and result.selected  # 0.894 > 0.707 > -0.894


def test_ties_lowest_index_wins():
    rewards = np.array([0.0, 1.0, 2.0])
    same = np.array([[0.1], [0.5], [0.9]])
    result = align([same * 0.5, same, same + 0.05], rewards)
    assert result.rho == pytest.approx([1.0, 1.0, 1.0])
    assert result.index == 0


def test_ulp_noise_in_rho_is_a_tie():
    """Both bundles rank the rewards identically, but scipy returns ρ₀ = 0.9999999999999999 and
    ρ₁ = 1.0: within the relative 1e-9 tolerance that is a tie, and the lowest index wins."""
    rewards = np.array([3.0, 2.0, 1.0])
    first, second = np.array([[np.nan], [0.6], [0.5]]), np.array([[0.9], [0.8], [0.5]])
    result = align([first, second], rewards)
    assert result.rho[0] != result.rho[1]  # the noise is real (this is the case that broke the rule)
    assert result.rho == pytest.approx([1.0, 1.0], rel=1e-12)
    assert result.index == 0


def test_constant_rewards_give_no_bundle_and_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = align([np.array([[0.1], [0.9], [0.5]]), np.array([[1.0], [0.0], [0.3]])], np.ones(3))
    assert all(math.isnan(r) for r in result.rho)
    assert result.index is None and result.reason == "no_finite_rho"


def test_constant_satisfaction_is_nan_but_others_can_win():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = align([np.full((4, 3), 0.5), np.array([[0.0], [0.1], [0.7], [0.9]])],
                       np.array([0.0, 0.0, 1.0, 1.0]))
    assert math.isnan(result.rho[0]) and result.rho[1] > 0.8 and result.index == 1


def test_nan_scores_drop_pairs():
    rewards = np.array([0.0, 1.0, 0.0, 1.0])
    scores = np.array([[nan, nan], [0.9, nan], [0.2, 0.0], [nan, 0.8]])  # s = [nan, .9, .1, .8]
    assert align([scores], rewards).rho[0] == pytest.approx(spearman_rho(np.array([0.9, 0.1, 0.8]),
                                                                         np.array([1.0, 0.0, 1.0])))
    only_one_pair = np.array([[nan], [nan], [0.3], [nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(align([only_one_pair], rewards).rho[0])
        assert align([only_one_pair], rewards).index is None


def test_two_pairs_is_defined():
    assert spearman_rho(np.array([0.1, 0.9]), np.array([1.0, 0.0])) == pytest.approx(-1.0)


def test_single_bundle_m1_and_empty():
    result = align([np.array([[0.1], [0.9]])], np.array([0.0, 1.0]))
    assert result.index == 0
    assert align([], np.array([0.0, 1.0])).reason == "no_bundles"


def test_random_is_reproducible_by_seed_and_ignores_alignment():
    picks = [select_random(4, np.random.default_rng(123)).index for _ in range(3)]
    assert len(set(picks)) == 1
    spread = {select_random(4, seed).index for seed in range(40)}
    assert spread == {0, 1, 2, 3}
    result = select("random", None, np.ones(3), rng=7, num_bundles=3)
    assert result.method == "random" and result.index == select_random(3, 7).index
    assert all(math.isnan(r) for r in result.rho)


def test_single_needs_no_scores():
    result = select("single", None, np.array([0.0, 1.0]))
    assert result.index == 0 and result.method == "single" and math.isnan(result.rho[0])
    assert select_single().index == 0
    with pytest.raises(ValueError, match="single"):
        select("single", None, None, num_bundles=2)


def test_select_spearman_matches_align_and_to_dict():
    scores = [np.array([[0.1], [0.9]]), np.array([[0.9], [0.1]])]
    result = select("spearman", scores, np.array([0.0, 1.0]))
    assert result.index == 0
    record = select("spearman", [np.full((2, 1), 0.5)], np.array([0.0, 1.0])).to_dict()
    assert record["rho"] == [None] and record["index"] is None


@pytest.mark.parametrize("scores, rewards", [
    ([np.zeros((3, 2))], np.zeros(4)), ([np.zeros(3)], np.zeros(3)), (np.zeros((1, 3, 2)), np.zeros(3)),
    ([np.zeros((3, 0))], np.zeros(3)), ([np.zeros((3, 1))], np.zeros((3, 1)))])
def test_bad_shapes_rejected(scores, rewards):
    with pytest.raises((ValueError, TypeError)):
        align(scores, rewards)


def test_unknown_method():
    with pytest.raises(ValueError, match="method="):
        select("best", None, np.zeros(2))


CELL = st.one_of(st.sampled_from([0.0, 0.5, 1.0, math.nan]), st.floats(0, 1))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.lists(CELL, min_size=2, max_size=2), min_size=n, max_size=n), min_size=1, max_size=4),
    st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=n, max_size=n))))
def test_align_properties_without_warnings(case):
    matrices, rewards = case
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = align([np.array(m) for m in matrices], np.array(rewards))
    finite = [r for r in result.rho if not math.isnan(r)]
    assert all(-1 - 1e-12 <= r <= 1 + 1e-12 for r in finite)
    if finite:
        # Eq. 7 as documented: the lowest index within a relative 1e-9 of the best (two bundles whose
        # satisfaction orders agree may come out of scipy as 1.0 and 0.9999999999999999)
        tolerance = 1e-9 * max(1.0, abs(max(finite)))
        assert result.rho[result.index] >= max(finite) - tolerance
        assert all(math.isnan(r) or r < max(finite) - tolerance for r in result.rho[:result.index])
    else:
        assert result.index is None


def test_rho_one_ulp_below_the_best_ties_and_the_lower_index_wins():
    """Hypothesis found it: bundles 2 and 3 order the trajectories alike, and scipy returns 1.0 for one
    and 0.9999999999999999 for the other; Eq. 7's tie rule keeps the lower index."""
    matrices = [np.zeros((3, 2)), np.zeros((3, 2)), np.array([[0.0, 0.0], [0.0, 0.5], [np.nan, np.nan]]),
                np.array([[0.0, 0.0], [0.0, 0.5], [0.0, 0.5]])]
    result = align(matrices, np.array([0.0, 1.0, 1.0]))
    assert result.rho[2] != result.rho[3] and abs(result.rho[2] - result.rho[3]) < 1e-12
    assert result.index == 2
