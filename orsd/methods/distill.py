"""Self-distillation (the OPSD family: opsd, grpo_opsd, sdar, cripo): what the distillation term is,
the per-token divergences, and which privileged context the teacher sees.

The teacher is the policy itself with privileged context spliced into the turn's context at the
record's slot, exactly as ORSD splices B* (research/baselines.md §2): the student is π_θ(·|x, y_<t),
the teacher q = π_T(·|x, c, y_<t) on the *same* sampled response tokens y, under no gradient.
The term enters the per-token loss before the Eq. 14 reduction (orsd/train/loss.py):

    f_p = pg_coef · pg_p + η · k3_p + w_p · ℓ_p

w_p is the method's coefficient (λ; CriPO's β̃ = 2sβ) on tokens with a teacher and 0 elsewhere, so
tokens without one count like ORSD's e = 0 tokens. Divergences (per position p, all in nats):
  jsd      D_β(p, q) = β·KL(q‖m) + (1−β)·KL(p‖m), m = βq + (1−β)p, over the full vocabulary;
           β = 0 is forward KL(q‖p) and β = 1 reverse KL(p‖q), special cases as in OPSD's
           generalized_jsd_loss (the mixture form itself vanishes at both ends);
  topk     D_β on the teacher's top-k ids, both sides renormalised over the k (OPSD's top-k loss)
           or with a (k+1)-th bucket holding the rest of each side's mass (SDPO's tail), taken by
           a log-sum-exp over the other ids (`outside_logmass`), not as 1 − Σ p;
  sampled  sg[log p(y) − log q(y)] · log p(y): the reverse-KL policy-gradient estimator (OPSD's
           "tinker" loss), no importance weight, as the source;
  sdar     g·(sg[log q(y)] − log p(y)), g = sg[σ(β_g·δ)], δ = sg[log q(y) − log p(y)] (SDAR).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from orsd import rubric

from .base import Method

DIVERGENCES = ("jsd", "topk", "sampled", "sdar")

#: the privileged message built from a successful sibling's transcript (distill_context=success)
SUCCESS_TEMPLATE = "A successful attempt at this task (privileged reference):\n{transcript}"


@dataclass(frozen=True)
class Distillation:
    """The distillation term of a method (see the module docstring)."""

    divergence: str  # one of DIVERGENCES
    coef: float  # λ (CriPO: β); the teacher request may scale it per group
    pg_coef: float = 1.0  # 0: the term replaces the PG loss (opsd); k3 stays
    teacher: str = "rollout"  # "rollout": π_old (the policy before this update) | "reference": frozen π_ref
    beta: float = 0.5  # β of D_β (jsd, topk)
    top_k: int = 0  # topk: teacher ids kept per position
    tail: bool = False  # topk: a tail bucket instead of renormalising
    gate_beta: float = 5.0  # sdar: β_g
    clamp: float = 0.0  # ℓ_p ≤ clamp (CriPO: 10); 0 = no cap
    edge_fraction: float = 0.0  # share of each response's first and last tokens given no term (CriPO: 1 %)

    def __post_init__(self):
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence={self.divergence!r}: expected one of {DIVERGENCES}")
        if self.divergence == "topk" and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k}: the topk divergence needs k >= 1")

    @property
    def teacher_view(self) -> str:
        """What the no-grad teacher pass keeps per response token: "full" (the final hidden state,
        turned into logits again inside the update's chunks), "topk" (k ids and log-probs) or
        "token" (log q of the sampled token only)."""
        return {"jsd": "full", "topk": "topk"}.get(self.divergence, "token")

    def on_support(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """ℓ per row from the two log-distributions over one support (the vocabulary or top-k)."""
        return self.capped(generalized_jsd(student, teacher.detach(), self.beta))

    def on_token(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """ℓ per token from the sampled token's log-probs (student with grad, teacher without)."""
        if self.divergence == "sampled":
            return self.capped(sampled_reverse_kl(student, teacher))
        return self.capped(sdar_loss(student, teacher, self.gate_beta))

    def capped(self, loss: torch.Tensor) -> torch.Tensor:
        return loss.clamp(max=self.clamp) if self.clamp else loss


def kl(log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """KL(a‖b) = Σ a·(log a − log b) over the last dim, from log-probs."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """D_β(p, q) per row from log-probs p (student), q (teacher) over the same support."""
    if beta == 0.0:
        return kl(teacher, student)
    if beta == 1.0:
        return kl(student, teacher)
    mixture = torch.logaddexp(teacher + math.log(beta), student + math.log1p(-beta))
    return beta * kl(teacher, mixture) + (1.0 - beta) * kl(student, mixture)


def topk_support(student_at_ids: torch.Tensor, teacher_topk: torch.Tensor,
                 tails: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides on the teacher's top-k ids [.., k]: renormalised over the k (tails None, OPSD), or
    with a (k+1)-th bucket holding each side's log-mass outside the k, `tails` = (student's,
    teacher's) [..] from `outside_logmass` (SDPO's tail)."""
    if tails is None:
        return torch.log_softmax(student_at_ids, -1), torch.log_softmax(teacher_topk, -1)
    student_tail, teacher_tail = tails
    return (torch.cat([student_at_ids, student_tail.unsqueeze(-1)], -1),
            torch.cat([teacher_topk, teacher_tail.unsqueeze(-1)], -1))


#: floor of a tail's log-mass: finite where the k ids hold all the mass (k = V), so that both
#: sides' empty buckets add ~1e-38·(finite) = 0 to the divergence instead of 0·inf = NaN
TAIL_FLOOR = math.log(torch.finfo(torch.float32).tiny)


def outside_logmass(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log Σ_{v ∉ ids} p_v per row of a full log-distribution [.., V], from a log-sum-exp over the
    other ids. 1 − Σ_k p_k keeps little but the rounding of the k float32 probabilities where they
    hold nearly all the mass (teacher logits [15, 15, 0], k = 2: a tail of 1.5e-7, two float32
    steps below 1; ℓ came out 4.6776 for 4.5945). It costs one [.., V] copy (of the update's chunk)."""
    outside = logp.scatter(-1, ids.long(), float("-inf"))
    return torch.logsumexp(outside, -1).clamp(min=TAIL_FLOOR)


def sampled_reverse_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """sg[log p − log q]·log p: its gradient (log p − log q)·∇log p estimates ∇KL(p‖q) on samples."""
    return (student - teacher).detach() * student


def sdar_gate(delta: torch.Tensor, gate_beta: float) -> torch.Tensor:
    """g = σ(β_g·δ): near 1 where the teacher likes the sampled token more than the student."""
    return torch.sigmoid(gate_beta * delta)


def sdar_loss(student: torch.Tensor, teacher: torch.Tensor, gate_beta: float) -> torch.Tensor:
    """L_SDAR per token = g·(sg[log q] − log π_θ), δ from the live student log-prob (SDAR's code)."""
    teacher = teacher.detach()
    gate = sdar_gate(teacher - student.detach(), gate_beta)
    return gate * (teacher - student)


@dataclass
class TeacherContexts:
    """What the teacher sees per group, trajectory and turn (None: no teacher for that turn), the
    coefficient of ℓ per group, and the method's metrics {name: (value, reduction)}."""

    texts: list[list[list[str | None]]]
    coef: list[float]
    metrics: dict = field(default_factory=dict)


class SelfDistillation(Method):
    """Base of the OPSD family. The privileged context (method.distill_context) is the selected
    rubric B* — so bundles, verifier and Spearman selection run as in ORSD — or a successful
    trajectory of the same group (SDPO's choice; no bundles, no verifier). Subclasses set
    `self.distillation` in __init__."""

    name = "self_distillation"

    def __init__(self, config, context: str | None = None) -> None:
        super().__init__(config)
        self.context = context or config.method.distill_context
        self.context_template = config.rubric.context_template or None
        self.transcript_chars = config.rubric.transcript_chars
        if self.context == "rubric":
            self.num_bundles = config.rubric.num_bundles
            self.calls_verifier = True
            self.selection = "spearman"
            self.skips_equal_reward_groups = True  # no ρ, hence no B*, for equal rewards

    def rubric_for(self, group, candidates, selection):
        """No Δ pass in paired replay (α = 0): the teacher stage splices the context itself."""
        return None

    @staticmethod
    def selected_bundle(candidates, selection):
        """B* of a group, or None (no bundle selected)."""
        return candidates.bundles[selection.index] if selection is not None and selection.index is not None else None

    def teacher_contexts(self, groups: Sequence, advantages, candidates: Sequence, scores: Sequence,
                         selection: Sequence, step: int) -> TeacherContexts:
        """One privileged text per turn: B*'s rubric message for every turn of its group, or the
        transcript of a successful sibling (not the trajectory itself) for every turn."""
        texts = []
        for group, cands, chosen in zip(groups, candidates, selection):
            if self.context == "success":
                texts.append(self.success_texts(group))
                continue
            bundle = self.selected_bundle(cands, chosen)
            text = rubric.rubric_context(bundle, template=self.context_template) if bundle is not None else None
            texts.append([[text] * len(t.records) for t in group.trajectories])
        with_teacher = [any(x is not None for turns in g for x in turns) for g in texts]
        return TeacherContexts(texts, [self.distillation.coef] * len(groups),
                               {"groups_with_teacher": (sum(with_teacher) / max(len(groups), 1), "mean")})

    def success_texts(self, group) -> list[list[str | None]]:
        won = [i for i, t in enumerate(group.trajectories) if t.won]
        out = []
        for i, trajectory in enumerate(group.trajectories):
            sibling = next((j for j in won if j != i), None)
            text = None
            if sibling is not None:
                other = group.trajectories[sibling]
                text = SUCCESS_TEMPLATE.format(transcript=rubric.format_transcript(
                    other.observations, other.actions, max_chars=self.transcript_chars))
            out.append([text] * len(trajectory.records))
        return out
