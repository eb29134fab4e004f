"""What Δ is measured against, where it applies, and how large it is: extensions beyond the paper
(issue 60; docs/training.md "What Δ measures").

The paper's Δ = lp(response | context + B*) − lp(response | context) also measures that a block of
rubric-shaped text sits in the context at all. With `rubric.delta_baseline` set, each group with B*
also gets a control bundle (orsd/rubric/controls.py), rendered by the same template and role, made
exactly as many tokens as B*'s message (`control_ids`) and spliced at the same slot, so its
response tokens sit at the same positions as under B*; Δ = lp(· | context + B*) − lp(· | context +
control). Both contexts are forwarded in one no-grad pass (train/shaping.py: the control's rows
continue from the same kept plain keys/values as B*'s). With `rubric.delta_mask: format`, the
response tokens that only spell the answer format's tags get e = 0 (`format_keep`).
`shaping_metrics` says how large α·e·Δ is against A_GRPO on every step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from orsd import rubric
from orsd.envs.actions import scaffold_spans
from orsd.rubric import controls

from .bundles import rubric_ids


@dataclass
class Control:
    """A group's control bundle (None where there is none: `reason` says why)."""

    kind: str
    bundle: rubric.RubricBundle | None
    reason: str = ""

    def to_record(self) -> dict:
        return {"kind": self.kind, "criteria": list(self.bundle.criteria) if self.bundle is not None else None,
                "reason": self.reason}


def control_bundles(kind: str, candidates: list, selection: list, rubrics: list, seed: int, step: int) -> list:
    """Per group: a Control where the group has B* (`rubrics[i]`) and `kind` is not "none", else None.
    `shuffled` draws from the other groups' B* of this step (this rank's, under data parallelism)
    with an rng seeded by (train.seed, step), so a resumed run draws what an unbroken one did."""
    if kind == "none":
        return [None] * len(rubrics)
    rng = random.Random(f"delta_baseline:{seed}:{step}")
    out = []
    for i, (cands, chosen, selected) in enumerate(zip(candidates, selection, rubrics)):
        if selected is None:
            out.append(None)
            continue
        if kind == "content_free":
            bundle, reason = controls.content_free_bundle(selected), ""
        elif kind == "rejected":
            index = chosen.index if chosen is not None else None
            bundle = (controls.rejected_bundle(cands.bundles, chosen.rho, index)
                      if index is not None and cands is not None else None)
            reason = "" if bundle is not None else "no other candidate bundle in the group: e = 0"
        elif kind == "shuffled":
            others = [b for j, b in enumerate(rubrics) if j != i and b is not None]
            bundle = controls.shuffled_bundle(selected, others, rng)
            reason = "" if bundle is not None else "no other group's B* with other criteria this step: e = 0"
        else:
            raise ValueError(f"rubric.delta_baseline={kind!r}: expected one of {controls.CONTROLS}")
        out.append(Control(kind, bundle, reason))
    return out


def _frame(tokenizer, role: str) -> tuple[list[int], list[int]] | None:
    """The ids the chat template puts before and after a message's content in `rubric_ids`: the
    common prefix and suffix of two one-letter messages. None where the template renders none."""
    a, b = rubric_ids(tokenizer, "A", role), rubric_ids(tokenizer, "Z", role)
    if a is None or b is None:
        return None
    opening = []
    for x, y in zip(a, b):
        if x != y:
            break
        opening.append(x)
    closing = []
    for x, y in zip(reversed(a[len(opening):]), reversed(b[len(opening):])):
        if x != y:
            break
        closing.insert(0, x)
    return opening, closing


def control_ids(tokenizer, bundle: rubric.RubricBundle, length: int, template: str | None,
                role: str) -> list[int] | None:
    """The control's rubric message as exactly `length` ids (B*'s), so that every later token sits at
    the same position under the control as under B*: rendered as B* is (`rubric_context`, the
    chat template's message of `role`), then its content cut to fit, or padded with content-free
    sentences (`controls.filler`) and cut, inside the message. None where the template's message
    frame cannot be told apart from its content, or leaves no room."""
    frame = _frame(tokenizer, role)
    if frame is None:
        return None
    opening, closing = frame
    room = length - len(opening) - len(closing)
    if room < 1:
        return None
    text, pads = rubric.rubric_context(bundle, template=template), 0
    while True:
        ids = rubric_ids(tokenizer, text + (" " + controls.filler(pads) if pads else ""), role)
        if ids is None or ids[:len(opening)] != opening or ids[len(ids) - len(closing):] != closing:
            return None
        body = ids[len(opening):len(ids) - len(closing)]
        if len(body) >= room:
            return opening + body[:room] + closing
        if pads > room:  # a template that drops what is added to the message: it cannot be padded
            return None
        pads += 1 + (room - len(body)) // 12  # a content-free sentence is 9-22 tokens


