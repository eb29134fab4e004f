"""The verifier check: can the run's verifier tell satisfied from unsatisfied criteria?

Every (oracle criterion, episode) cell of a task has a truth known by rule (`orsd.probe.truth`).
Each cell is scored by the run's verifier on the episode's transcript through training's own path
(`orsd.train.bundles.verify` with the task's oracle rubric as a candidate bundle, the transcripts
formatted by `rubric.transcript_chars` as training formats them). Named variants change one thing
each (the transcript window, the budget, the yes/no prompt) and score the same cells with the same
verifier object. Every variant is also reported calibrated two ways: a cell's score minus the same
criterion's score on the task's empty transcript (the first page, no action), and minus the score
of a matched content-free criterion (orsd.rubric.controls, the second candidate bundle) on the
same transcript.

Figures: the AUC of the score separating satisfied from unsatisfied cells over all cells, per
criterion kind, and within a task and criterion (the mean of the per-(task, criterion) AUCs where
both classes exist; a per-criterion shift such as the calibration cannot change it); the mean
score of satisfied and unsatisfied cells. Intervals: 95 % percentile bootstrap resampling tasks
(`scipy.stats.bootstrap` through `orsd.probe.stats.interval`): the cells of a task share its
criteria and episodes, so tasks, not cells, are the independent units.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orsd import rubric
from orsd.methods.base import Candidates
from orsd.rubric.controls import content_free_bundle
from orsd.rubric.verifier import run_blocking
from orsd.train import bundles
from orsd.train.records import Group, Trajectory

from .stats import auc, interval
from .truth import KINDS, Criterion, Episode, oracle_criteria, truth

TEMPLATES = Path(__file__).parent / "templates"
EMPTY = "empty"  # the calibration transcript's episode name
#: the figures' keys and the calibration each reports (`calibrate`)
CALIBRATIONS = {"figures": "none", "figures_calibrated": "empty", "figures_content_free": "content_free"}


@dataclass(frozen=True)
class Variant:
    """One way of showing the cells to the verifier; `training` is what training does."""

    name: str
    description: str
    keep_actions: bool = False  # the transcript window keeps every action whole (observations shortened)
    chars: int | None = None  # the transcript budget; None: the config's rubric.transcript_chars
    template: str | None = None  # a yes/no prompt file under orsd/probe/templates; None: the verifier's own

    @property
    def is_training(self) -> bool:
        return not self.keep_actions and self.chars is None and self.template is None


VARIANTS = {v.name: v for v in (
    Variant("training", "training's scoring: the config's transcript budget, cut in the middle; the built-in prompt"),
    Variant("actions_kept", "every action kept whole, observations shortened first, same budget", keep_actions=True),
    *(Variant(f"actions_kept_{chars}", f"actions_kept in a {chars}-character budget", keep_actions=True, chars=chars)
      for chars in (500, 300, 200)),
    Variant("wide", "a 4000-character budget: nothing is cut on these episodes", chars=4000),
    Variant("prompt_clear", "training's transcript; a yes/no prompt that says what Action and Observation lines "
                            "are and that what the transcript does not show is a no", template="yes_no_clear.txt"),
    Variant("prompt_examples", "training's transcript; the yes/no prompt with two worked examples, a yes and a no",
            template="yes_no_examples.txt"),
)}


@dataclass
class Cells:
    """Every scored cell of the check: per task its criteria and episodes (the empty transcript
    last, for calibration), and per (task, episode, criterion) the rule's truth."""

    tasks: list
    criteria: list[list[Criterion]]
    episodes: list[list[Episode]]  # per task; the last one is the empty transcript
    truth: list[np.ndarray]  # per task [episodes without the empty one, criteria]: 1, 0, or NaN (undecided)

    @classmethod
    def build(cls, env, tasks: list, episodes: list[list[Episode]]) -> "Cells":
        criteria = [oracle_criteria(task) for task in tasks]
        table = [np.array([[np.nan if (v := truth(c, e, env.catalog)) is None else float(v) for c in crits]
                           for e in eps]) for crits, eps in zip(criteria, episodes)]
        empty = [Episode(task, EMPTY, [env.fork().reset(task)], []) for task in tasks]
        return cls(tasks, criteria, [eps + [e] for eps, e in zip(episodes, empty)], table)


def transcripts(episodes: list[Episode], variant: Variant, chars: int) -> list[str]:
    return [rubric.format_transcript(e.observations, e.actions, max_chars=variant.chars or chars,
                                     keep_actions=variant.keep_actions) for e in episodes]


def lost_an_action(episode: Episode, text: str) -> bool:
    """Whether some action line of `episode` is not whole in its transcript `text`."""
    full = rubric.format_transcript(episode.observations, episode.actions, max_chars=None).split("\n")
    return any(line.startswith("Action ") and line not in text.split("\n") for line in full)


