"""What one step writes, assembled from the values its stages returned: a groups.jsonl line per
group (records.group_record, with a Δ example) and the step's metrics for steps.jsonl (each tagged
with how ranks combine it: metrics.py). Nothing here runs a model; the trainer hands in values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orsd.methods import Advantages

from . import delta as deltas
from .teacher import Teacher
from .metrics import tagged
from .records import Group, group_record
from .replay import ReplayResult


@dataclass
class StepOutputs:
    """What each stage of one step returned (kept for tests, benchmarks and the records)."""

    advantages: Advantages
    candidates: list  # per group: Candidates (bundles written, raw texts, discards)
    scores: list  # per group: a VerifierResult per bundle, or None (not scored)
    selection: list  # per group: rubric.Alignment (ρ, satisfaction, index of B*, reason), or None
    replay: ReplayResult
    teacher: Teacher | None = None  # the OPSD family's teacher view of the response tokens
    controls: list | None = None  # per group: delta.Control (rubric.delta_baseline), or None


def group_records(groups: list[Group], out: StepOutputs, tokenizer) -> list[dict]:
    """One groups.jsonl line per group."""
    examples = delta_examples(groups, out, tokenizer)
    controls = [c.to_record() if c is not None else None for c in out.controls or [None] * len(groups)]
    return [group_record(g, adv, c, s, sel, ex, control) for g, adv, c, s, sel, ex, control
            in zip(groups, out.advantages.episode, out.candidates, out.scores, out.selection, examples, controls)]


def delta_examples(groups: list[Group], out: StepOutputs, tokenizer) -> list[dict | None]:
    """Per-token Δ of the first trajectory of each group with B*, for records and the report."""
    cu, index, examples = out.replay.packed.cu_seqlens.tolist(), 0, []
    for group, selection in zip(groups, out.selection):
        turns = []
        for number, trajectory in enumerate(group.trajectories):
            for record in trajectory.records:
                start, end = cu[index] + len(record.context_ids), cu[index + 1]
                index += 1
                if number == 0 and selection is not None and selection.index is not None:
                    turns.append({"tokens": [tokenizer.decode([i]) for i in record.response_ids],
                                  "delta": out.replay.delta[start:end].tolist(),
                                  "valid": out.replay.valid[start:end].tolist()})
        examples.append({"trajectory": 0, "turns": turns} if turns else None)
    return examples


def step_metrics(groups: list[Group], out: StepOutputs, step: int, alpha: float, method_metrics: dict,
                 counters: dict) -> dict:
    """The step's metrics, tagged. `method_metrics`: Method.step_metrics (e.g. GiGPO's anchor share);
    `counters`: counters() (speculative drafting's counts, the verifier's accounting)."""
    trajectories = [t for g in groups for t in g.trajectories]
    replay = out.replay
    response, valid = replay.packed.response_mask, replay.valid
    delta = replay.delta[valid]
    selected = [s for s in out.selection if s is not None and s.index is not None]
    # B*'s ρ whether rubric.min_rho kept it or set it aside (the selector's choice, as before min_rho)
    chosen_rho = [s.rho[s.best] for s in out.selection if s is not None and s.best is not None and s.rho]
    metrics = {
        **tagged("same", step=step),
        **tagged("mean",
                 reward_mean=_mean(t.reward for t in trajectories),
                 success_rate=_mean(t.won for t in trajectories),
                 score_mean=_mean(t.score for t in trajectories),
                 turns_mean=_mean(len(t.records) for t in trajectories),
                 valid_action_rate=_mean(r.valid_action for t in trajectories for r in t.records),
                 groups_rewards_differ=_mean(g.rewards_differ for g in groups),
                 groups_with_bundle=(len(selected) / len(groups)) if groups else 0.0,
                 rho_selected_mean=float(np.mean(chosen_rho)) if chosen_rho else None),
        **tagged("sum",
                 env_errors=sum(bool(t.error) for t in trajectories),
                 bundles_parsed=sum(len(c.bundles) for c in out.candidates),
                 bundles_discarded=sum(len(c.errors) for c in out.candidates),
                 rho_selected_nonpositive=int(sum(rho <= 0 for rho in chosen_rho)),  # groups whose B* has ρ <= 0
                 groups_below_min_rho=int(sum(s is not None and s.set_aside is not None for s in out.selection)),
                 response_tokens=int(response.sum())),
        **tagged("tokens",
                 advantage_abs_mean=float(replay.advantages[response].abs().mean()) if response.any() else 0.0,
                 delta_mean=float(delta.mean()) if len(delta) else 0.0,
                 delta_abs_mean=float(delta.abs().mean()) if len(delta) else 0.0,
                 valid_token_fraction=float(valid[response].float().mean()) if response.any() else 0.0,
                 replay_rollout_gap=replay.rollout_gap),
    }
    if "drafts" in counters:
        drafts = counters["drafts"]
        metrics.update(tagged("sum", bundle_decode_forwards=drafts.forwards, bundle_tokens=drafts.tokens,
                              bundle_drafted=drafts.drafted, bundle_draft_accepted=drafts.accepted))
    if "verifier" in counters:
        metrics.update(tagged("counters", verifier=counters["verifier"]))  # this step's accounting
    for name, (value, reduce) in {**deltas.shaping_metrics(replay, alpha), **method_metrics}.items():
        metrics.update(tagged(reduce, **{name: value}))
    for name, (value, reduce) in (out.teacher.metrics if out.teacher is not None else {}).items():
        metrics.update(tagged(reduce, **{name: value}))
    return metrics


def counters(writer, verifier) -> dict:
    """This step's accounting kept outside the stages' results, read and reset: speculative bundle
    decoding's counts (`writer`: the BundleWriter where rubric.draft_tokens is on, else None) and the
    verifier's calls."""
    out = {}
    if writer is not None and (drafts := writer.take_draft_stats()) is not None:
        out["drafts"] = drafts
    if verifier is not None and hasattr(verifier, "stats"):
        out["verifier"] = verifier.stats(reset=True)
    return out


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0
