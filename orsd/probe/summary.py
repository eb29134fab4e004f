"""Every figure of probe.json from the scored replies (stats.py defines the scores and intervals)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .scoring import Scores
from .states import Reply, State
from .stats import SCORES, TOKEN_CLASSES, correlation, mean_with_interval, paired, per_token, unpaired


def token_values(scores: Scores, i: int, context: str, baseline: str | None) -> np.ndarray | None:
    """lp(context) − lp(baseline) per response token of reply i (None where either is absent)."""
    a = scores.lp(context, i)
    b = None if baseline is None else scores.lp(baseline, i)
    if a is None or (baseline is not None and b is None):
        return None
    return a - b if b is not None else a


def reply_score(scores: Scores, i: int, context: str, baseline: str | None, reduce: str = "sum") -> float:
    x = token_values(scores, i, context, baseline)
    if x is None or not len(x) or not np.all(np.isfinite(x)):
        return math.nan
    return float(x.sum() if reduce == "sum" else x.mean())


def expert_and_wrong(states: list[State], values: list[float]) -> tuple[list[float], list[list[float]]]:
    """Per state: the expert's value (its first reply) and those of its wrong replies."""
    return [values[s.replies[0]] for s in states], [[values[j] for j in s.replies[1:]] for s in states]


def counts(states: list[State], replies: list[Reply]) -> dict:
    policy = [r for r in replies if r.role == "policy"]
    return {"states": len(states), "states_by_page": dict(Counter(s.page for s in states)),
            "states_with_wrong_replies": sum(len(s.replies) > 1 for s in states),
            "expert_replies": sum(r.role == "expert" for r in replies),
            "wrong_replies": sum(r.role == "wrong" for r in replies),
            "policy_replies": len(policy), "policy_matching_expert": sum(r.matches_expert for r in policy),
            "policy_without_action": sum(r.action is None for r in policy)}


def score_figures(states: list[State], replies: list[Reply], scores: Scores, classes: list[list[str]],
                  context: str, baseline: str | None, seed: int) -> dict:
    total = [reply_score(scores, i, context, baseline, "sum") for i in range(len(replies))]
    mean = [reply_score(scores, i, context, baseline, "mean") for i in range(len(replies))]
    scripted = [i for i, r in enumerate(replies) if r.role != "policy"]
    policy = [i for i, r in enumerate(replies) if r.role == "policy"]
    out = {"context": context, "baseline": baseline,
           "expert_vs_wrong": paired(*expert_and_wrong(states, total), seed),
           "auc_per_token": paired(*expert_and_wrong(states, mean), seed)["auc"],
           "auc_by_page": {page: paired(*expert_and_wrong([s for s in states if s.page == page], total), seed)["auc"]
                           for page in sorted({s.page for s in states})},
           "policy_auc": unpaired([total[i] for i in policy if replies[i].matches_expert],
                                  [total[i] for i in policy if not replies[i].matches_expert], seed),
           "policy_auc_per_token": unpaired([mean[i] for i in policy if replies[i].matches_expert],
                                            [mean[i] for i in policy if not replies[i].matches_expert], seed)}
    if context != "plain":
        plain = [reply_score(scores, i, "plain", None) for i in range(len(replies))]
        out["corr_with_plain"] = correlation([total[i] for i in scripted], [plain[i] for i in scripted],
                                             [replies[i].state for i in scripted], seed)
        out["tokens"] = {group: {which: mean_with_interval(
            [per_token(token_values(scores, i, context, baseline), classes[i], which) for i in members], seed)
            for which in TOKEN_CLASSES} for group, members in (("scripted", scripted), ("policy", policy))}
    return out


def summarize(states: list[State], replies: list[Reply], scores: Scores, classes: list[list[str]],
              seed: int) -> dict:
    figures = {name: score_figures(states, replies, scores, classes, context, baseline, seed)
               for name, context, baseline in SCORES}
    oracle, misleading = (figures[f"Δ {k}"]["expert_vs_wrong"]["auc"] for k in ("oracle", "misleading"))
    return {"counts": counts(states, replies), "scores": figures, "prediction": {
        "rule": "(a) holds when the oracle's paired AUC interval lies above 0.5; (b) when the misleading "
                "rubric's interval reaches 0.5 or below (not clearly above)",
        "oracle_auc": oracle, "misleading_auc": misleading,
        "a_oracle_above_half": bool(oracle["ci"] and oracle["ci"][0] > 0.5),
        "b_misleading_not_above_half": bool(misleading["ci"] is None or misleading["ci"][0] <= 0.5)}}