def format_keep(tokenizer, response_ids: list[int], pieces: dict[int, str]) -> list[bool]:
    """Per response token, False where it only spells the answer format's scaffold (the think and
    action tags, with the whitespace around them: envs.actions.scaffold_spans), True elsewhere. A
    token is scaffold when every character it decodes to lies in a tag: one that also carries a
    character of the thought or the command (`]</`) keeps its Δ. Tokens are decoded one by one
    (`pieces` caches them), so a reply spelled in any tokenization is matched; a piece of a
    multi-byte character decodes to U+FFFD, which is in no tag."""
    texts = []
    for i in response_ids:
        if i not in pieces:
            pieces[i] = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        texts.append(pieces[i])
    covered = np.zeros(sum(len(t) for t in texts) + 1, dtype=np.int64)
    for start, end in scaffold_spans("".join(texts)):
        covered[start + 1:end + 1] = 1
    covered = np.cumsum(covered)  # covered[e] - covered[s]: characters of [s, e) inside a tag
    keep, start = [], 0
    for text in texts:
        end = start + len(text)
        keep.append(not (end > start and covered[end] - covered[start] == end - start))
        start = end
    return keep


@dataclass
class ReplayInputs:
    """paired_replay's per-record inputs, in the order of the groups' trajectories and turns."""

    records: list
    advantages: list[float]
    rubrics: list  # B*'s message ids, or None (no B*, no slot, over the context budget, no control)
    controls: list | None  # the control's ids (B*'s length), or None; None for all: the paper's Δ
    keep: list | None  # per response token, False where Δ is kept off (rubric.delta_mask)


def replay_inputs(tokenizer, config, groups: list, advantages, rubrics: list, controls_: list | None) -> ReplayInputs:
    """Per record: its turn advantage, the ids of its group's rubric message and control (None where
    the group has none or they do not fit the context budget: e = 0 there), and the format mask."""
    r, limit = config.rubric, config.rollout.max_context_tokens
    template = r.context_template or None
    controls_ = controls_ if r.delta_baseline != "none" and controls_ is not None else None
    out = ReplayInputs([], [], [], [] if controls_ is not None else None, [] if r.delta_mask == "format" else None)
    pieces: dict[int, str] = {}
    for g, (group, bundle, group_advantages) in enumerate(zip(groups, rubrics, advantages.turn)):
        ids = control = None
        if bundle is not None:
            ids = rubric_ids(tokenizer, rubric.rubric_context(bundle, template=template), r.context_role)
        if controls_ is not None:
            made = controls_[g]
            control = (control_ids(tokenizer, made.bundle, len(ids), template, r.context_role)
                       if ids is not None and made is not None and made.bundle is not None else None)
            if control is None:
                ids = None  # no control, no Δ: B*'s rows are not forwarded either
        for trajectory, turn_advantages in zip(group.trajectories, group_advantages):
            for record, advantage in zip(trajectory.records, turn_advantages):
                # the control has B*'s length, so it fits wherever B* does
                fits = record.takes(ids, limit)
                out.records.append(record)
                out.advantages.append(advantage)
                out.rubrics.append(ids if fits else None)
                if out.controls is not None:
                    out.controls.append(control if fits else None)
                if out.keep is not None:
                    out.keep.append(format_keep(tokenizer, record.response_ids, pieces) if fits else None)
    return out


def shaping_metrics(replay, alpha: float) -> dict:
    """{name: (value, reduction)}: the distribution over response tokens with e = 1 and A_GRPO ≠ 0 of
    |α·e·Δ| / |A_GRPO| (tokens of a group whose rewards are equal have A_GRPO = 0 and no ratio),
    the mean e·Δ on each eligible turn's first response token (0 there under the format mask), and
    with a control the paper's Δ on the same tokens. Percentiles cannot be merged across ranks:
    they are weighted by each rank's response tokens ("tokens"), as the means."""
    valid, grpo, delta = replay.valid, replay.grpo_advantages, replay.delta
    if grpo is None:
        return {}
    counted = valid & (grpo != 0)
    ratio = (alpha * delta[counted]).abs() / grpo[counted].abs()
    out = {"shaping_ratio_mean": float(ratio.mean()) if len(ratio) else None,
           "shaping_ratio_median": float(ratio.median()) if len(ratio) else None,
           "shaping_ratio_p90": float(torch.quantile(ratio.double(), 0.9)) if len(ratio) else None}
    response, seq_ids = replay.packed.response_mask, replay.packed.seq_ids
    # a turn's first response token follows a context token (every record has a context)
    first = response & ~torch.cat([torch.zeros(1, dtype=torch.bool), response[:-1]]) & replay.eligible[seq_ids]
    out["delta_first_token_mean"] = float(delta[first].mean()) if first.any() else None
    if replay.delta_paper is not None:
        paper = replay.delta_paper[valid]
        out["delta_paper_mean"] = float(paper.mean()) if len(paper) else 0.0
        out["delta_paper_abs_mean"] = float(paper.abs().mean()) if len(paper) else 0.0
    return {name: (value, "tokens") for name, value in out.items()}
