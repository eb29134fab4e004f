"""ORSD (paper §3) and the ablations of its Table 3 as switches of one method.

- `orsd`: the policy writes M bundles per group, the verifier scores them, Spearman selection
  keeps B* (Eq. 5–7), and A = A_GRPO + α·e·Δ (Eq. 9);
- `single_bundle`: M = 1, no verifier, the one bundle is used;
- `random_bundle`: M bundles, no verifier, one chosen uniformly at random;
- `offline_rubric`: one bundle per task written once by the frozen initial policy, kept for the
  whole run, no verifier.
"""

from __future__ import annotations

from collections.abc import Sequence

from orsd.rubric import RubricBundle

from .base import BundleRequest, Candidates, Method


class ORSD(Method):
    name = "orsd"
    calls_verifier = True
    selection = "spearman"
    # no bundle can correlate with constant rewards (ρ undefined): skipping them saves generation
    # and verifier calls without changing any result
    skips_equal_reward_groups = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.alpha = config.rubric.alpha
        self.num_bundles = config.rubric.num_bundles


class SingleBundle(ORSD):
    name = "single_bundle"
    calls_verifier = False
    selection = "single"
    skips_equal_reward_groups = False

    def __init__(self, config) -> None:
        super().__init__(config)
        self.num_bundles = 1


class RandomBundle(ORSD):
    name = "random_bundle"
    calls_verifier = False
    selection = "random"
    skips_equal_reward_groups = False


class OfflineRubric(SingleBundle):
    """A bundle per task id from the initial policy, written the first time the task is seen."""

    name = "offline_rubric"
    bundle_writer = "initial"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.kept: dict[str, Candidates] = {}

    def bundle_request(self, groups: Sequence) -> BundleRequest | None:
        fresh = list({g.task.id: g for g in groups if g.task.id not in self.kept}.values())
        return BundleRequest(fresh, 1, self.bundle_writer) if fresh else None

    def candidates(self, groups: Sequence, request: BundleRequest | None, written: list) -> list[Candidates]:
        for group, candidates in zip(request.groups if request else [], written):
            self.kept[group.task.id] = candidates
        return [self.kept[g.task.id] for g in groups]

    def state_dict(self) -> dict:
        return {"kept": {task: {"bundles": [b.to_dict() for b in c.bundles], "texts": c.texts, "errors": c.errors}
                         for task, c in self.kept.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.kept = {task: Candidates([RubricBundle.from_dict(b) for b in c["bundles"]], c["texts"], c["errors"])
                     for task, c in state.get("kept", {}).items()}
