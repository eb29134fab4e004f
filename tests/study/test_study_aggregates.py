"""orsd.study.aggregates pinned against rliable called directly with the same global seed, and
against values known by hand (an IQM of eight numbers, a Mann–Whitney count)."""

import warnings

import numpy as np
import pytest
from scipy import stats as scipy_stats

from orsd.study import aggregates

SCORES = np.array([[0.1, 0.9, 0.4], [0.3, 0.2, 0.8], [0.6, 0.5, 0.7], [0.0, 0.35, 0.45]])  # 4 runs × 3 tasks
REPS = 500


def _iqm(x):
    library, metrics = aggregates._rliable()  # as orsd imports it (numba off), not at collection
    return np.array([metrics.aggregate_iqm(x)])


def test_iqm_interval_matches_rliable_seeded_the_same_way():
    library, metrics = aggregates._rliable()  # as orsd imports it (numba off), not at collection
    estimate = aggregates.iqm_interval(SCORES, reps=REPS, seed=11)
    np.random.seed(11)
    _, direct = library.get_interval_estimates({"k": SCORES}, _iqm, reps=REPS)
    assert (estimate.low, estimate.high) == tuple(np.ravel(direct["k"]))
    assert estimate.low < estimate.point < estimate.high
    assert (estimate.runs, estimate.tasks, estimate.reps, estimate.seed) == (4, 3, REPS, 11)
    assert estimate.statistic == "IQM" and not estimate.reliable  # 4 runs < 10


def test_iqm_by_hand():
    # eight values: the IQM drops the two lowest (1, 2) and the two highest (7, 100): mean(3, 4, 5, 6)
    eight = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 100.0]])
    estimate = aggregates.iqm_interval(eight, reps=REPS)
    assert estimate.point == 4.5
    assert estimate.point == pytest.approx(scipy_stats.trim_mean(eight, 0.25, axis=None))
    assert aggregates.iqm_interval(SCORES, reps=REPS).point == pytest.approx(
        np.mean(np.sort(SCORES.ravel())[3:9]))  # 12 values: the middle six


def test_the_interval_is_reproducible_and_leaves_numpys_global_state_alone():
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    first = aggregates.iqm_interval(SCORES, reps=REPS, seed=5)
    assert (np.random.get_state()[1] == before).all()
    assert aggregates.iqm_interval(SCORES, reps=REPS, seed=5) == first
    assert aggregates.iqm_interval(SCORES, reps=REPS, seed=6) != first  # the seed does move the resamples


def test_rliable_ignores_random_state_for_its_resamples():
    library, metrics = aggregates._rliable()  # as orsd imports it (numba off), not at collection
    # why the module seeds numpy's global generator: rliable 1.2.0 draws indices with np.random.choice
    intervals = []
    for global_seed in (1, 2):
        np.random.seed(global_seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # arch deprecates random_state
            _, direct = library.get_interval_estimates({"k": SCORES}, _iqm, reps=REPS,
                                                       random_state=np.random.RandomState(0))
        intervals.append(tuple(np.ravel(direct["k"])))
    assert intervals[0] != intervals[1]


def test_one_column_per_seed_and_few_runs():
    column = SCORES[:, :1]  # one scalar per seed
    estimate = aggregates.iqm_interval(column, reps=REPS)
    assert estimate.tasks == 1 and estimate.point == pytest.approx(np.mean([0.1, 0.3]))  # trims 0.0 and 0.6
    single = aggregates.iqm_interval(SCORES[:1], reps=REPS)
    assert single.runs == 1 and np.isnan(single.low) and np.isnan(single.high)
    assert single.as_dict()["low"] is None
    assert aggregates.iqm_interval(np.tile(SCORES, (3, 1)), reps=50).reliable  # 12 runs


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="scores: expected a 2-D array"):
        aggregates.iqm_interval(SCORES[:, 0])
    with pytest.raises(ValueError, match="scores: expected finite"):
        aggregates.iqm_interval(np.array([[0.1], [np.nan]]))
    with pytest.raises(ValueError, match="reps"):
        aggregates.iqm_interval(SCORES, reps=0)


def test_probability_of_improvement_matches_rliable():
    library, metrics = aggregates._rliable()  # as orsd imports it (numba off), not at collection
    other = SCORES[::-1] * 0.8
    estimate = aggregates.probability_of_improvement(SCORES, other, reps=REPS, seed=2)
    np.random.seed(2)
    _, direct = library.get_interval_estimates({"k": [SCORES, other]}, metrics.probability_of_improvement, reps=REPS)
    assert (estimate.low, estimate.high) == tuple(np.ravel(direct["k"]))
    assert estimate.point == pytest.approx(metrics.probability_of_improvement(SCORES, other))
    assert estimate.statistic == "P(X > Y)" and (estimate.runs, estimate.tasks) == (4, 3)


def test_probability_of_improvement_by_hand():
    # x beats y in 1 + 2 + 3 of the 9 pairs (1 > 0; 2 > 0, 1.5; 3 > all): 6 / 9
    x, y = np.array([[1.0], [2.0], [3.0]]), np.array([[0.0], [1.5], [2.5]])
    assert aggregates.probability_of_improvement(x, y, reps=REPS).point == pytest.approx(2 / 3)
    # a tie counts one half: 1 vs [1, 0] is (0.5 + 1) / 2; two tasks average
    two = aggregates.probability_of_improvement(np.array([[1.0, 1.0]]), np.array([[1.0, 0.0], [0.0, 2.0]]), reps=REPS)
    assert two.point == pytest.approx(((0.5 + 1) / 2 + (1 + 0) / 2) / 2)
    assert two.runs == 1 and np.isnan(two.low)
    with pytest.raises(ValueError, match="y: expected the same number of task columns"):
        aggregates.probability_of_improvement(x, np.ones((3, 2)))


def test_the_study_statistics_keep_numba_out_of_the_process():
    """arch imports numba unless told not to, and llvmlite's objects in sys.modules break vLLM's
    in-process kernel dispatcher (the vLLM engine then fails to start in that process): the study's
    modules import nothing of rliable until asked, and then with arch's numba off."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; import orsd.study.outputs; assert 'rliable' not in sys.modules; "
            "from orsd.study import aggregates; aggregates.iqm_interval(np.ones((2, 1)), reps=10); "
            "assert 'rliable' in sys.modules; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numba', 'llvmlite')))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "ARCH_DISABLE_NUMBA"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
