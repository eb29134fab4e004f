"""The study's numbers from its runs' records (config.yaml, steps.jsonl, eval.jsonl): the registered
primary analysis (primary.py), and, secondary, per arm the learning statistic, held-out success and
score at start and end, each arm against the baseline paired by seed, and the size of the rubric's
shaping against the GRPO advantage. Every interval over seeds is Student t (`stats.t_interval`): a
percentile bootstrap over 3 seeds reaches only the seeds' extremes and covers ~75 %, not 95 %."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from orsd.report.records import read_jsonl

from . import stats
from .grid import INITIAL, run_path
from .primary import eval_at

#: the fallback shaping ratio, from metrics every ORSD step records (when no shaping_ratio* key exists):
#: mean over response tokens of |α·e·Δ| = α · (fraction of tokens with e = 1) · mean |Δ| over them,
#: against the mean |A| over response tokens (after shaping, ≈ |A_GRPO| while α·|Δ| is small)
FALLBACK_SHAPING = "alpha*valid_token_fraction*delta_abs_mean/advantage_abs_mean"


@dataclass
class RunData:
    label: str
    seed: int
    path: Path
    config: dict
    steps: list[dict]
    evals: list[dict]

    @property
    def wanted_steps(self) -> int | None:
        """train.steps of the run's config, or None where it names none."""
        wanted = (self.config.get("train") or {}).get("steps")
        return wanted if isinstance(wanted, int) else None

    @property
    def last_step(self) -> int:
        return max((s["step"] for s in self.steps), default=0)

    @property
    def finished(self) -> bool:
        """Whether the run recorded every step its config asks for (train.steps; without one, any)."""
        return self.last_step >= self.wanted_steps if self.wanted_steps is not None else self.last_step > 0

    def series(self, key: str) -> dict[int, float]:
        """step -> finite value of `key` in steps.jsonl."""
        return {s["step"]: float(s[key]) for s in self.steps
                if isinstance(s.get("step"), int) and stats.is_number(s.get(key))}


def read_runs(out: Path, labels: list[str], seeds: list[int]) -> dict[str, dict[int, RunData]]:
    """Every run of the grid that has a directory; a run not started yet is left out (and said so). A
    run without its own step-0 evaluation reads its seed's shared start evaluation
    (OUT/initial/eval/seed<S>/eval.jsonl, plan.StartEvaluation) as its step 0."""
    runs: dict[str, dict[int, RunData]] = {}
    for label in labels:
        for seed in seeds:
            path = run_path(out, label, seed)
            if not path.is_dir():
                continue
            config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
            steps = [s for s in read_jsonl(path / "steps.jsonl") if isinstance(s.get("step"), int)]
            evals = read_jsonl(path / "eval.jsonl")
            if not any(e.get("step") == 0 for e in evals):
                shared = [e for e in read_jsonl(Path(out) / INITIAL / "eval" / f"seed{seed}" / "eval.jsonl")
                          if e.get("step") == 0]
                evals = [{**shared[-1], "shared": True}, *evals] if shared else evals
            runs.setdefault(label, {})[seed] = RunData(label, seed, path, config or {}, steps, evals)
    return runs


def end_step(runs: dict[str, dict[int, RunData]]) -> int | None:
    """The last evaluated step after 0 that every run shares: arms are compared at the same point. A
    run with no evaluation after step 0 yet (one in progress) is left out rather than hiding the rest."""
    every = [{e.get("step") for e in run.evals if isinstance(e.get("step"), int) and e["step"] > 0}
             for by_seed in runs.values() for run in by_seed.values()]
    every = [steps for steps in every if steps]
    common = set.intersection(*every) if every else set()
    return max(common) if common else None


