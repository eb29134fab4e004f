"""orsd.study.stats pinned twice on fixed inputs: against scipy's or statsmodels' own result computed
here, and against a value known without them (a closed form, a t-table quantile, a binomial
argument, Holm's step-down by hand, the noncentral t)."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from orsd.study import stats

GRPO_GAINS = [0.108, 0.037, 0.075]  # issue 66: GRPO's learning statistic over three seeds
T_975_DF2 = 4.302652729749464  # the t table's 97.5 % point with 2 degrees of freedom
ARM = {0: 0.31, 1: 0.18, 2: 0.27, 3: 0.22, 4: 0.35}
BASE = {0: 0.30, 1: 0.19, 2: 0.25, 3: 0.23, 4: 0.33}  # differences 0.01, −0.01, 0.02, −0.01, 0.02


def test_standard_error_of_one_to_four():
    # sample variance of 1..4 is 5/3; SE = sqrt(5/3) / sqrt(4)
    assert stats.standard_error([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3) / 2)
    assert math.isnan(stats.standard_error([3.0]))
    assert stats.standard_error([1, None, 2, 3, 4, float("nan")]) == pytest.approx(0.6454972)  # nulls skipped


def test_t_interval_of_grpo_gains_matches_scipy_and_the_t_table():
    interval = stats.t_interval(GRPO_GAINS)
    mean, se = np.mean(GRPO_GAINS), scipy_stats.sem(GRPO_GAINS)
    assert (interval.low, interval.high) == pytest.approx(scipy_stats.t.interval(0.95, 2, loc=mean, scale=se))
    # by hand: sd = 0.035529, se = 0.020513, half width = 4.3027 · se = 0.08826
    assert (interval.low, interval.high) == pytest.approx((mean - T_975_DF2 * se, mean + T_975_DF2 * se))
    assert (interval.low, interval.high) == pytest.approx((-0.01493, 0.16159), abs=1e-5)
    assert interval.se == pytest.approx(0.0205129, abs=1e-7)
    assert (interval.n, interval.df, interval.unit, interval.method) == (3, 2, "seeds", "student-t")
    # with df = 2 the t distribution has a closed form: P(|T| > t) = 1 − t / √(2 + t²)
    t = mean / se
    assert interval.p_value == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert interval.p_value == pytest.approx(scipy_stats.ttest_1samp(GRPO_GAINS, 0).pvalue)
    assert interval.p_value == pytest.approx(0.0701, abs=1e-4)


def test_t_interval_at_another_confidence():
    values = [0.2, 0.5, 0.1, 0.4, 0.3]
    interval = stats.t_interval(values, confidence=0.9)
    expected = scipy_stats.t.interval(0.9, 4, loc=0.3, scale=scipy_stats.sem(values))
    assert (interval.low, interval.high) == pytest.approx(expected) and interval.confidence == 0.9
    # sd of 0.1..0.5 is √0.025; the t table's 95 % point at df 4 is 2.131847
    assert interval.high - interval.mean == pytest.approx(2.131847 * math.sqrt(0.025 / 5), rel=1e-6)
    with pytest.raises(ValueError, match="confidence"):
        stats.t_interval(values, confidence=95)


def test_t_interval_edge_cases():
    empty = stats.t_interval([])
    assert empty.n == 0 and all(math.isnan(v) for v in (empty.mean, empty.se, empty.low, empty.high, empty.p_value))
    one = stats.t_interval([0.7])
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high) and math.isnan(one.df)
    assert one.as_dict() == {"mean": 0.7, "se": None, "low": None, "high": None, "n": 1, "unit": "seeds",
                             "method": "student-t", "confidence": 0.95, "df": None, "p_value": None}
    constant = stats.t_interval([0.4, 0.4, 0.4])
    assert (constant.low, constant.high) == pytest.approx((0.4, 0.4)) and constant.low == constant.high
    assert (constant.se, constant.p_value) == (0.0, 0.0)
    assert math.isnan(stats.t_interval([0.0, 0.0]).p_value)  # 0 / 0: no evidence either way
    skipped = stats.t_interval([0.108, None, 0.037, float("nan"), 0.075])
    assert skipped == stats.t_interval(GRPO_GAINS) and skipped.n == 3  # nulls and NaNs are skipped


def test_paired_differences_match_seeds_and_drop_the_unpaired():
    a = {0: 1.0, 1: 2.0, 2: 3.0, 5: 9.0}
    b = {2: 5.0, 0: 0.0, 1: 1.0, 3: 4.0, 5: None}
    assert stats.paired(a, b) == ([0, 1, 2], [1.0, 1.0, -2.0])
    difference = stats.paired_t(a, b)
    assert difference.seeds == [0, 1, 2] and difference.differences == [1.0, 1.0, -2.0]
    # differences [1, 1, −2]: mean 0, sd √3, se 1, so the interval is ±t(0.975, 2) and p = 1
    assert (difference.mean, difference.sd, difference.se) == pytest.approx((0.0, math.sqrt(3), 1.0))
    assert (difference.low, difference.high) == pytest.approx((-T_975_DF2, T_975_DF2))
    assert difference.p_value == pytest.approx(1.0) and difference.n == 3 and difference.df == 2
    assert difference.method == "paired student-t" and difference.unit == "seeds (paired)"


def test_paired_t_agrees_with_ttest_rel_and_ttest_1samp():
    a = {0: 0.31, 1: 0.18, 2: 0.27, 3: 0.22, 4: 0.35}
    b = {0: 0.25, 1: 0.17, 2: 0.20, 3: 0.24, 4: 0.26}
    difference = stats.paired_t(a, b)
    x, y = np.array(list(a.values())), np.array(list(b.values()))
    related, one_sample = scipy_stats.ttest_rel(x, y), scipy_stats.ttest_1samp(x - y, 0)
    assert related.pvalue == pytest.approx(one_sample.pvalue)
    assert difference.p_value == pytest.approx(related.pvalue)
    assert (difference.low, difference.high) == pytest.approx(tuple(related.confidence_interval(0.95)))
    assert difference.sd == pytest.approx(np.std(x - y, ddof=1))


def test_paired_t_edge_cases():
    assert stats.paired_t({}, {0: 1.0}).n == 0
    single = stats.paired_t({0: 0.5, 1: 0.2}, {0: 0.25})
    assert single.n == 1 and single.mean == 0.25 and math.isnan(single.low) and math.isnan(single.sd)
    shift = stats.paired_t({0: 0.5, 1: 0.75, 2: 1.0}, {0: 0.0, 1: 0.25, 2: 0.5})  # a constant shift
    assert (shift.mean, shift.low, shift.high, shift.se, shift.sd, shift.p_value) == (0.5, 0.5, 0.5, 0.0, 0.0, 0.0)
    assert stats.paired_difference({0: 0.5, 1: 0.9}, {0: 0.25, 1: 0.3}) == stats.paired_t({0: 0.5, 1: 0.9},
                                                                                           {0: 0.25, 1: 0.3})


def test_few_values_are_not_bootstrapped():
    # a percentile bootstrap over three seeds is [min, max]; the t interval is returned instead
    interval = stats.bootstrap_mean(GRPO_GAINS, "seeds")
    assert interval == stats.t_interval(GRPO_GAINS, unit="seeds") and interval.method == "student-t"
    assert interval.low < min(GRPO_GAINS) and interval.high > max(GRPO_GAINS)
    assert stats.MIN_BOOTSTRAP_UNITS == 10
    assert stats.bootstrap_mean([0.2] * 9 + [0.3]).method == "percentile-bootstrap"


def test_bootstrap_mean_matches_scipy_and_the_binomial():
    values = [0.1, 0.5, 0.2, 0.9, 0.35, 0.6, 0.05, 0.45, 0.7, 0.3, 0.25, 0.8]
    interval = stats.bootstrap_mean(values, "episodes", seed=3)
    direct = scipy_stats.bootstrap((np.array(values),), np.mean, n_resamples=stats.RESAMPLES, method="percentile",
                                   confidence_level=0.95, rng=np.random.default_rng(3)).confidence_interval
    assert (interval.low, interval.high) == (direct.low, direct.high)
    assert interval == stats.bootstrap_mean(values, "episodes", seed=3)  # reproducible
    assert (interval.method, interval.n, interval.unit) == ("percentile-bootstrap", 12, "episodes")
    # resampled means of one success in ten are k/10 with k ~ Binomial(10, 0.1): P(k = 0) = 0.35 puts
    # the 2.5 % point at 0; P(k <= 2) = 0.930 and P(k <= 3) = 0.987 put the 97.5 % point at 0.3
    rare = stats.bootstrap_mean([0] * 9 + [1], "episodes")
    assert (rare.low, rare.high) == (0.0, 0.3) and rare.mean == 0.1
    constant = stats.bootstrap_mean([0.4] * 12)
    assert (constant.low, constant.high) == pytest.approx((0.4, 0.4)) and constant.low == constant.high


def test_bootstrap_difference_matches_scipy_and_welch():
    x, y = [0, 1, 2, 3], [0, 0, 1]
    welch = stats.bootstrap_difference(x, y)  # under 10 values: Welch's t interval
    direct = scipy_stats.ttest_ind(x, y, equal_var=False)
    assert (welch.low, welch.high) == pytest.approx(tuple(direct.confidence_interval(0.95)))
    # the Welch–Satterthwaite degrees of freedom by hand: v = var/n per sample
    vx, vy = np.var(x, ddof=1) / 4, np.var(y, ddof=1) / 3
    df = (vx + vy) ** 2 / (vx**2 / 3 + vy**2 / 2)
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(vx + vy)
    assert welch.df == pytest.approx(df) and welch.se == pytest.approx(math.sqrt(vx + vy))
    assert (welch.low, welch.high) == pytest.approx((1.5 - 1 / 3 - half, 1.5 - 1 / 3 + half))
    assert welch.method == "welch-t" and welch.p_value == pytest.approx(direct.pvalue)
    assert math.isnan(stats.bootstrap_difference([0, 1], [1]).low)
    many, none = [0] * 9 + [1], [0] * 10
    spread = stats.bootstrap_difference(many, none, seed=1)
    assert (spread.low, spread.high) == (0.0, 0.3)  # the second never moves: the binomial argument above
    direct = scipy_stats.bootstrap((np.array(many, float), np.array(none, float)),
                                   lambda a, b, axis: np.mean(a, axis) - np.mean(b, axis), n_resamples=stats.RESAMPLES,
                                   method="percentile", rng=np.random.default_rng(1)).confidence_interval
    assert (spread.low, spread.high) == (direct.low, direct.high) and spread.method == "percentile-bootstrap"


def test_holm_matches_statsmodels_and_the_step_down():
    pvalues = {"orsd": 0.01, "oracle": 0.04, "sft": 0.03, "rubric": 0.005}
    adjusted = stats.holm(pvalues)
    reject, expected, _, _ = multipletests(list(pvalues.values()), alpha=0.05, method="holm")
    assert [a.p_value for a in adjusted.values()] == pytest.approx(list(expected))
    assert [a.reject for a in adjusted.values()] == list(reject)
    # by hand: sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, then max(0.06, 0.04·1) = 0.06
    assert {label: a.p_value for label, a in adjusted.items()} == pytest.approx(
        {"orsd": 0.03, "oracle": 0.06, "sft": 0.06, "rubric": 0.02})
    assert {label: a.reject for label, a in adjusted.items()} == {"orsd": True, "oracle": False, "sft": False,
                                                                  "rubric": True}
    assert list(adjusted) == list(pvalues)


def test_holm_leaves_missing_p_values_out_of_the_family():
    adjusted = stats.holm({"a": 0.01, "b": math.nan, "c": 0.04, "d": None}, alpha=0.05)
    assert (adjusted["a"].p_value, adjusted["c"].p_value) == pytest.approx((0.02, 0.04))  # a family of two
    assert math.isnan(adjusted["b"].p_value) and not adjusted["b"].reject
    assert math.isnan(adjusted["d"].p_value) and not adjusted["d"].reject
    assert stats.holm({}) == {}
    with pytest.raises(ValueError, match="pvalues\\['a'\\]"):
        stats.holm({"a": 1.5})
    with pytest.raises(ValueError, match="alpha"):
        stats.holm({"a": 0.1}, alpha=5)


def test_tost_matches_statsmodels_and_the_two_one_sided_tests():
    equivalence = stats.tost_paired(ARM, BASE, margin=0.05, alpha=0.05)
    x, y = np.array(list(ARM.values())), np.array(list(BASE.values()))
    assert equivalence.p_value == pytest.approx(ttost_paired(x, y, -0.05, 0.05)[0])
    # by hand: t against each bound, one-sided, df = 4; the TOST's p is the larger one
    d = x - y
    mean, se = d.mean(), d.std(ddof=1) / math.sqrt(5)
    p_low, p_high = scipy_stats.t.sf((mean + 0.05) / se, 4), scipy_stats.t.cdf((mean - 0.05) / se, 4)
    assert equivalence.p_value == pytest.approx(max(p_low, p_high))
    assert equivalence.passed and equivalence.n == 5 and equivalence.mean == pytest.approx(0.006)
    narrow = stats.tost_paired(ARM, BASE, margin=0.01)
    assert not narrow.passed and narrow.p_value > 0.05  # the mean 0.006 is too close to the bound 0.01


def test_tost_edge_cases():
    assert math.isnan(stats.tost_paired({0: 0.1}, {0: 0.1}).p_value)
    assert not stats.tost_paired({0: 0.1}, {0: 0.1}).passed
    # differences exactly constant (binary fractions): sd = 0, so the t statistics are infinite
    inside = stats.tost_paired({0: 0.5625, 1: 0.6875}, {0: 0.5, 1: 0.625}, margin=0.1)  # 0.0625 each
    assert (inside.p_value, inside.passed) == (0.0, True)
    outside = stats.tost_paired({0: 0.75, 1: 0.875}, {0: 0.5, 1: 0.625}, margin=0.1)  # 0.25 each
    assert (outside.p_value, outside.passed) == (1.0, False)
    with pytest.raises(ValueError, match="margin"):
        stats.tost_paired(ARM, BASE, margin=-0.1)


@pytest.mark.parametrize("n", [2, 3, 8, 20])
def test_minimum_detectable_difference_matches_statsmodels_and_the_noncentral_t(n):
    sd = 0.09
    mdd = stats.minimum_detectable_difference(sd, n)
    effect = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert mdd == pytest.approx(effect * sd)
    # by hand: a paired t-test rejects when |T| > t(0.975, n − 1), and T ~ noncentral t(n − 1, δ√n/sd)
    critical, shift = scipy_stats.t.ppf(0.975, n - 1), mdd / sd * math.sqrt(n)
    power = scipy_stats.nct.sf(critical, n - 1, shift) + scipy_stats.nct.cdf(-critical, n - 1, shift)
    assert power == pytest.approx(0.8, abs=1e-6)


def test_minimum_detectable_difference_tends_to_the_normal_formula():
    # large n: (z_{0.975} + z_{0.8}) · sd / √n = (1.959964 + 0.841621) · sd / √n
    assert stats.minimum_detectable_difference(1.0, 400) == pytest.approx(2.801585 / 20, rel=3e-3)


def test_minimum_detectable_difference_edge_cases():
    assert math.isnan(stats.minimum_detectable_difference(0.1, 1))
    assert math.isnan(stats.minimum_detectable_difference(math.nan, 5))
    assert stats.minimum_detectable_difference(0.0, 5) == 0.0
    with pytest.raises(ValueError, match="power"):
        stats.minimum_detectable_difference(0.1, 5, power=80)

def test_decide():
    assert stats.decide(0.1, True, False, 0.05) == "better"
    assert stats.decide(-0.1, True, False, 0.05) == "worse"
    assert stats.decide(0.1, False, False, 0.05) == "not decided"  # e.g. Holm did not pass
    assert stats.decide(0.01, False, True, 0.05) == "equivalent within ±0.05"
    assert stats.decide(0.01, True, True, 0.05) == "better"  # a rejection wins
    assert stats.decide(None, True, False, 0.05) == "not decided"


def test_the_decision_of_three_arms():
    # the pieces composed as the report does: one Holm family over the arms' paired t-tests
    values = {"orsd": ARM, "oracle": {s: v + 0.2 + 0.01 * s for s, v in BASE.items()}, "broken": {0: 0.1}}
    differences = {arm: stats.paired_t(v, BASE) for arm, v in values.items()}
    adjusted = stats.holm({arm: d.p_value for arm, d in differences.items()})
    decisions = {arm: stats.decide(differences[arm].mean, adjusted[arm].reject,
                                   stats.tost_paired(values[arm], BASE).passed, 0.05) for arm in values}
    assert decisions == {"orsd": "equivalent within ±0.05", "oracle": "better", "broken": "not decided"}
    assert adjusted["oracle"].p_value == pytest.approx(2 * differences["oracle"].p_value)  # a family of two


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


def test_a_flat_sequence_is_required():
    with pytest.raises(ValueError, match="values: expected a flat sequence"):
        stats.t_interval([[1, 2], [3, 4]])
