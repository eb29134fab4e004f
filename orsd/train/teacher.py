"""The distillation term of the OPSD family in the step: the no-grad teacher pass over the
privileged contexts, and what the update adds per micro-batch (orsd/methods/distill.py defines
the term; research/baselines.md §2–4 the methods).

Memory: nothing holds a tokens × vocab tensor beyond one chunk. The teacher pass keeps, per
response token with a teacher, log q(y) (4 bytes) and, by the divergence's view,
  topk  the teacher's k ids and log-probs (int32 + f32: 8·k bytes; + 4 for the tail's log-mass), or
  full  the teacher's final hidden state (H values in the forward's dtype: 2·H bytes in bf16);
the update turns those hidden states into teacher logits again inside its checkpointed chunks of
`train_logprobs` (under no grad, with the teacher's own LM head), next to the student's logits.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import torch

from orsd.methods.distill import Distillation, outside_logmass, topk_support

from .bundles import rubric_ids
from .forward import replay_logprobs, response_hidden
from .head import final_logits
from .packing import Packed, splice_privileged
from .records import Group, TurnRecord
from .replay import ReplayResult, ReplaySpec

#: tokens per checkpointed chunk of the update when the divergence needs whole distributions
#: (the student's and the teacher's logits, the mixture and their products are alive together)
DISTRIBUTION_CHUNK_TOKENS = 256


@dataclass
class Teacher:
    """The teacher's view of a step's response tokens, on the plain packing's positions [L]."""

    weight: torch.Tensor  # [L] f32: w_p, the coefficient of ℓ_p; 0 where the token has no teacher
    logprobs: torch.Tensor  # [L] f32: log q(y_p) (temperature-scaled); 0 where no teacher
    rows: torch.Tensor  # [L] int64: row of position p in the tensors below; -1 where no teacher
    topk_ids: torch.Tensor | None = None  # [R, k] int32 (view "topk")
    topk_logprobs: torch.Tensor | None = None  # [R, k] f32
    topk_tail: torch.Tensor | None = None  # [R] f32: log-mass outside the k ids (spec.tail)
    hidden: torch.Tensor | None = None  # [R, H] final hidden states (view "full")
    model: object = None  # whose LM head turns `hidden` into logits (view "full")
    metrics: dict = field(default_factory=dict)  # {name: (value, reduction)}

    @property
    def stored_bytes(self) -> int:
        kept = [self.weight, self.logprobs, self.rows, self.topk_ids, self.topk_logprobs, self.topk_tail,
                self.hidden]
        return sum(t.numel() * t.element_size() for t in kept if t is not None)


@torch.no_grad()
def teacher_pass(model, packed: Packed, records: list[TurnRecord], privileged: list[list[int] | None],
                 coef: list[float], spec: Distillation, replay: ReplaySpec, chunk_tokens: int = 1024) -> Teacher:
    """One no-grad forward of `model` over each record's context with `privileged[s]` spliced at its
    slot (None: no teacher for record s) and the same response ids; w_p = coef[s] on its response
    tokens except spec.edge_fraction of them at each end."""
    spliced = splice_privileged(packed, records, privileged)
    length = len(packed.ids)
    taught = packed.response_mask & spliced.eligible[packed.seq_ids]
    plain = taught.nonzero().squeeze(-1)  # positions with a teacher, in packing order
    rows = torch.full((length,), -1, dtype=torch.long)
    rows[plain] = torch.arange(len(plain))
    weight = torch.zeros(length, dtype=torch.float32)
    weight[plain] = response_weights(packed, coef, spliced.eligible, spec.edge_fraction)[plain]
    logprobs = torch.zeros(length, dtype=torch.float32)
    teacher = Teacher(weight, logprobs, rows)
    view = spec.teacher_view
    if view == "token":  # log q(y) only: the replay's own (fused) path
        lp = replay_logprobs(model, spliced.ids, spliced.cu_seqlens, spliced.response_mask, replay.temperature,
                             replay.token_budget, replay.fused, replay.lockstep)
        logprobs[plain] = lp[spliced.pos_map[plain]]
        return teacher
    row_of_spliced = torch.full((len(spliced.ids),), -1, dtype=torch.long)
    row_of_spliced[spliced.pos_map[plain]] = torch.arange(len(plain))
    row_lp = torch.zeros(len(plain), dtype=torch.float32)
    if view == "topk":
        teacher.topk_ids = torch.zeros((len(plain), spec.top_k), dtype=torch.int32)
        teacher.topk_logprobs = torch.zeros((len(plain), spec.top_k), dtype=torch.float32)
        if spec.tail:
            teacher.topk_tail = torch.zeros(len(plain), dtype=torch.float32)
    else:
        teacher.model = model
    head = model.get_output_embeddings()
    for flat, hidden in response_hidden(model, spliced.ids, spliced.cu_seqlens, spliced.response_mask,
                                        replay.token_budget, replay.lockstep):
        row = row_of_spliced[flat]
        targets = spliced.ids[flat].to(hidden.device)
        for start in range(0, len(flat), chunk_tokens):
            part = slice(start, start + chunk_tokens)
            logp = torch.log_softmax(final_logits(model, head(hidden[part])).float() / replay.temperature, -1)
            row_lp[row[part]] = logp.gather(-1, targets[part, None]).squeeze(-1).cpu()
            if view == "topk":
                values, ids = logp.topk(spec.top_k, dim=-1)
                teacher.topk_ids[row[part]] = ids.to(torch.int32).cpu()
                teacher.topk_logprobs[row[part]] = values.cpu()
                if spec.tail:
                    teacher.topk_tail[row[part]] = outside_logmass(logp, ids).cpu()
        if view == "full":
            if teacher.hidden is None:
                teacher.hidden = torch.zeros((len(plain), hidden.shape[-1]), dtype=hidden.dtype)
            teacher.hidden[row] = hidden.cpu()
    logprobs[plain] = row_lp
    return teacher