def with_template(verifier, name: str | None):
    """The verifier with another yes/no prompt (a shallow copy: the same model, lock and accounting)."""
    if name is None:
        return verifier
    clone = copy.copy(verifier)
    clone.templates = dataclasses.replace(verifier.templates, yes_no=TEMPLATES / name)
    return clone


def score(verifier, cells: Cells, variant: Variant, chars: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per task the scores [episodes incl. the empty one, criteria] of the variant: of the oracle
    criteria, and of the content-free control criteria matched to them (orsd.rubric.controls), as
    a second candidate bundle. `training` goes through `bundles.verify` itself; the others call the
    same verifier the same way with their transcripts (tests/probe/test_verifier_check.py checks
    that the two paths agree)."""
    oracle = [rubric.RubricBundle([c.text for c in crits], source="oracle") for crits in cells.criteria]
    candidates = [[bundle, content_free_bundle(bundle)] for bundle in oracle]
    if variant.is_training:
        groups = [Group(task, [Trajectory(task, e.observations, e.actions) for e in eps])
                  for task, eps in zip(cells.tasks, cells.episodes)]
        results = bundles.verify(verifier, groups, [Candidates(bundles=c) for c in candidates], chars)
    else:
        judge = with_template(verifier, variant.template)

        async def run():
            return await asyncio.gather(*[judge.ascore_many_with_events(task.description,
                                                                        transcripts(eps, variant, chars), pair)
                                          for task, eps, pair in zip(cells.tasks, cells.episodes, candidates)])

        results = run_blocking(run)
    return [r[0].scores for r in results], [r[1].scores for r in results]


def calibrate(scores: list[np.ndarray], controls: list[np.ndarray], how: str) -> list[np.ndarray]:
    """`none`: the scores; `empty`: minus the same criterion's score on the task's empty transcript
    (the last row; a shift per criterion); `content_free`: minus the matched content-free
    criterion's score on the same transcript (a shift per transcript and criterion position)."""
    if how == "empty":
        return [s - s[-1] for s in scores]
    if how == "content_free":
        return [s - c for s, c in zip(scores, controls)]
    return scores


def flatten(cells: Cells, scores: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The decided cells as parallel arrays: score, truth, task, (task, criterion) group, kind."""
    rows = []
    for t, (table, s, crits) in enumerate(zip(cells.truth, scores, cells.criteria)):
        for e in range(table.shape[0]):
            for k, c in enumerate(crits):
                if np.isfinite(table[e, k]) and np.isfinite(s[e, k]):
                    rows.append((s[e, k], table[e, k], t, t * 100 + k, c.kind))
    score_, truth_, task, group, kind = zip(*rows) if rows else ((),) * 5
    return {"score": np.asarray(score_, float), "truth": np.asarray(truth_, bool), "task": np.asarray(task, int),
            "group": np.asarray(group, int), "kind": np.asarray(kind, str)}


def task_counts(drawn: np.ndarray, num_tasks: int) -> np.ndarray:
    """How often each task was drawn, [resamples, tasks], from drawn task indices [resamples, draws]."""
    drawn = np.atleast_2d(drawn)
    return (drawn[..., :, None] == np.arange(num_tasks)).sum(-2)


def weighted_auc(flat: dict, keep: np.ndarray, num_tasks: int, seed: int) -> dict:
    """AUC over the kept cells, satisfied as positives, with its task-bootstrap interval (a
    resample weights each cell by how often its task was drawn)."""
    pos, neg = keep & flat["truth"], keep & ~flat["truth"]
    value = auc(flat["score"][pos], flat["score"][neg])
    out = {"value": None if np.isnan(value) else float(value), "ci": None,
           "satisfied": int(pos.sum()), "unsatisfied": int(neg.sum())}
    if out["value"] is None:
        return out
    x, y = flat["score"][pos], flat["score"][neg]
    wins = (x[:, None] > y[None, :]) + 0.5 * (x[:, None] == y[None, :])
    tp, tn = flat["task"][pos], flat["task"][neg]

    def statistic(drawn, axis=-1):
        counts = task_counts(drawn, num_tasks)
        wp, wn = counts[:, tp], counts[:, tn]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.einsum("bp,pn,bn->b", wp, wins, wn) / (wp.sum(-1) * wn.sum(-1))

    out["ci"] = interval((np.arange(num_tasks),), statistic, seed)
    return out


def weighted_mean(values: np.ndarray, tasks: np.ndarray, num_tasks: int, seed: int) -> dict:
    """The mean of `values` (one per cell or group, `tasks` its task) with its task-bootstrap interval."""
    if not values.size:
        return {"value": None, "ci": None, "n": 0}

    def statistic(drawn, axis=-1):
        w = task_counts(drawn, num_tasks)[:, tasks]
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w * values).sum(-1) / w.sum(-1)

    return {"value": float(values.mean()), "ci": interval((np.arange(num_tasks),), statistic, seed),
            "n": int(values.size)}


def within(flat: dict, keep: np.ndarray, num_tasks: int, seed: int, per_pair: bool = False) -> dict:
    """The mean AUC within a task and criterion, over the (task, criterion) pairs with both classes
    (`per_pair`: each pair's AUC too, for `paired_difference`)."""
    aucs, tasks, pairs = [], [], []
    for g in np.unique(flat["group"][keep]):
        mine = keep & (flat["group"] == g)
        pos, neg = flat["score"][mine & flat["truth"]], flat["score"][mine & ~flat["truth"]]
        if pos.size and neg.size:
            aucs.append(auc(pos, neg))
            tasks.append(int(flat["task"][mine][0]))
            pairs.append(int(g))
    out = weighted_mean(np.asarray(aucs, float), np.asarray(tasks, int), num_tasks, seed)
    out["pairs"] = out.pop("n")
    if per_pair:
        out["per_pair"] = [[t, g, a] for t, g, a in zip(tasks, pairs, aucs)]  # task, task * 100 + criterion, AUC
    return out


def paired_difference(figure: dict, baseline: dict, num_tasks: int, seed: int) -> dict:
    """A variant's AUC within a task and criterion minus the baseline variant's, paired by (task,
    criterion) on the same cells, with its task-bootstrap interval."""
    mine = {g: (t, a) for t, g, a in figure["per_pair"]}
    theirs = {g: a for _, g, a in baseline["per_pair"]}
    common = [g for g in mine if g in theirs]
    return weighted_mean(np.asarray([mine[g][1] - theirs[g] for g in common], float),
                         np.asarray([mine[g][0] for g in common], int), num_tasks, seed)


def figures(flat: dict, num_tasks: int, seed: int) -> dict:
    """Every figure of one variant (raw or calibrated scores) with its task-bootstrap interval."""
    everything = np.ones(flat["score"].shape, bool)
    return {
        "auc": weighted_auc(flat, everything, num_tasks, seed),
        "auc_within_task_and_criterion": within(flat, everything, num_tasks, seed, per_pair=True),
        "auc_by_kind": {k: weighted_auc(flat, flat["kind"] == k, num_tasks, seed) for k in KINDS},
        "auc_within_by_kind": {k: within(flat, flat["kind"] == k, num_tasks, seed) for k in KINDS},
        "mean_satisfied": weighted_mean(flat["score"][flat["truth"]], flat["task"][flat["truth"]], num_tasks, seed),
        "mean_unsatisfied": weighted_mean(flat["score"][~flat["truth"]], flat["task"][~flat["truth"]],
                                          num_tasks, seed),
        "spread": spread(flat),
    }


def spread(flat: dict) -> dict:
    """How far the score moves between the episodes of one task and criterion (the mean standard
    deviation), against how far it moves between criteria (the deviation of their means): a
    verifier that reads the transcript moves within; one that answers the criterion's wording
    moves between."""
    groups = [flat["score"][flat["group"] == g] for g in np.unique(flat["group"])]
    if not groups:
        return {"sd_within_task_and_criterion": None, "sd_between_criteria": None}
    return {"sd_within_task_and_criterion": float(np.mean([g.std() for g in groups])),
            "sd_between_criteria": float(np.std([g.mean() for g in groups]))}


def check_variant(verifier, cells: Cells, variant: Variant, chars: int, seed: int) -> dict:
    """One variant's scores, figures (raw and calibrated) and the transcripts that lost an action."""
    scores, controls = score(verifier, cells, variant, chars)
    shown = [transcripts(eps[:-1], variant, chars) for eps in cells.episodes]
    lost = sum(lost_an_action(e, text) for eps, texts in zip(cells.episodes, shown) for e, text in zip(eps, texts))
    n = len(cells.tasks)
    return {"variant": variant.name, "description": variant.description,
            "transcript_chars": variant.chars or chars, "keep_actions": variant.keep_actions,
            "template": variant.template, "transcripts": sum(len(t) for t in shown),
            "transcripts_that_lost_an_action": int(lost),
            **{key: figures(flatten(cells, calibrate(scores, controls, how)), n, seed)
               for key, how in CALIBRATIONS.items()},
            # stored to 5 decimals (the figures above use the full values)
            "scores": [np.round(s, 5).tolist() for s in scores],
            "content_free_scores": [np.round(c, 5).tolist() for c in controls]}
