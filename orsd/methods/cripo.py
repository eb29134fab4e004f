"""CriPO (criterion-level self-distillation; the paper given to the team, no code found), on ORSD's
rubric machinery: the criteria are B*'s items (weight 1 each), r_ij = [verifier score ≥
cripo_threshold], A_i = ORSD's A_GRPO (research/baselines.md §4).

Per group, with S_j = {i : r_ij = 1}:
- unexplored: S_j = ∅ (every trajectory scored, none satisfies c_j);
- suppressed: S_j ≠ ∅ and Σ_{i∈S_j} A_i < 0 ("negative"), or Σ = 0 and |S_j| ≤ N/2 ("zero").
Behaviour injection for unexplored criteria: the teacher sees the turn's context, the turn's own
response and up to cripo_max_criteria unexplored criteria under a "revise your response" message;
ℓ = min(KL(sg q ‖ p), 10) on the teacher's top-k (k = 64, with a tail bucket as SDPO), the first
and last 1 % of each response's tokens masked; weight β̃ = 2·s·β, s = share of the group's
trajectories with A_i ≥ 0 (the source's t = 1 form), β decaying linearly to 0 over the last 25 %
of the run. The targeted advantage correction for suppressed criteria is NOT provided: its formula
and τ_flip are missing from the source (docs/methods.md); suppressed criteria are counted only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .distill import Distillation, SelfDistillation, TeacherContexts

UNEXPLORED, SUPPRESSED_NEGATIVE, SUPPRESSED_ZERO = "unexplored", "suppressed_negative", "suppressed_zero"

#: the privileged message of behaviour injection (their Fig. 3 template, reduced to one turn)
REVISION_TEMPLATE = ("Your previous response at this step was:\n{response}\n\n"
                     "It does not yet satisfy these criteria of the task's process rubric:\n{criteria}\n\n"
                     "Revise your response so that it satisfies them.")


def satisfied(scores: np.ndarray, threshold: float) -> np.ndarray:
    """r_ij ∈ {0, 1} from verifier scores [N, K] in [0, 1]; NaN (unscored) stays NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.where(np.isfinite(scores), (scores >= threshold).astype(np.float64), np.nan)


def criterion_status(r: np.ndarray, advantages: Sequence[float], tolerance: float = 1e-6) -> list[str]:
    """Per criterion: UNEXPLORED, SUPPRESSED_NEGATIVE, SUPPRESSED_ZERO or "" (neither).

    A criterion with an unscored trajectory and no satisfying one is undetermined (""), so a
    verifier failure never makes a criterion look unexplored. Σ A is zero within `tolerance`·N."""
    r = np.asarray(r, dtype=np.float64)
    a = np.asarray(advantages, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] != a.shape[0]:
        raise ValueError(f"r shape {r.shape} and advantages shape {a.shape}: expected [N, K] and [N]")
    n = len(a)
    out = []
    for column in r.T:
        members = column == 1.0
        if not members.any():
            out.append(UNEXPLORED if np.isfinite(column).all() else "")
            continue
        total = float(a[members].sum())
        if total < -tolerance * n:
            out.append(SUPPRESSED_NEGATIVE)
        elif abs(total) <= tolerance * n and members.sum() <= n / 2:
            out.append(SUPPRESSED_ZERO)
        else:
            out.append("")
    return out


def nonnegative_share(advantages: Sequence[float]) -> float:
    """s: the share of the group's trajectories with A_i ≥ 0."""
    a = np.asarray(advantages, dtype=np.float64)
    return float((a >= 0).mean()) if a.size else 0.0


def decay(step: int, steps: int, fraction: float) -> float:
    """β's schedule: 1, then linearly to 0 over the last `fraction` of `steps` (0-based step)."""
    if fraction <= 0 or steps <= 0:
        return 1.0
    return float(min(1.0, max(0.0, (steps - step) / (fraction * steps))))


def _mean_or_none(counts: list[int]) -> float | None:
    """Per group with B* (None: no group had one this step)."""
    return float(np.mean(counts)) if counts else None


class CriPO(SelfDistillation):
    name = "cripo"

    def __init__(self, config) -> None:
        super().__init__(config, context="rubric")  # the criteria come from B* and its scores
        m = config.method
        self.threshold = m.cripo_threshold
        self.max_criteria = m.cripo_max_criteria
        self.decay_fraction = m.cripo_decay_fraction
        self.steps = config.train.steps
        self.distillation = Distillation(divergence="topk", coef=m.distill_coef, pg_coef=1.0,
                                         teacher=m.distill_teacher, beta=0.0, top_k=m.cripo_topk, tail=True,
                                         clamp=m.cripo_clamp, edge_fraction=m.cripo_edge_fraction)

    def teacher_contexts(self, groups, advantages, candidates, scores, selection, step) -> TeacherContexts:
        texts, coef, unexplored_counts, suppressed_counts = [], [], [], []
        schedule = decay(step, self.steps, self.decay_fraction)
        for g, group in enumerate(groups):
            bundle = self.selected_bundle(candidates[g], selection[g])
            episode = advantages.episode[g]
            coef.append(2.0 * nonnegative_share(episode) * self.distillation.coef * schedule)
            if bundle is None or scores[g] is None:
                texts.append([[None] * len(t.records) for t in group.trajectories])
                continue
            status = criterion_status(satisfied(scores[g][selection[g].index].scores, self.threshold), episode)
            unexplored = [c for c, s in zip(bundle.criteria, status) if s == UNEXPLORED][:self.max_criteria]
            unexplored_counts.append(status.count(UNEXPLORED))
            suppressed_counts.append(status.count(SUPPRESSED_NEGATIVE) + status.count(SUPPRESSED_ZERO))
            listed = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(unexplored))
            texts.append([[REVISION_TEMPLATE.format(response=r.response_text, criteria=listed) if unexplored else None
                           for r in t.records] for t in group.trajectories])
        injected = [any(x is not None for turns in g for x in turns) for g in texts]
        metrics = {"groups_with_teacher": (sum(injected) / max(len(groups), 1), "mean"),
                   "cripo_unexplored_criteria": (_mean_or_none(unexplored_counts), "mean"),
                   "cripo_suppressed_criteria": (_mean_or_none(suppressed_counts), "mean"),
                   "cripo_beta_schedule": (schedule, "same")}
        return TeacherContexts(texts, coef, metrics)
