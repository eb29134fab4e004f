"""The rubric of every kind for each probed task.

Content kinds: `oracle` (orsd.envs.webshop.oracle: criteria written from the goal, the best a
rubric could tell), `misleading` (the next probed task's oracle rubric: right form, wrong task) and
`selected` (B*: the policy writes M bundles from the transcripts of its own rollouts on the task,
the verifier scores them, Spearman ρ against the rollouts' rewards picks one; training's own
stages, `orsd.train.bundles`, with the ORSD method's rules, so a task whose rollouts all got the same
reward has no B*, as in training). Controls of B*'s form (orsd.rubric.controls, issue 60):
`content_free`, `rejected` (the lowest-ρ other candidate) and `shuffled` (criteria of other probed
tasks' B* that this B* lacks); without a B* the content-free control takes the oracle rubric's lengths and the
other two are absent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from orsd import rubric
from orsd.envs.webshop.oracle import oracle_rubric
from orsd.methods.base import Candidates
from orsd.methods.orsd import ORSD
from orsd.rubric import Alignment, RubricBundle
from orsd.rubric.controls import content_free_bundle, rejected_bundle, shuffled_bundle
from orsd.train import bundles

CONTENT = ("oracle", "misleading", "selected")
CONTROLS = ("content_free", "rejected", "shuffled")
KINDS = CONTENT + CONTROLS


@dataclass
class TaskRubrics:
    """One task's rubric per kind (None: the kind is absent for it, `notes` says why)."""

    bundles: dict[str, RubricBundle | None]
    notes: dict[str, str] = field(default_factory=dict)
    candidates: Candidates | None = None
    alignment: Alignment | None = None

    def to_dict(self) -> dict:
        c, a = self.candidates, self.alignment
        return {"rubrics": {k: (None if b is None else list(b.criteria)) for k, b in self.bundles.items()},
                "notes": dict(self.notes),
                "candidates": None if c is None else {"bundles": [list(b.criteria) for b in c.bundles],
                                                      "errors": list(c.errors), "reason": c.reason},
                "alignment": None if a is None else a.to_dict()}


def select_bundles(config, engine, tokenizer, verifier, groups, seed: int) -> tuple[list, list]:
    """(Candidates, Alignment) per group, by the trainer's write → verify → select stages with the
    config's rubric settings (bundles.sampling, rubric.min_rho; the selection rng of a step 0)."""
    r = config.rubric
    method = ORSD(config)
    request = method.bundle_request(groups)
    written = bundles.write_bundles(engine, tokenizer, request.groups, request.count,
                                    bundles.sampling(r), r.transcript_chars, r.generation_template or None)
    candidates = method.candidates(groups, request, written)
    scores = bundles.verify(verifier, groups, candidates, r.transcript_chars)
    selection = bundles.select(groups, candidates, scores, method.selection, np.random.default_rng((seed, 0)),
                               r.min_rho)  # a B* at or below rubric.min_rho is set aside, as in training
    return candidates, selection


def task_rubrics(tasks: list, candidates: list[Candidates], selection: list[Alignment], seed: int,
                 spare_task=None) -> list[TaskRubrics]:
    """Every kind's rubric per task. `spare_task`: the misleading rubric's source when only one
    task is probed (another task of the split)."""
    chosen = [c.bundles[s.index] if s is not None and s.index is not None else None
              for c, s in zip(candidates, selection)]
    out = []
    for i, task in enumerate(tasks):
        other = tasks[(i + 1) % len(tasks)] if len(tasks) > 1 else spare_task
        best = chosen[i]
        rubrics = {"oracle": RubricBundle(oracle_rubric(task), source="oracle"),
                   "misleading": RubricBundle(oracle_rubric(other), source=f"oracle of {other.id}"),
                   "selected": best}
        notes = {"misleading": f"the oracle rubric of task {other.id}"}
        if best is None:
            why = candidates[i].reason or (selection[i].reason if selection[i] is not None else "") or "no B*"
            notes["selected"] = f"no B*: {why}"
        rubrics["content_free"] = content_free_bundle(best if best is not None else rubrics["oracle"])
        notes["content_free"] = "lengths of B*" if best is not None else "no B*: lengths of the oracle rubric"
        rubrics["rejected"] = (rejected_bundle(candidates[i].bundles, selection[i].rho, selection[i].index)
                               if best is not None else None)
        if best is not None and rubrics["rejected"] is None:
            notes["rejected"] = "B* was the only candidate"
        others = [b for j, b in enumerate(chosen) if j != i and b is not None]
        rubrics["shuffled"] = (shuffled_bundle(best, others, random.Random(f"probe:{seed}:shuffled:{task.id}"))
                               if best is not None else None)
        if best is not None and rubrics["shuffled"] is None:
            notes["shuffled"] = "no other probed task's B* holds a criterion this B* lacks"
        for kind in ("rejected", "shuffled"):
            if best is None:
                notes[kind] = "no B*"
        out.append(TaskRubrics(rubrics, notes, candidates[i], selection[i]))
    return out


def rubric_token_ids(tokenizer, bundle: RubricBundle | None, config) -> list[int] | None:
    """The rubric message's ids as the trainer splices B* (Trainer.paired_replay)."""
    if bundle is None:
        return None
    text = rubric.rubric_context(bundle, template=config.rubric.context_template or None)
    return bundles.rubric_ids(tokenizer, text, config.rubric.context_role)