def heldout(by_seed: dict[int, RunData], end: int | None, key: str) -> dict:
    """Held-out `key` (success_rate or score_mean of eval.jsonl) at step 0 and at `end` per seed, their
    means with t intervals over seeds, and end − start paired by seed."""
    start = {s: r[key] for s, run in by_seed.items() if (r := eval_at(run, 0)) and stats.is_number(r.get(key))}
    finish = {s: r[key] for s, run in by_seed.items() if (r := eval_at(run, end)) and stats.is_number(r.get(key))}
    return {"start_step": 0, "end_step": end,
            "per_seed": {str(s): {"start": start.get(s), "end": finish.get(s)} for s in sorted(by_seed)},
            "episodes": _episodes(by_seed, end), "start": stats.t_interval(list(start.values())).as_dict(),
            "end": stats.t_interval(list(finish.values())).as_dict(),
            "end_minus_start": stats.paired_t(finish, start).as_dict()}


def _episodes(by_seed: dict[int, RunData], end: int | None) -> int | None:
    """Episodes per seed in the end evaluation (the most any seed has)."""
    counts = [int(r.get("num_episodes") or 0) for run in by_seed.values() if (r := eval_at(run, end))]
    return max(counts) if counts else None


def learning(by_seed: dict[int, RunData], window: int) -> tuple[dict, dict[int, float]]:
    """Per seed, mean training reward over the last `window` steps minus the first `window`; over seeds
    its mean with a t interval and how many SEs from 0. A run still in progress is left out: its last
    window would hold other steps than the finished runs'. Secondary: which of the training tasks fall in
    each window moves it (docs/study.md)."""
    per_seed = {seed: stats.learning_gain([v for _, v in sorted(run.series("reward_mean").items())], window)
                for seed, run in sorted(by_seed.items()) if run.finished}
    interval = stats.t_interval(list(per_seed.values()))
    summary = {"window": window, "per_seed": {str(s): stats.finite(v) for s, v in per_seed.items()},
               **interval.as_dict(), "n_se": stats.finite(stats.n_standard_errors(interval.mean, interval.se))}
    return summary, per_seed


def shaping(by_seed: dict[int, RunData]) -> dict:
    """Per arm, the mean over steps and seeds of every `shaping_ratio*` metric of steps.jsonl; where
    no step has one, the ratio computed from the step's own metrics (FALLBACK_SHAPING)."""
    keys = sorted({k for run in by_seed.values() for s in run.steps for k in s if k.startswith("shaping_ratio")})
    if keys:
        return {"source": "steps.jsonl", **{key: _mean([v for run in by_seed.values()
                                                        for v in run.series(key).values()]) for key in keys}}
    values = []
    for run in by_seed.values():
        alpha = float(((run.config.get("rubric") or {}).get("alpha")) or 0.0)
        for s in run.steps:
            parts = [s.get(k) for k in ("valid_token_fraction", "delta_abs_mean", "advantage_abs_mean")]
            if all(stats.is_number(p) for p in parts) and parts[2] > 0:
                values.append(alpha * parts[0] * parts[1] / parts[2])
    return {"source": FALLBACK_SHAPING, "shaping_ratio": _mean(values), "steps": len(values)}


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(runs: dict[str, dict[int, RunData]], labels: list[str], registration: dict,
              window: int = stats.WINDOW, arm_methods: dict[str, str] | None = None) -> dict:
    """summary.json: "primary", the registered analysis (primary.analyse), and "arms", the secondary
    figures per arm in `labels` order, each paired by seed against the registration's baseline;
    `arm_methods`: each arm's method.name where none of its runs has started."""
    from .primary import analyse

    end = end_step(runs)
    baseline = registration["baseline"]
    arms, gains = {}, {}
    for label in labels:
        by_seed = runs.get(label, {})
        learned, gains[label] = learning(by_seed, window)
        methods = Counter(str((run.config.get("method") or {}).get("name")) for run in by_seed.values())
        arms[label] = {
            "method": methods.most_common(1)[0][0] if methods else (arm_methods or {}).get(label),
            "seeds": sorted(by_seed),
            "runs": {str(seed): str(run.path) for seed, run in sorted(by_seed.items())},
            "steps_recorded": {str(seed): max((s["step"] for s in run.steps), default=0)
                               for seed, run in sorted(by_seed.items())},
            "reward_first": _mean([run.steps[0]["reward_mean"] for run in by_seed.values()
                                   if run.steps and stats.is_number(run.steps[0].get("reward_mean"))]),
            "reward_last": _mean([run.steps[-1]["reward_mean"] for run in by_seed.values()
                                  if run.steps and stats.is_number(run.steps[-1].get("reward_mean"))]),
            "learning": learned,
            "heldout": heldout(by_seed, end, "success_rate"),
            "heldout_score": heldout(by_seed, end, "score_mean"),
            "shaping": shaping(by_seed),
        }
    if baseline is not None and baseline in arms:
        base_end = _end_value(runs.get(baseline, {}), end, "success_rate")
        base_score = _end_value(runs.get(baseline, {}), end, "score_mean")
        base_rollouts = {seed: _rollouts(run.path) for seed, run in runs.get(baseline, {}).items()}  # read once
        for label in labels:
            if label == baseline:
                continue
            arms[label]["vs_baseline"] = {
                "baseline": baseline,
                "identical_steps": {str(seed): identical_steps(_rollouts(run.path), base_rollouts[seed])
                                    for seed, run in sorted(runs.get(label, {}).items()) if seed in base_rollouts},
                "learning": stats.paired_t(gains[label], gains[baseline]).as_dict(),
                "heldout_end": stats.paired_t(_end_value(runs.get(label, {}), end, "success_rate"),
                                              base_end).as_dict(),
                "heldout_score_end": stats.paired_t(_end_value(runs.get(label, {}), end, "score_mean"),
                                                    base_score).as_dict(),
            }
    return {"end_step": end, "baseline": baseline, "primary": analyse(runs, labels, registration, end, window),
            "arms": arms}


