"""orsd.study.stats pinned on inputs whose answer is known in closed form, not recomputed here by
calling scipy the same way: a percentile bootstrap of the mean can only return means of resamples,
and for tiny samples their distribution is a binomial one can write down."""

import math

import numpy as np
import pytest

from orsd.study import stats


def test_standard_error_of_one_to_four():
    # sample variance of 1..4 is 5/3; SE = sqrt(5/3) / sqrt(4)
    assert stats.standard_error([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3) / 2)
    assert stats.standard_error([1, 2, 3, 4]) == pytest.approx(0.6454972)
    assert math.isnan(stats.standard_error([3.0]))
    assert stats.standard_error([1, None, 2, 3, 4, float("nan")]) == pytest.approx(0.6454972)  # nulls skipped


def test_constant_data_gives_a_zero_width_interval():
    interval = stats.bootstrap_mean([0.4, 0.4, 0.4])
    assert (interval.mean, interval.low, interval.high) == (pytest.approx(0.4),) * 3
    assert interval.se == pytest.approx(0.0, abs=1e-12)
    assert interval.n == 3 and interval.unit == "seeds"


def test_two_values_span_the_whole_range():
    # resampled means of [0, 1]: 0 (p 1/4), 1/2 (1/2), 1 (1/4): the 2.5 % and 97.5 % points are 0 and 1
    interval = stats.bootstrap_mean([0.0, 1.0])
    assert (interval.low, interval.high) == (0.0, 1.0)


def test_one_success_in_four_episodes():
    # resampled means of [0, 0, 0, 1] are k/4 with k ~ Binomial(4, 1/4): P(k <= 2) = 0.949 and
    # P(k <= 3) = 0.996, so the 97.5 % point is 3/4, and P(k = 0) = 0.316 puts the 2.5 % point at 0
    interval = stats.bootstrap_mean([0, 0, 0, 1], unit="episodes")
    assert (interval.low, interval.high) == (0.0, 0.75)
    assert interval.mean == 0.25 and interval.unit == "episodes"


def test_three_seeds_reach_their_extremes():
    # each extreme of three values is a resampled mean with probability 1/27 = 3.7 % > 2.5 %
    interval = stats.bootstrap_mean([0.0, 0.25, 0.5])
    assert (interval.low, interval.high) == (0.0, 0.5)


def test_the_interval_is_the_same_every_time():
    values = [0.1, 0.5, 0.2, 0.9, 0.35]
    first, second = stats.bootstrap_mean(values), stats.bootstrap_mean(values)
    assert (first.low, first.high) == (second.low, second.high)
    assert first.low < first.mean < first.high


def test_fewer_than_two_values_give_no_interval():
    interval = stats.bootstrap_mean([0.7])
    assert interval.mean == 0.7 and math.isnan(interval.low) and math.isnan(interval.high)
    assert interval.as_dict() == {"mean": 0.7, "se": None, "low": None, "high": None, "n": 1, "unit": "seeds"}


def test_paired_differences_match_seeds_and_drop_the_unpaired():
    a = {0: 1.0, 1: 2.0, 2: 3.0, 5: 9.0}
    b = {2: 5.0, 0: 0.0, 1: 1.0, 3: 4.0, 5: None}
    assert stats.paired(a, b) == ([0, 1, 2], [1.0, 1.0, -2.0])
    difference = stats.paired_difference(a, b)
    assert difference.mean == pytest.approx(0.0) and difference.n == 3
    assert difference.se == pytest.approx(math.sqrt(3) / math.sqrt(3))  # sd of [1, 1, -2] is sqrt(3)
    assert (difference.low, difference.high) == (-2.0, 1.0)  # the extremes, as above


def test_a_constant_paired_shift_is_exact():
    difference = stats.paired_difference({0: 0.5, 1: 0.75, 2: 1.0}, {0: 0.0, 1: 0.25, 2: 0.5})
    assert (difference.mean, difference.low, difference.high, difference.se) == (0.5, 0.5, 0.5, 0.0)


def test_independent_difference():
    same = stats.bootstrap_difference([1, 1, 1], [0, 0])
    assert (same.mean, same.low, same.high) == (1.0, 1.0, 1.0)
    # mean([0, 1]) − mean([0, 0, 0]): the first resamples to 0, 1/2, 1, the second is always 0
    spread = stats.bootstrap_difference([0, 1], [0, 0, 0])
    assert (spread.mean, spread.low, spread.high) == (0.5, 0.0, 1.0)
    assert spread.se == pytest.approx(stats.standard_error([0, 1]))


def test_learning_gain_windows():
    assert stats.learning_gain([0] * 5 + [1] * 5) == 1.0
    assert stats.learning_gain([0.1 * step for step in range(1, 11)]) == pytest.approx(0.5)  # 0.1 × (8 − 3)
    assert stats.learning_gain([0, 1, 2, 3, 4, 5], window=5) == pytest.approx(1.0)  # windows overlap: 3 − 2
    assert stats.learning_gain([0.3]) == 0.0
    assert stats.learning_gain([0, None, 1], window=1) == 1.0
    assert math.isnan(stats.learning_gain([]))


def test_standard_errors_from_zero():
    assert stats.n_standard_errors(1.0, 0.5) == 2.0
    assert stats.n_standard_errors(-1.0, 0.0) == -math.inf
    assert math.isnan(stats.n_standard_errors(0.0, 0.0))
    assert math.isnan(stats.n_standard_errors(1.0, math.nan))


def test_episode_outcomes():
    outcomes = stats.episode_outcomes({"success_rate": 0.375, "num_episodes": 8})
    assert outcomes.tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert stats.episode_outcomes({"success_rate": 0.0, "num_episodes": 0}).size == 0
    assert np.mean(stats.episode_outcomes({"success_rate": 1 / 3, "num_episodes": 3})) == pytest.approx(1 / 3)
