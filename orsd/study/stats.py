"""The study's statistics, over few seeds: standard errors, percentile bootstrap intervals
(`scipy.stats.bootstrap`), seed-paired differences and the learning statistic.

Few seeds call for intervals, not point estimates (Agarwal et al. 2021; docs/study.md). Every
interval here is a 95 % percentile bootstrap with a fixed generator, so a report rebuilt from the
same records prints the same numbers. With fewer than two values there is nothing to resample:
the interval is (nan, nan), written as null / "–".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

#: resamples of every bootstrap: the interval's ends then move by well under 0.01 between generators
RESAMPLES = 10_000
CONFIDENCE = 0.95
#: steps averaged at each end of a run by the learning statistic (issue 57: last 5 minus first 5)
WINDOW = 5


@dataclass
class Interval:
    """A mean with its standard error and 95 % bootstrap interval over `n` values of `unit`."""

    mean: float
    se: float
    low: float
    high: float
    n: int
    unit: str

    def as_dict(self) -> dict:
        return {key: finite(value) for key, value in asdict(self).items()}


def finite(value):
    """JSON has no NaN or infinity: they are written as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _values(values) -> np.ndarray:
    array = np.asarray(list(values), dtype=float)
    if array.ndim != 1:
        raise ValueError(f"expected a flat sequence of numbers, got shape {array.shape}")
    return array[np.isfinite(array)]


def standard_error(values) -> float:
    """Standard error of the mean (sample standard deviation / √n, ddof = 1); nan below 2 values."""
    array = _values(values)
    return float(stats.sem(array)) if len(array) >= 2 else math.nan


def n_standard_errors(mean: float, se: float) -> float:
    """How many standard errors `mean` lies from 0: ±inf for a nonzero mean with no spread, nan for 0 / 0."""
    if not (math.isfinite(mean) and math.isfinite(se)):
        return math.nan
    if se == 0:
        return math.nan if mean == 0 else math.copysign(math.inf, mean)
    return mean / se


def _bootstrap(samples: tuple[np.ndarray, ...], statistic, seed: int) -> tuple[float, float]:
    if any(len(sample) < 2 for sample in samples):
        return math.nan, math.nan
    if all(np.ptp(sample) == 0 for sample in samples):  # scipy warns on a degenerate distribution
        value = float(statistic(*samples, axis=-1))
        return value, value
    result = stats.bootstrap(samples, statistic, confidence_level=CONFIDENCE, n_resamples=RESAMPLES,
                             method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def _mean_difference(x, y, axis=-1):
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def bootstrap_mean(values, unit: str = "seeds", seed: int = 0) -> Interval:
    """Mean of `values` with its standard error and the percentile bootstrap interval, resampling the values."""
    array = _values(values)
    mean = float(array.mean()) if len(array) else math.nan
    low, high = _bootstrap((array,), _mean, seed)
    return Interval(mean, standard_error(array), low, high, len(array), unit)


def bootstrap_difference(a, b, unit: str = "episodes", seed: int = 0) -> Interval:
    """mean(a) − mean(b) for two independent samples, each resampled on its own; the standard error
    is √(se_a² + se_b²) (Welch's)."""
    x, y = _values(a), _values(b)
    mean = float(x.mean() - y.mean()) if len(x) and len(y) else math.nan
    se = math.hypot(standard_error(x), standard_error(y))
    low, high = _bootstrap((x, y), _mean_difference, seed)
    return Interval(mean, se, low, high, min(len(x), len(y)), unit)


def paired(a: dict, b: dict) -> tuple[list, list[float]]:
    """Seeds present (and finite) in both, sorted, and a − b per seed: the same seed samples the
    same tasks from the same initial policy, so the difference cancels what the seeds share."""
    seeds = sorted(s for s in a.keys() & b.keys() if is_number(a[s]) and is_number(b[s]))
    return seeds, [float(a[s]) - float(b[s]) for s in seeds]


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def paired_difference(a: dict, b: dict, seed: int = 0) -> Interval:
    """Mean over seeds of a − b (paired by seed), its standard error and bootstrap interval over seeds."""
    _, differences = paired(a, b)
    return bootstrap_mean(differences, unit="seeds (paired)", seed=seed)


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
