"""rliable's aggregate estimates (Agarwal et al. 2021): the interquartile mean and the probability of
improvement, each with its stratified-bootstrap interval, made reproducible.

Scores are a matrix [runs, tasks]. rliable's bootstrap resamples runs *within each task column*
(stratified) and never resamples the columns, so the columns are the caller's choice: one per
held-out task gives runs × tasks resampled values; a single column when each seed has one scalar
(e.g. its held-out mean) makes the bootstrap a plain one over seeds. Resampling n runs shrinks the
variance of a mean by (n − 1)/n in every column however many columns there are, so `reliable` is
true only from `stats.MIN_BOOTSTRAP_UNITS` runs on: below that the interval undercovers and must not
be labelled 95 %.

Reproducibility: rliable 1.2.0 draws its resample indices with `np.random.choice`, numpy's global
generator (`StratifiedBootstrap.update_indices`), and ignores `random_state` for them (arch ≥ 6
also deprecates that argument). So each call seeds the global generator with `seed` and gives the
caller's global state back afterwards: the same scores and seed print the same interval. Not
thread-safe, as nothing that uses numpy's global generator is.

rliable is imported on first use (`_rliable`), with arch's numba switched off: arch would import
numba, and llvmlite's objects in `sys.modules` break vLLM's in-process kernel dispatcher, which scans
every loaded module (its engine failed to start in any process that had imported rliable: the
tests, a notebook). The bootstrap used here needs no JIT and gives the same numbers without it.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass

import numpy as np

from .stats import CONFIDENCE, MIN_BOOTSTRAP_UNITS, RESAMPLES, finite


@dataclass
class Estimate:
    """An aggregate `statistic` of a [runs, tasks] score matrix, with rliable's stratified-bootstrap
    percentile interval [low, high] at `confidence` (`reps` resamples, global numpy seed `seed`).
    `runs` is the fewest runs of any input; below 2 the interval is nan; `reliable` is
    runs >= stats.MIN_BOOTSTRAP_UNITS (see the module's docstring)."""

    statistic: str
    point: float
    low: float
    high: float
    runs: int
    tasks: int
    reliable: bool
    confidence: float = CONFIDENCE
    reps: int = RESAMPLES
    seed: int = 0
    method: str = "stratified-bootstrap percentile (rliable)"

    def as_dict(self) -> dict:
        return {key: finite(value) for key, value in asdict(self).items()}


def _rliable():
    """(rliable.library, rliable.metrics), imported with ARCH_DISABLE_NUMBA set (see the module's
    docstring) unless the caller set it."""
    os.environ.setdefault("ARCH_DISABLE_NUMBA", "1")
    from rliable import library, metrics

    return library, metrics


@contextlib.contextmanager
def seeded_global_numpy(seed: int):
    """Seed numpy's global generator for the block (rliable draws from it) and put the caller's
    state back afterwards."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _matrix(name: str, scores) -> np.ndarray:
    array = np.asarray(scores, dtype=float)
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"{name}: expected a 2-D array [runs, tasks] (one column per task, or scores[:, None] "
                         f"for one value per run), got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: expected finite scores; drop the runs without a value first")
    return array


def _check(reps: int, seed: int, confidence: float) -> None:
    if not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps: expected a positive integer, got {reps!r}")
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed: expected an integer in [0, 2**32), got {seed!r}")
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ValueError(f"confidence: expected a number in (0, 1), got {confidence!r}")


def _iqm(scores: np.ndarray) -> np.ndarray:
    return np.array([_rliable()[1].aggregate_iqm(scores)])


def iqm_interval(scores, reps: int = RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE) -> Estimate:
    """Interquartile mean of all scores (25 % trimmed from each end: `rliable.metrics.aggregate_iqm`,
    i.e. `scipy.stats.trim_mean(…, 0.25)` over the flattened matrix) with its stratified-bootstrap
    percentile interval (`rliable.library.get_interval_estimates`, runs resampled within tasks)."""
    matrix = _matrix("scores", scores)
    _check(reps, seed, confidence)
    library, metrics = _rliable()
    runs, tasks = matrix.shape
    point = float(metrics.aggregate_iqm(matrix))
    low = high = math.nan
    if runs >= 2:
        with seeded_global_numpy(seed):
            _, intervals = library.get_interval_estimates({"iqm": matrix}, _iqm, reps=reps,
                                                          confidence_interval_size=confidence)
        low, high = (float(v) for v in np.ravel(intervals["iqm"]))
    return Estimate("IQM", point, low, high, runs, tasks, runs >= MIN_BOOTSTRAP_UNITS, confidence, reps, seed)


#: resamples for the probability of improvement: each one runs a Mann–Whitney test per task column,
#: so it costs far more than the IQM's; rliable's own examples use 2,000 for it
IMPROVEMENT_RESAMPLES = 2_000


def probability_of_improvement(x, y, reps: int = IMPROVEMENT_RESAMPLES, seed: int = 0,
                               confidence: float = CONFIDENCE) -> Estimate:
    """P(X > Y): per task, the Mann–Whitney probability that a run of `x` scores above a run of `y`
    (ties count one half), averaged over tasks (`rliable.metrics.probability_of_improvement`), with
    its stratified-bootstrap percentile interval (`get_interval_estimates` over the pair, x's and
    y's runs resampled independently within each task). It compares the two sets of runs as
    independent samples: pairing by seed is not used."""
    first, second = _matrix("x", x), _matrix("y", y)
    if first.shape[1] != second.shape[1]:
        raise ValueError(f"y: expected the same number of task columns as x ({first.shape[1]}), got {second.shape[1]}")
    _check(reps, seed, confidence)
    library, metrics = _rliable()
    runs, tasks = min(len(first), len(second)), first.shape[1]
    point = float(metrics.probability_of_improvement(first, second))
    low = high = math.nan
    if runs >= 2:
        with seeded_global_numpy(seed):
            _, intervals = library.get_interval_estimates({"pair": [first, second]},
                                                          metrics.probability_of_improvement, reps=reps,
                                                          confidence_interval_size=confidence)
        low, high = (float(v) for v in np.ravel(intervals["pair"]))
    return Estimate("P(X > Y)", point, low, high, runs, tasks, runs >= MIN_BOOTSTRAP_UNITS, confidence, reps, seed)
