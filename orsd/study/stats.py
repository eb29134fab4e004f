"""The study's statistics over few seeds, from kept libraries (issue 66).

Few seeds call for intervals (Agarwal et al. 2021), and those intervals must cover what they say:
a 95 % percentile bootstrap over 3 seeds is about [min, max] and covers ~75 %. So every interval
over seeds here is Student-t (`scipy.stats`), and a percentile bootstrap is used only over at
least `MIN_BOOTSTRAP_UNITS` units (episodes); below that the t interval is returned instead and
`Interval.method` says which one was computed. Arms are compared with the baseline by a paired
t-test over seeds, Holm-adjusted across the study's arms, "no difference" is said only when a
paired TOST passes, and the minimum detectable difference tells what the study could have seen
(`statsmodels`). rliable's IQM and probability of improvement live in `orsd.study.aggregates`,
which imports rliable (and its arch and pandas) and this module, never the other way. With fewer than two values there is no interval: its ends are nan, written as null / "–".
Higher values are taken to be better.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

#: resamples of every bootstrap: the interval's ends then move by well under 0.01 between generators
RESAMPLES = 10_000
CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8
#: the default equivalence margin of issue 66 (`orsd-study --margin`)
MARGIN = 0.05
#: fewest units a percentile bootstrap may resample: it estimates the variance of a mean as
#: (n − 1)/n of the unbiased one and ignores the t quantile, so below ~10 units it undercovers
MIN_BOOTSTRAP_UNITS = 10
#: steps averaged at each end of a run by the learning statistic (issue 57: last 5 minus first 5)
WINDOW = 5


@dataclass
class Interval:
    """A mean over `n` values of `unit`, its standard error and a `confidence` interval [low, high].

    `method` is "student-t" (one-sample t; `df` = n − 1 and `p_value` is the two-sided t-test of
    mean = 0), "welch-t" (difference of two independent means; Welch's df) or
    "percentile-bootstrap" (no df or p-value: nan)."""

    mean: float
    se: float
    low: float
    high: float
    n: int
    unit: str
    method: str = "student-t"
    confidence: float = CONFIDENCE
    df: float = math.nan
    p_value: float = math.nan

    def as_dict(self) -> dict:
        return {key: finite(value) for key, value in asdict(self).items()}


@dataclass
class Paired(Interval):
    """A seed-paired difference a − b: the Student-t interval of the per-seed differences, with the
    seeds present in both, the differences themselves and their standard deviation (ddof = 1)."""

    seeds: list = field(default_factory=list)
    differences: list = field(default_factory=list)
    sd: float = math.nan


def finite(value):
    """JSON has no NaN or infinity: they are written as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _values(values) -> np.ndarray:
    array = np.asarray(list(values), dtype=float)
    if array.ndim != 1:
        raise ValueError(f"values: expected a flat sequence of numbers, got shape {array.shape}")
    return array[np.isfinite(array)]


def _check_probability(name: str, value) -> None:
    if not (is_number(value) and 0 < value < 1):
        raise ValueError(f"{name}: expected a number in (0, 1), got {value!r}")


def _check_confidence(confidence: float) -> None:
    _check_probability("confidence", confidence)


def standard_error(values) -> float:
    """Standard error of the mean (sample standard deviation / √n, ddof = 1, `scipy.stats.sem`);
    non-finite values are skipped; nan below 2 values."""
    array = _values(values)
    return float(stats.sem(array)) if len(array) >= 2 else math.nan


def n_standard_errors(mean: float, se: float) -> float:
    """How many standard errors `mean` lies from 0: ±inf for a nonzero mean with no spread, nan for 0 / 0."""
    if not (math.isfinite(mean) and math.isfinite(se)):
        return math.nan
    if se == 0:
        return math.nan if mean == 0 else math.copysign(math.inf, mean)
    return mean / se


def t_interval(values, confidence: float = CONFIDENCE, unit: str = "seeds") -> Interval:
    """Mean of `values` (non-finite ones skipped) with its Student-t `confidence` interval
    (mean ± t_{(1+c)/2, n−1} · se) and the two-sided one-sample t-test of mean = 0, both from
    `scipy.stats.ttest_1samp`. n < 2: the interval, se, df and p-value are nan. Identical values
    (sd = 0): a zero-width interval at the mean, p = 0 if the mean is nonzero and nan if it is 0
    (the limits of the t statistic; scipy would warn of catastrophic cancellation)."""
    _check_confidence(confidence)
    array = _values(values)
    n = len(array)
    mean = float(array.mean()) if n else math.nan
    if n < 2:
        return Interval(mean, math.nan, math.nan, math.nan, n, unit, "student-t", confidence)
    if np.ptp(array) == 0:
        return Interval(mean, 0.0, mean, mean, n, unit, "student-t", confidence, n - 1,
                        math.nan if mean == 0 else 0.0)
    result = stats.ttest_1samp(array, 0.0)
    ci = result.confidence_interval(confidence)
    return Interval(mean, standard_error(array), float(ci.low), float(ci.high), n, unit, "student-t",
                    confidence, int(result.df), float(result.pvalue))


def welch_interval(a, b, confidence: float = CONFIDENCE, unit: str = "episodes") -> Interval:
    """mean(a) − mean(b) for two independent samples with Welch's t interval and test
    (`scipy.stats.ttest_ind(equal_var=False)`); se = √(se_a² + se_b²). Either sample below 2
    values: nan interval. Both constant: a zero-width interval (p as in `t_interval`)."""
    _check_confidence(confidence)
    x, y = _values(a), _values(b)
    mean = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    n = min(len(x), len(y))
    if n < 2:
        return Interval(mean, math.nan, math.nan, math.nan, n, unit, "welch-t", confidence)
    se = math.hypot(standard_error(x), standard_error(y))
    if se == 0:
        return Interval(mean, 0.0, mean, mean, n, unit, "welch-t", confidence, len(x) + len(y) - 2,
                        math.nan if mean == 0 else 0.0)
    result = stats.ttest_ind(x, y, equal_var=False)
    ci = result.confidence_interval(confidence)
    return Interval(mean, se, float(ci.low), float(ci.high), n, unit, "welch-t", confidence,
                    float(result.df), float(result.pvalue))


def _bootstrap(samples: tuple[np.ndarray, ...], statistic, confidence: float, seed: int) -> tuple[float, float]:
    if all(np.ptp(sample) == 0 for sample in samples):  # scipy warns on a degenerate distribution
        value = float(statistic(*samples, axis=-1))
        return value, value
    result = stats.bootstrap(samples, statistic, confidence_level=confidence, n_resamples=RESAMPLES,
                             method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def _mean_difference(x, y, axis=-1):
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def bootstrap_mean(values, unit: str = "seeds", seed: int = 0, confidence: float = CONFIDENCE) -> Interval:
    """Mean of `values` with its standard error and the percentile bootstrap interval
    (`scipy.stats.bootstrap`, `RESAMPLES` resamples, generator seeded with `seed`), resampling the
    values. Below `MIN_BOOTSTRAP_UNITS` values that interval undercovers, so the Student-t
    interval (`t_interval`) is returned instead, with method "student-t"."""
    array = _values(values)
    if len(array) < MIN_BOOTSTRAP_UNITS:
        return t_interval(array, confidence, unit)
    _check_confidence(confidence)
    low, high = _bootstrap((array,), _mean, confidence, seed)
    return Interval(float(array.mean()), standard_error(array), low, high, len(array), unit,
                    "percentile-bootstrap", confidence)


def bootstrap_difference(a, b, unit: str = "episodes", seed: int = 0, confidence: float = CONFIDENCE) -> Interval:
    """mean(a) − mean(b) for two independent samples, each resampled on its own by
    `scipy.stats.bootstrap` (percentile); the standard error is √(se_a² + se_b²). When either
    sample has fewer than `MIN_BOOTSTRAP_UNITS` values, Welch's t interval (`welch_interval`,
    method "welch-t") is returned instead."""
    x, y = _values(a), _values(b)
    if min(len(x), len(y)) < MIN_BOOTSTRAP_UNITS:
        return welch_interval(x, y, confidence, unit)
    _check_confidence(confidence)
    low, high = _bootstrap((x, y), _mean_difference, confidence, seed)
    return Interval(float(x.mean() - y.mean()), math.hypot(standard_error(x), standard_error(y)), low, high,
                    min(len(x), len(y)), unit, "percentile-bootstrap", confidence)


def paired(a: dict, b: dict) -> tuple[list, list[float]]:
    """Seeds present (and finite) in both, sorted, and a − b per seed: the same seed samples the
    same tasks from the same initial policy, so the difference cancels what the seeds share."""
    seeds = sorted(s for s in a.keys() & b.keys() if is_number(a[s]) and is_number(b[s]))
    return seeds, [float(a[s]) - float(b[s]) for s in seeds]


def paired_t(a: dict, b: dict, confidence: float = CONFIDENCE, unit: str = "seeds (paired)") -> Paired:
    """a − b paired by seed ({seed: value} each; seeds missing or non-finite in either are left
    out, see `paired`): the per-seed differences, their mean, sd, se, Student-t interval and the
    two-sided paired t-test of mean = 0 (`scipy.stats.ttest_1samp` on the differences, which is
    `scipy.stats.ttest_rel` on the pairs). Edge cases as in `t_interval`."""
    seeds, differences = paired(a, b)
    interval = t_interval(differences, confidence, unit)
    sd = float(np.std(differences, ddof=1)) if len(differences) >= 2 else math.nan
    return Paired(interval.mean, interval.se, interval.low, interval.high, interval.n, unit, "paired student-t",
                  confidence, interval.df, interval.p_value, seeds, differences, sd)


def paired_difference(a: dict, b: dict, seed: int = 0) -> Paired:
    """The seed-paired difference a − b with its Student-t 95 % interval (`paired_t`); `seed` is
    unused and kept for callers written when this was a bootstrap."""
    del seed
    return paired_t(a, b)


class Adjusted(NamedTuple):
    """A Holm-adjusted p-value and whether it rejects at the family's alpha."""

    p_value: float
    reject: bool


def holm(pvalues: dict, alpha: float = ALPHA) -> dict[str, Adjusted]:
    """Holm's step-down adjustment of `pvalues` ({label: p}) as one family, by
    `statsmodels.stats.multitest.multipletests(method="holm")`: {label: Adjusted(p, reject)} in the
    input's order. Labels whose p is nan or None are left out of the family and come back (nan, False)."""
    _check_probability("alpha", alpha)
    for label, p in pvalues.items():
        missing = p is None or (isinstance(p, float) and math.isnan(p))
        if not missing and not (is_number(p) and 0 <= p <= 1):
            raise ValueError(f"pvalues[{label!r}]: expected a p-value in [0, 1] or nan, got {p!r}")
    tested = [label for label, p in pvalues.items() if is_number(p)]
    out = {label: Adjusted(math.nan, False) for label in pvalues}
    if tested:
        reject, adjusted, _, _ = multipletests([pvalues[label] for label in tested], alpha=alpha, method="holm")
        out.update({label: Adjusted(float(p), bool(r)) for label, p, r in zip(tested, adjusted, reject)})
    return out


@dataclass
class Equivalence:
    """A paired TOST: whether the mean of a − b lies within ±margin. `p_value` is the larger of the
    two one-sided p-values; `passed` (equivalence shown) is p_value < alpha."""

    p_value: float
    passed: bool
    margin: float
    alpha: float
    n: int
    mean: float
    method: str = "paired TOST"

    def as_dict(self) -> dict:
        return {key: finite(value) for key, value in asdict(self).items()}


def tost_paired(a: dict, b: dict, margin: float = MARGIN, alpha: float = ALPHA) -> Equivalence:
    """Two one-sided paired t-tests of −margin < mean(a − b) < margin over the seeds in both (see
    `stats.paired`), by `statsmodels.stats.weightstats.ttost_paired(low=-margin, upp=margin)`.
    n < 2: p nan, not passed. Constant differences (sd = 0): p = 0 inside the margin, 1 outside,
    as statsmodels' infinite t statistics give, without its division warnings."""
    if not (is_number(margin) and margin > 0):
        raise ValueError(f"margin: expected a positive number, got {margin!r}")
    _check_probability("alpha", alpha)
    seeds, differences = paired(a, b)
    n = len(seeds)
    mean = float(np.mean(differences)) if n else math.nan
    if n < 2:
        return Equivalence(math.nan, False, margin, alpha, n, mean)
    if np.ptp(differences) == 0:
        p = 0.0 if -margin < mean < margin else 1.0
    else:
        x1 = np.array([float(a[s]) for s in seeds])
        x2 = np.array([float(b[s]) for s in seeds])
        p = float(ttost_paired(x1, x2, -margin, margin)[0])
    return Equivalence(p, p < alpha, margin, alpha, n, mean)


def minimum_detectable_difference(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The true mean paired difference that a two-sided paired t-test over `n` pairs at `alpha`
    detects with probability `power`, given the differences' standard deviation `sd`: the effect
    size from `statsmodels.stats.power.TTestPower().solve_power` (noncentral t, df = n − 1) times
    sd. nan when n < 2 or sd is not finite; 0 when sd is 0."""
    _check_probability("alpha", alpha)
    _check_probability("power", power)
    if not isinstance(n, (int, np.integer)) or n < 2 or not is_number(sd):
        return math.nan
    if sd < 0:
        raise ValueError(f"sd: expected a standard deviation >= 0, got {sd!r}")
    effect = TTestPower().solve_power(effect_size=None, nobs=int(n), alpha=alpha, power=power,
                                      alternative="two-sided")
    return float(effect) * float(sd)


def decide(mean: float | None, reject: bool, passed: bool, margin: float) -> str:
    """The verdict on arm − baseline from `mean` (the paired mean difference, `paired_t`), `reject`
    (whether its test rejects: the Holm-adjusted p < alpha for the primary family, `holm`) and
    `passed` (the paired TOST, `tost_paired`): "better" / "worse" when rejected, by the sign of the
    mean; otherwise "equivalent within ±margin" when the TOST passed; otherwise "not decided"."""
    if reject and is_number(mean) and mean != 0:
        return "better" if mean > 0 else "worse"
    if passed:
        return f"equivalent within ±{margin:g}"
    return "not decided"


def learning_gain(rewards, window: int = WINDOW) -> float:
    """Mean of the last `window` values minus the first `window` values (nulls skipped); with fewer
    than 2·window values the two windows overlap, and with one value the gain is 0."""
    array = _values(rewards)
    if not len(array):
        return math.nan
    width = min(window, len(array))
    return float(array[-width:].mean() - array[:width].mean())


def episode_outcomes(record: dict) -> np.ndarray:
    """An eval.jsonl record's episodes as 0/1 successes: success_rate × num_episodes of them won."""
    episodes = int(record.get("num_episodes") or 0)
    wins = round(float(record.get("success_rate") or 0.0) * episodes)
    return np.concatenate([np.ones(wins), np.zeros(episodes - wins)])
