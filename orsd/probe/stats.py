"""The probe's statistics: paired and unpaired AUCs, means, correlations and per-token figures, each
with a 95 % bootstrap interval from `scipy.stats.bootstrap` (percentile method, a fixed seed).

A *score* of a reply is a log-probability difference summed over its tokens (or averaged: the
`per_token` figures): `plain` is log π(reply | context) alone; `Δ kind` is lp(with kind's rubric) −
lp(plain), the paper's Δ; `kind − other` is lp(with kind) − lp(with other) = Δ_kind − Δ_other, the
calibrated Δ of issue 60 when `other` is a control. The paired AUC at a state is P(score_expert >
score_wrong) over its wrong replies, ties counting half; the probe's AUC is its mean over states
and the interval resamples states. Percentile rather than BCa intervals: BCa is undefined where
every state gives the same value (an AUC of 1.0 everywhere), which a probe can meet.
"""

from __future__ import annotations

import math
import re

import numpy as np
from scipy import stats

from .kinds import CONTENT, CONTROLS, KINDS

CONFIDENCE = 0.95
RESAMPLES = 2000
TAGS = re.compile(r"</?think>|</?action>")
TOKEN_CLASSES = ("first", "scaffold", "eos", "content")

#: (name, context, baseline): score = lp(context) − lp(baseline), baseline None = nothing subtracted
SCORES = ([("plain", "plain", None)] + [(f"Δ {k}", k, "plain") for k in KINDS]
          + [(f"{k} − {c}", k, c) for k in CONTENT for c in CONTROLS]
          + [("oracle − misleading", "oracle", "misleading"), ("oracle − selected", "oracle", "selected"),
             ("selected − misleading", "selected", "misleading")])


def auc(positive, negative, axis: int = -1) -> float | np.ndarray:
    """P(x > y) for x from `positive`, y from `negative`, ties counting half (the Mann–Whitney U over
    the number of pairs); NaN when either is empty. Batched along leading axes (`axis` = -1: the
    samples are the last axis), as scipy.stats.bootstrap's vectorized statistics are called."""
    x, y = np.asarray(positive, float), np.asarray(negative, float)
    if not x.shape[-1] or not y.shape[-1]:
        return math.nan
    x, y = x[..., :, None], y[..., None, :]
    value = np.mean((x > y) + 0.5 * (x == y), axis=(-2, -1))
    return float(value) if np.ndim(value) == 0 else value


def interval(data: tuple, statistic, seed: int) -> list[float] | None:
    """The 95 % percentile bootstrap interval of `statistic` over `data` (scipy.stats.bootstrap's
    samples, several resampled independently; `statistic(*samples, axis=-1)` vectorized, computed
    for 200 resamples at a time); None with fewer than 2 values in a sample."""
    if any(len(d) < 2 for d in data):
        return None
    result = stats.bootstrap(data, statistic, n_resamples=RESAMPLES, confidence_level=CONFIDENCE,
                             method="percentile", vectorized=True, batch=200, rng=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return [float(low), float(high)]


def mean_with_interval(values, seed: int) -> dict:
    """The mean of the finite `values` and its interval."""
    v = np.asarray([x for x in values if np.isfinite(x)], float)
    if not v.size:
        return {"value": None, "ci": None, "n": 0}
    ci = interval((v,), np.mean, seed) if np.ptp(v) > 0 else [float(v[0])] * 2
    return {"value": float(v.mean()), "ci": ci, "n": int(v.size)}


def paired(expert: list[float], wrong: list[list[float]], seed: int) -> dict:
    """Per state the expert's score against its wrong replies' (NaN ones left out): the mean paired
    AUC, the expert's and the wrong replies' mean scores and their mean difference, each over the
    states that have both."""
    rows = [(e, np.asarray([w for w in ws if np.isfinite(w)])) for e, ws in zip(expert, wrong)]
    rows = [(e, ws) for e, ws in rows if np.isfinite(e) and ws.size]
    return {"auc": mean_with_interval([auc([e], ws) for e, ws in rows], seed),
            "expert_mean": mean_with_interval([e for e, _ in rows], seed),
            "wrong_mean": mean_with_interval([ws.mean() for _, ws in rows], seed),
            "difference_mean": mean_with_interval([e - ws.mean() for e, ws in rows], seed)}


def unpaired(positive: list[float], negative: list[float], seed: int) -> dict:
    """AUC of `positive` over `negative` with an interval resampling each independently."""
    x = np.asarray([v for v in positive if np.isfinite(v)], float)
    y = np.asarray([v for v in negative if np.isfinite(v)], float)
    value = auc(x, y)
    ci = interval((x, y), auc, seed) if math.isfinite(value) else None
    return {"value": None if math.isnan(value) else value, "ci": ci, "n_positive": int(x.size),
            "n_negative": int(y.size)}


def correlation(score: list[float], plain: list[float], unit: list[int], seed: int) -> dict:
    """Pearson r of `score` with `plain` over the replies, its interval resampling whole units
    (states: a state's replies share a context). A resample of units weights each reply by how
    often its unit was drawn, so r is the weighted Pearson r."""
    s, p, u = (np.asarray(a, float) for a in (score, plain, unit))
    keep = np.isfinite(s) & np.isfinite(p)
    s, p = s[keep], p[keep]
    units, position = np.unique(u[keep], return_inverse=True)  # position: each reply's unit, 0..U-1
    if s.size < 3 or np.ptp(s) == 0 or np.ptp(p) == 0:
        return {"value": None, "ci": None, "n": int(s.size)}

    def r_of(drawn, axis=-1):  # drawn: [..., U] positions of the units drawn
        counts = (drawn[..., :, None] == np.arange(len(units))).sum(-2)  # [..., U]
        w = counts[..., position]  # [..., replies]
        w = w / w.sum(-1, keepdims=True)
        ds = s - (w * s).sum(-1, keepdims=True)
        dp = p - (w * p).sum(-1, keepdims=True)
        cov, vs, vp = (w * ds * dp).sum(-1), (w * ds * ds).sum(-1), (w * dp * dp).sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):  # a resample of one unit may have no spread
            return np.where((vs > 0) & (vp > 0), cov / np.sqrt(vs * vp), 0.0)

    return {"value": float(stats.pearsonr(s, p).statistic), "ci": interval((np.arange(len(units)),), r_of, seed),
            "n": int(s.size), "units": int(units.size)}


def token_classes(tokenizer, ids: list[int]) -> list[str]:
    """Per response token: `scaffold` where its text overlaps an answer-format tag (<think>,
    </think>, <action>, </action>), `eos` for the end-of-turn token, `content` elsewhere (the
    first token is also reported on its own: TOKEN_CLASSES' `first`)."""
    ends, text = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[:i + 1])
        ends.append(len(text))
    tags = [m.span() for m in TAGS.finditer(text)]
    special = set(tokenizer.all_special_ids)
    out = []
    for i, token in enumerate(ids):
        start, end = (ends[i - 1] if i else 0), ends[i]
        if token in special:
            out.append("eos")
        elif any(start < b and a < end for a, b in tags):
            out.append("scaffold")
        else:
            out.append("content")
    return out


def per_token(x: np.ndarray | None, classes: list[str], which: str) -> float:
    """The mean of per-token values over tokens of class `which` (`first`: the first token)."""
    if x is None or not len(x):
        return math.nan
    if which == "first":
        return float(x[0])
    chosen = [v for v, c in zip(x, classes) if c == which]
    return float(np.mean(chosen)) if chosen else math.nan