def _rollouts(path: Path) -> dict[int, list]:
    """step -> what was sampled in it, in group order: each group's task and each trajectory's
    actions and reward (groups.jsonl; a resumed run's rewritten step keeps its last record)."""
    steps: dict[int, dict[int, tuple]] = {}
    for group in read_jsonl(path / "groups.jsonl"):
        if isinstance(group.get("step"), int) and isinstance(group.get("group"), int):
            sampled = tuple((tuple(t.get("actions") or ()), reward)
                            for t, reward in zip(group.get("transcripts") or (), group.get("rewards") or ()))
            steps.setdefault(group["step"], {})[group.get("group")] = ((group.get("task") or {}).get("id"), sampled)
    return {step: [groups[g] for g in sorted(groups)] for step, groups in steps.items()}


def identical_steps(mine: dict[int, list], theirs: dict[int, list]) -> int | None:
    """How many steps from the first the arm sampled exactly what the baseline did (same tasks, same
    commands in every trajectory, same rewards): both start from one policy with one seed, so they
    part only once their updates have made the weights differ enough to change a sampled token.
    `mine`, `theirs`: `_rollouts` of the two runs."""
    if not mine or not theirs:
        return None  # nothing sampled yet by one of them
    same = 0
    while same + 1 in mine and mine[same + 1] == theirs.get(same + 1):
        same += 1
    return same


def _end_value(by_seed: dict[int, RunData], end: int | None, key: str) -> dict[int, float]:
    """seed -> `key` of the run's eval.jsonl record at step `end` (success_rate, score_mean)."""
    records = {seed: eval_at(run, end) for seed, run in by_seed.items()} if end is not None else {}
    return {seed: r[key] for seed, r in records.items() if r is not None and stats.is_number(r.get(key))}


def default_baseline(labels: list[str], methods: dict[str, str]) -> str | None:
    """The arm the others are compared against: the first whose method is grpo, else the first arm."""
    return next((label for label in labels if methods.get(label) == "grpo"), labels[0] if labels else None)