def privileged_turns(groups: list[Group], texts: list, coefs: list[float], tokenizer, role: str,
                     max_context_tokens: int) -> tuple[list[TurnRecord], list[list[int] | None], list[float]]:
    """Per record of `groups` in paired replay's order: the record, the ids of its teacher text
    (`texts[g][n][t]`: Method.teacher_contexts) as spliced at the rubric slot like B*, and its
    group's coefficient. None where the turn has no text, no slot, or the text would push its context
    past `max_context_tokens`: no teacher there, as ORSD's e = 0."""
    records, privileged, coef, ids_of = [], [], [], {}
    for group, group_texts, group_coef in zip(groups, texts, coefs):
        for trajectory, turn_texts in zip(group.trajectories, group_texts):
            for record, text in zip(trajectory.records, turn_texts):
                if text is not None and text not in ids_of:
                    ids_of[text] = rubric_ids(tokenizer, text, role)
                ids = ids_of[text] if text is not None else None
                records.append(record)
                privileged.append(ids if record.takes(ids, max_context_tokens) else None)
                coef.append(group_coef)
    return records, privileged, coef


def with_metrics(teacher: Teacher, replay: ReplayResult, context_metrics: dict) -> Teacher:
    """`teacher` with its step metrics: the method's own (`context_metrics`), the share of response
    tokens taught, the mean gap log q − log π_old over them, and the bytes the teacher view keeps."""
    taught = teacher.weight > 0
    gap = (teacher.logprobs - replay.old_logprobs)[taught]
    response = replay.packed.response_mask
    return dataclasses.replace(teacher, metrics={
        **context_metrics,
        "teacher_token_fraction": (float(taught[response].float().mean()) if response.any() else 0.0, "tokens"),
        "teacher_gap_mean": (float(gap.mean()) if len(gap) else 0.0, "tokens"),
        "teacher_stored_bytes": (teacher.stored_bytes, "sum")})


def response_weights(packed: Packed, coef: list[float], eligible: torch.Tensor, edge_fraction: float) -> torch.Tensor:
    """[L]: coef[s] on record s's response tokens, 0 on the first and last ceil(edge_fraction·n) of
    its n response tokens (CriPO's safeguard; at least one at each end once the fraction is > 0)."""
    weight = torch.zeros(len(packed.ids), dtype=torch.float32)
    cu = packed.cu_seqlens.tolist()
    for s in eligible.nonzero().squeeze(-1).tolist():
        response = packed.response_mask[cu[s]:cu[s + 1]].nonzero().squeeze(-1) + cu[s]
        edge = math.ceil(edge_fraction * len(response)) if edge_fraction > 0 else 0
        kept = response[edge:len(response) - edge]
        weight[kept] = float(coef[s])
    return weight


class DistillTerm:
    """The term as the update sees it, one micro-batch (`flat`: its packed positions) at a time."""

    def __init__(self, spec: Distillation, teacher: Teacher, temperature: float):
        self.spec, self.teacher, self.temperature = spec, teacher, temperature
        self.pg_coef = spec.pg_coef
        self.empty = not bool((teacher.weight > 0).any())  # e.g. no group had a B* this step
        self.chunk_tokens = DISTRIBUTION_CHUNK_TOKENS if spec.teacher_view != "token" and not self.empty else 1024

    def chunk_term(self, flat: torch.Tensor):
        """(fn, tensors) for train_logprobs' chunks, or None when ℓ needs only log p(y)."""
        view, t = self.spec.teacher_view, self.teacher
        if view == "token" or self.empty:
            return None
        rows = t.rows[flat].clamp(min=0)  # no-teacher rows read row 0 (finite); their weight is 0
        if view == "topk":
            kept = (t.topk_ids[rows], t.topk_logprobs[rows]) + ((t.topk_tail[rows],) if self.spec.tail else ())
            return functools.partial(_topk_divergence, self.spec), kept
        return functools.partial(_full_divergence, self.spec, t.model, self.temperature), (t.hidden[rows],)

    def per_token(self, flat: torch.Tensor, logprobs: torch.Tensor,
                  chunk_values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(w·ℓ, ℓ, has-teacher mask) for the micro-batch's tokens, on logprobs' device."""
        device = logprobs.device
        weight = self.teacher.weight[flat].to(device)
        if self.empty:
            zeros = torch.zeros_like(logprobs)
            return zeros, zeros, weight > 0
        if chunk_values is None:
            divergence = self.spec.on_token(logprobs, self.teacher.logprobs[flat].to(device))
        else:
            divergence = chunk_values
        active = weight > 0
        return torch.where(active, weight * divergence, torch.zeros_like(divergence)), divergence, active


def _topk_divergence(spec: Distillation, student_logp: torch.Tensor, ids: torch.Tensor,
                     teacher_topk: torch.Tensor, teacher_tail: torch.Tensor | None = None) -> torch.Tensor:
    student = student_logp.gather(-1, ids.long())
    tails = (outside_logmass(student_logp, ids), teacher_tail) if spec.tail else None
    return spec.on_support(*topk_support(student, teacher_topk, tails))


def _full_divergence(spec: Distillation, teacher_model, temperature: float, student_logp: torch.Tensor,
                     hidden: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # the teacher's logits of these rows, again from its stored hidden states
        head = teacher_model.get_output_embeddings()
        logits = final_logits(teacher_model, head(hidden.to(head.weight.dtype))).float() / temperature
        teacher_logp = torch.log_softmax(logits, -1)
    return spec.on_support(student_logp, teacher_logp)
