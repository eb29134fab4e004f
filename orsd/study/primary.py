"""The study's primary analysis: the registered endpoint per arm and seed, each primary arm against
the baseline paired by seed, and the decision the tests allow.

Per arm: the per-seed values, their mean with a Student-t 95 % interval, and the IQM with rliable's
stratified-bootstrap interval over runs (strata: the held-out tasks, where eval.jsonl keeps
per-episode records; else one stratum). Per primary arm against the baseline: the paired mean
difference with its t interval and p-value, the p-value Holm-adjusted over the registered primary
arms, a paired TOST against the registered margin, the minimum difference the study could have
detected at 80 % power, rliable's probability of improvement, and the decision: better or worse
only when the adjusted test rejects, equivalent only when the TOST passes, otherwise not decided.
Exploratory arms get the same figures, uncorrected and labelled so.
"""

from __future__ import annotations

import numpy as np

from . import aggregates, stats
from .registration import ENDPOINTS, family, role

#: power at which the minimum detectable difference is given
POWER = 0.8
#: rliable's bootstrap resamples: every one re-runs scipy's trimmed mean (or one Mann-Whitney test per
#: task); 2,000 keep the interval's ends close to 10,000's and a report within seconds
RESAMPLES = 2_000


def eval_at(run, step: int | None) -> dict | None:
    """The last eval.jsonl record of `run` at `step` (a resumed run may have written one twice)."""
    if step is None:
        return None
    return next((e for e in reversed(run.evals)
                 if e.get("step") == step and stats.is_number(e.get("success_rate"))), None)


def endpoint_values(by_seed: dict, endpoint: str, end: int | None, window: int) -> dict[int, float]:
    """seed -> the endpoint's value for every finished run that has it."""
    values = {}
    for seed, run in sorted(by_seed.items()):
        if not run.finished:
            continue
        if endpoint == "learning":
            value = stats.learning_gain([v for _, v in sorted(run.series("reward_mean").items())], window)
        else:
            record = eval_at(run, end)
            value = record.get("score_mean" if endpoint == "heldout_score" else "success_rate") if record else None
        if stats.is_number(value):
            values[seed] = float(value)
    return values


def task_means(record: dict, endpoint: str) -> dict[str, float] | None:
    """task id -> the endpoint's mean over that task's episodes in an eval.jsonl record with
    per-episode records (None without them)."""
    episodes = record.get("episodes") if record else None
    if not episodes:
        return None
    key = "score" if endpoint == "heldout_score" else "won"
    per_task: dict[str, list[float]] = {}
    for episode in episodes:
        per_task.setdefault(str(episode["task"]), []).append(float(episode[key]))
    return {task: float(np.mean(values)) for task, values in per_task.items()}


def score_matrix(by_seed: dict, seeds: list[int], endpoint: str, end: int | None,
                 values: dict[int, float]) -> tuple[np.ndarray, str]:
    """[runs, strata] for rliable: per-task means where every run's end evaluation has per-episode
    records over the same tasks, else the per-seed values as one stratum; and what the strata are."""
    if endpoint != "learning" and seeds:
        tables = [task_means(eval_at(by_seed[seed], end), endpoint) for seed in seeds]
        if all(tables) and all(table.keys() == tables[0].keys() for table in tables):
            tasks = sorted(tables[0])
            return np.array([[table[t] for t in tasks] for table in tables]), f"{len(tasks)} held-out tasks"
    return np.array([[values[seed]] for seed in seeds], dtype=float).reshape(len(seeds), 1), "one stratum"


def analyse(runs: dict, labels: list[str], registration: dict, end: int | None, window: int) -> dict:
    """summary.json's "primary" block: every arm's endpoint and every comparison with its decision."""
    endpoint, baseline, alpha = registration["endpoint"], registration["baseline"], registration["alpha"]
    values = {label: endpoint_values(runs.get(label, {}), endpoint, end, window) for label in labels}
    arms = {}
    for label in labels:
        seeds = sorted(values[label])
        matrix, strata = score_matrix(runs.get(label, {}), seeds, endpoint, end, values[label])
        arms[label] = {"role": role(registration, label), "n": len(seeds),
                       "per_seed": {str(s): values[label][s] for s in seeds},
                       "mean": stats.t_interval(list(values[label].values())).as_dict(),
                       "iqm": aggregates.iqm_interval(matrix, reps=RESAMPLES).as_dict() if len(seeds) else None, "strata": strata}
    primary = [label for label in family(registration) if label in labels]
    comparisons = {}
    for label in labels:
        if label == baseline or baseline not in values:
            continue
        difference = stats.paired_t(values[label], values[baseline])
        seeds = sorted(values[label].keys() & values[baseline].keys())
        x, _ = score_matrix(runs.get(label, {}), seeds, endpoint, end, values[label])
        y, _ = score_matrix(runs.get(baseline, {}), seeds, endpoint, end, values[baseline])
        comparisons[label] = {
            "role": role(registration, label), "n": difference.n, "difference": difference.as_dict(),
            "tost": stats.tost_paired(values[label], values[baseline], registration["margin"], alpha).as_dict(),
            "mdd": stats.finite(stats.minimum_detectable_difference(difference.sd, difference.n,
                                                                    alpha / max(1, len(primary)), POWER)),
            "probability_of_improvement": aggregates.probability_of_improvement(x, y, reps=RESAMPLES).as_dict()
            if seeds and x.shape == y.shape else None}
    adjusted = stats.holm({label: comparisons[label]["difference"]["p_value"] for label in primary
                           if label in comparisons}, alpha)
    for label, comparison in comparisons.items():
        if label in adjusted:
            comparison["p_holm"], comparison["reject"] = adjusted[label]
        else:  # exploratory: its own test, uncorrected
            p = comparison["difference"]["p_value"]
            comparison["p_holm"], comparison["reject"] = None, bool(p is not None and p < alpha)
        comparison["decision"] = stats.decide(comparison["difference"]["mean"], comparison["reject"],
                                              comparison["tost"]["passed"], registration["margin"])
    return {"endpoint": endpoint, "description": ENDPOINTS[endpoint], "end_step": end, "baseline": baseline,
            "margin": registration["margin"], "alpha": alpha, "power": POWER, "post_hoc": registration["post_hoc"],
            "registered": registration.get("registered"), "family": primary, "arms": arms,
            "comparisons": comparisons}
