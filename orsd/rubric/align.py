"""Rubric–reward alignment (paper Eq. 5–7) and the ablation selectors.

Eq. 5: s_i^m = mean of trajectory i's finite criterion scores under bundle m (NaN if none).
Eq. 6: ρ_m = Spearman(s^m, r) with average ranks for ties (scipy).
Eq. 7: m* = argmax over finite ρ_m, the lowest index winning ties (within a relative 1e-9); no
finite ρ → no bundle.
ρ is NaN when fewer than 2 (s_i, r_i) pairs are finite or either side has fewer than two distinct
values — decided before scipy is called, so no ConstantInputWarning ever escapes.
`apply_min_rho` (beyond the paper, issue 67): a Spearman B* whose ρ ≤ a threshold is set aside, so
its group gets no rubric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import spearmanr

METHODS = ("spearman", "random", "single")


@dataclass
class Alignment:
    """The selection for one group: per-bundle ρ (NaN allowed), the chosen index or None, and why."""

    rho: list[float]
    index: int | None
    satisfaction: list[np.ndarray] = field(default_factory=list)  # per bundle, s [N] (Eq. 5)
    reason: str = ""
    method: str = "spearman"
    #: B* when `apply_min_rho` set it aside (its ρ ≤ the threshold; index is then None), else None
    set_aside: int | None = None

    @property
    def selected(self) -> bool:
        return self.index is not None

    @property
    def best(self) -> int | None:
        """The bundle the selector chose, whether it was kept (index) or set aside."""
        return self.index if self.index is not None else self.set_aside

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN becomes None) for groups.jsonl."""
        return {"rho": [None if math.isnan(x) else x for x in self.rho], "index": self.index,
                "satisfaction": [[None if math.isnan(x) else float(x) for x in s] for s in self.satisfaction],
                "reason": self.reason, "method": self.method, "set_aside": self.set_aside}


