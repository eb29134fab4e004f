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
    advantage: float = 0.0  # A_GRPO of the whole trajectory (Eq. 8), broadcast to its turns
    error: str = ""  # an env failure that ended the episode early (recorded, never raised)


@dataclass
class Group:
    """The N trajectories of one task, and the rubric machinery's results for them."""

    task: Task
    trajectories: list[Trajectory]
    key: str = ""  # stable name of the group (step, global index) for per-request seeding
    bundles: list[Any] = field(default_factory=list)  # RubricBundle per candidate that parsed
    bundle_texts: list[str] = field(default_factory=list)  # every raw generation, parsed or not
    bundle_errors: list[str] = field(default_factory=list)  # why a generation was discarded
    scores: list[Any] = field(default_factory=list)  # per bundle an [N, K] array (NaN = unscored)
    rho: list[float] = field(default_factory=list)
    selected: int | None = None  # index into `bundles` of B*, None = no rubric for this group
    reason: str = ""  # why `selected` is what it is
    satisfaction: list[list[float]] = field(default_factory=list)  # per bundle, s_i (Eq. 5)
    verifier_events: list[dict] = field(default_factory=list)
    #: per-token Δ of one trajectory's responses (for the report's heat-map), when B* exists
    delta_example: dict | None = None

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def rewards_differ(self) -> bool:
        return len(set(self.rewards)) > 1

    @property
    def selected_bundle(self):
        return None if self.selected is None else self.bundles[self.selected]

    def summary(self) -> dict:
        """A JSON-ready view for groups.jsonl (NaN written as null)."""

        def clean(x: float) -> float | None:
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

        return {
            "task": {"id": self.task.id, "split": self.task.split, "kind": self.task.kind,
                     "description": self.task.description},
            "rewards": self.rewards,
            "advantages": [t.advantage for t in self.trajectories],
            "transcripts": [{"observations": t.observations, "actions": t.actions,
                             "responses": [r.response_text for r in t.records],
                             "won": t.won, "score": t.score, "error": t.error}
                            for t in self.trajectories],
            "bundle_texts": self.bundle_texts,
            "bundle_errors": self.bundle_errors,
            "bundles": [list(b.criteria) for b in self.bundles],
            "scores": [[[clean(float(v)) for v in row] for row in s] for s in self.scores],
            "rho": [clean(r) for r in self.rho],
            "satisfaction": [[clean(float(v)) for v in s] for s in self.satisfaction],
            "selected": self.selected,
            "reason": self.reason,
            "verifier_events": self.verifier_events,
            "delta_example": self.delta_example,
        }
