"""What a training step produces and consumes: token-in/token-out turn records, trajectories, groups.

One `TurnRecord` per action turn holds exactly the ids the policy saw and exactly the ids it
sampled; nothing the model generated is ever re-tokenized. The rubric-conditioned context of
paired replay is `context_ids[:rubric_slot] + rubric_ids + context_ids[rubric_slot:]` with the
same `response_ids`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orsd.envs.base import Task


@dataclass
class TurnRecord:
    turn: int
    context_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    #: token index in `context_ids` at a message boundary where privileged context goes (-1: none)
    rubric_slot: int
    response_text: str
    action: str | None  # parsed command; None = invalid reply
    observation: str  # what the env answered
    valid_action: bool
    no_progress: bool
    truncated: bool  # the response hit the token budget before end-of-turn
    context_truncated: bool  # earlier history was dropped to fit the context budget

    @property
    def num_tokens(self) -> int:
        return len(self.context_ids) + len(self.response_ids)

    def takes(self, ids: list[int] | None, max_context_tokens: int) -> bool:
        """Whether privileged ids (B*, a control, a teacher's text) can be spliced into this turn: it
        has a slot, and its context and reply with them stay within the context budget. Where not,
        the turn keeps A_GRPO (e = 0) or gets no teacher."""
        return ids is not None and self.rubric_slot >= 0 and self.num_tokens + len(ids) <= max_context_tokens


@dataclass
class Trajectory:
    task: Task
    observations: list[str]  # obs_0 from reset, then one per action
    actions: list[str | None]
    records: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    won: bool = False
    score: float = 0.0
    num_invalid: int = 0
    num_no_progress: int = 0
    error: str = ""  # an env failure that ended the episode early (recorded, never raised)


@dataclass
class Group:
    """The N trajectories of one task, as the rollout made them (rewards filled in). The later
    stages return their results separately; `group_record` joins them for groups.jsonl."""

    task: Task
    trajectories: list[Trajectory]
    key: str = ""  # stable name of the group (step, global index) for per-request seeding

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def rewards_differ(self) -> bool:
        return len(set(self.rewards)) > 1


def _clean(x: Any) -> Any:
    """NaN → None (JSON has no NaN)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def group_record(group: Group, advantages: list[float], candidates=None, scores=None, selection=None,
                 delta_example: dict | None = None, control: dict | None = None) -> dict:
    """One line of groups.jsonl: the task, transcripts, rewards and advantages (Eq. 2), the bundles
    written, their score matrices, ρ and satisfaction (Eq. 5–6), the choice of B* (Eq. 7) and why,
    the verifier's events, one trajectory's per-token Δ (Eq. 8) when B* exists, and the control
    bundle Δ was measured against (rubric.delta_baseline: its kind, criteria, or why there is none)."""
    bundles = candidates.bundles if candidates is not None else []
    return {
        "task": {"id": group.task.id, "split": group.task.split, "kind": group.task.kind,
                 "description": group.task.description},
        "rewards": group.rewards,
        "advantages": advantages,
        "transcripts": [{"observations": t.observations, "actions": t.actions,
                         "responses": [r.response_text for r in t.records],
                         "won": t.won, "score": t.score, "error": t.error}
                        for t in group.trajectories],
        "bundle_texts": candidates.texts if candidates is not None else [],
        "bundle_errors": candidates.errors if candidates is not None else [],
        "bundles": [list(b.criteria) for b in bundles],
        "scores": [[[_clean(float(v)) for v in row] for row in r.scores] for r in scores or []],
        "rho": [_clean(r) for r in selection.rho] if selection is not None else [],
        "satisfaction": [[_clean(float(v)) for v in s] for s in selection.satisfaction] if selection is not None else [],
        "selected": selection.index if selection is not None else None,
        "reason": (selection.reason if selection is not None else (candidates.reason if candidates else "")),
        "verifier_events": [e.to_dict() if hasattr(e, "to_dict") else dict(vars(e))
                            for r in scores or [] for e in r.events],
        "delta_example": delta_example,
        "control": control,
    }