def satisfaction(scores: np.ndarray) -> np.ndarray:
    """Eq. 5: s_i = mean of the finite scores in row i of [N, K] scores; NaN for a row without any."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores shape {scores.shape}: expected [N trajectories, K criteria]")
    finite = np.isfinite(scores)
    count = finite.sum(axis=1)
    total = np.where(finite, scores, 0.0).sum(axis=1)
    out = np.full(scores.shape[0], np.nan)
    np.divide(total, count, out=out, where=count > 0)
    return out


def spearman_rho(satisfaction_values: np.ndarray, rewards: np.ndarray) -> float:
    """Eq. 6: Spearman ρ (average ranks) over the finite pairs; NaN when it is not defined."""
    s = np.asarray(satisfaction_values, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    if s.shape != r.shape or s.ndim != 1:
        raise ValueError(f"satisfaction shape {s.shape} and rewards shape {r.shape}: expected equal [N]")
    keep = np.isfinite(s) & np.isfinite(r)
    s, r = s[keep], r[keep]
    if s.size < 2 or np.unique(s).size < 2 or np.unique(r).size < 2:
        return math.nan
    rho = float(spearmanr(s, r).statistic)
    return rho if math.isfinite(rho) else math.nan


def align(scores: Sequence[np.ndarray], rewards: np.ndarray) -> Alignment:
    """Eq. 5–7: ρ of every bundle and the index of the best-aligned one (None when none is finite).

    `scores` is a list of M arrays [N, K_m] (NaN = unscored), `rewards` an array [N].
    """
    rewards = _check_rewards(rewards)
    matrices = _check_scores(scores, rewards.shape[0])
    sat = [satisfaction(matrix) for matrix in matrices]
    rho = [spearman_rho(s, rewards) for s in sat]
    index = _argmax_finite(rho)
    if index is None:
        reason = "no_bundles" if not rho else "no_finite_rho"
    else:
        reason = "max_rho"
    return Alignment(rho=rho, index=index, satisfaction=sat, reason=reason, method="spearman")


def select_random(num_bundles: int, rng: np.random.Generator | int | None,
                  scores: Sequence[np.ndarray] | None = None, rewards: np.ndarray | None = None) -> Alignment:
    """Ablation: a uniformly random bundle, ignoring alignment (seeded, reproducible).

    ρ is still computed for the record when scores and rewards are given, else it is all NaN.
    """
    if not isinstance(num_bundles, int) or isinstance(num_bundles, bool) or num_bundles < 1:
        raise ValueError(f"num_bundles={num_bundles!r}: expected a positive int")
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    record = _record(scores, rewards, num_bundles)
    index = int(generator.integers(num_bundles))
    return Alignment(rho=record.rho, index=index, satisfaction=record.satisfaction,
                     reason="random", method="random")


def select_single(rewards: np.ndarray | None = None, scores: Sequence[np.ndarray] | None = None) -> Alignment:
    """Ablation: M = 1 and the one bundle is always used; no verifier call is needed (scores=None)."""
    record = _record(scores, rewards, 1)
    return Alignment(rho=record.rho, index=0, satisfaction=record.satisfaction,
                     reason="single", method="single")


def select(method: str, scores: Sequence[np.ndarray] | None, rewards: np.ndarray | None,
           rng: np.random.Generator | int | None = None, num_bundles: int | None = None) -> Alignment:
    """One interface for the three selectors: "spearman" (Eq. 5–7), "random", "single"."""
    if method == "spearman":
        if scores is None or rewards is None:
            raise ValueError("method='spearman' needs scores (M arrays [N, K]) and rewards [N]")
        return align(scores, rewards)
    if method == "random":
        count = num_bundles if num_bundles is not None else (len(scores) if scores is not None else None)
        if count is None:
            raise ValueError("method='random' needs num_bundles or scores to know M")
        if scores is not None and len(scores) != count:
            raise ValueError(f"num_bundles={num_bundles!r} but len(scores)={len(scores)}: expected equal")
        return select_random(count, rng, scores, rewards)
    if method == "single":
        if num_bundles not in (None, 1) or (scores is not None and len(scores) != 1):
            raise ValueError(f"method='single' uses exactly one bundle (num_bundles={num_bundles!r})")
        return select_single(rewards, scores)
    raise ValueError(f"method={method!r}: expected one of {METHODS}")


def apply_min_rho(alignment: Alignment, min_rho: float | None) -> Alignment:
    """`alignment` with its B* set aside when B*'s ρ ≤ `min_rho` (rubric.min_rho; None: unchanged,
    the paper's rule). Only Spearman selection is thresholded: the random and single ablations
    choose without ρ, and what they choose stays theirs."""
    if min_rho is None or alignment.method != "spearman" or alignment.index is None:
        return alignment
    rho = alignment.rho[alignment.index]
    if not rho <= min_rho:
        return alignment
    return Alignment(rho=alignment.rho, index=None, satisfaction=alignment.satisfaction,
                     reason=f"min_rho: B* (bundle {alignment.index}) has rho {rho:.3f} <= {min_rho:g}; e = 0",
                     method=alignment.method, set_aside=alignment.index)


#: ρ values this close (relative) count as a tie: Spearman's float arithmetic differs by an ulp
#: between bundles that rank the rewards identically, and such a tie must go to the lowest index
TIE_RELATIVE = 1e-9


def _argmax_finite(rho: Sequence[float]) -> int | None:
    finite = [value for value in rho if math.isfinite(value)]
    if not finite:
        return None
    best = max(finite)
    tolerance = TIE_RELATIVE * max(1.0, abs(best))
    return next(m for m, value in enumerate(rho) if math.isfinite(value) and value >= best - tolerance)


def _record(scores: Sequence[np.ndarray] | None, rewards: np.ndarray | None, num_bundles: int) -> Alignment:
    if scores is None or rewards is None:
        return Alignment(rho=[math.nan] * num_bundles, index=None)
    if len(scores) != num_bundles:
        raise ValueError(f"len(scores)={len(scores)}: expected {num_bundles} score arrays")
    return align(scores, rewards)


def _check_rewards(rewards: Any) -> np.ndarray:
    array = np.asarray(rewards, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"rewards shape {array.shape}: expected a non-empty [N] array")
    return array


def _check_scores(scores: Any, num_trajectories: int) -> list[np.ndarray]:
    if isinstance(scores, np.ndarray) or not isinstance(scores, Sequence):
        raise TypeError(f"scores of type {type(scores).__name__}: expected a list of M arrays [N, K_m]")
    out = []
    for m, matrix in enumerate(scores):
        array = np.asarray(matrix, dtype=np.float64)
        if array.ndim != 2 or array.shape[0] != num_trajectories or array.shape[1] == 0:
            raise ValueError(f"scores[{m}] shape {array.shape}: expected [{num_trajectories}, K>0] "
                             f"(N from rewards)")
        out.append(array)
    return out
