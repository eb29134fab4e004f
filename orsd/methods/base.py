"""The method object: what one training method adds to the GRPO step, decided once from the config.

The step (orsd/train/trainer.py) runs the same stages for every method and asks the method only
what differs: how advantages are formed, whether and how many rubric bundles are written, whether
the verifier is called, how a bundle is selected, which rubric (if any) is spliced for paired
replay, and the weight α of e·Δ in the advantage (paper Eq. 9). No stage tests a method's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from orsd import ops
from orsd.rubric import Alignment, RubricBundle


@dataclass
class BundleRequest:
    """What a method asks the step to write: `count` bundles for each of `groups`, by the current
    policy (writer="policy") or the frozen initial one (writer="initial"). The step writes them
    (train/bundles.py: write_bundles) and hands one Candidates per requested group back to
    `Method.candidates`."""

    groups: list
    count: int
    writer: str


@dataclass
class Candidates:
    """The M bundles written for one group (§3.1): the parsed bundles, every raw text, why the
    others were discarded, or why none were written."""

    bundles: list[RubricBundle] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reason: str = ""  # set when the group had no bundles written for it


@dataclass
class Advantages:
    """Per group, per trajectory: the episode advantage (Eq. 2) and the one each turn uses."""

    episode: list[list[float]]
    turn: list[list[list[float]]]  # [group][trajectory][turn]; GRPO broadcasts the episode value


class Method:
    """GRPO (Eq. 2 advantages, PPO-clip + k3 KL, no rubric). Subclasses switch stages on."""

    name = "grpo"
    #: M candidate bundles per group (0: the rubric stages do not run)
    num_bundles = 0
    #: "policy" (the current policy writes bundles) | "initial" (the frozen initial policy)
    bundle_writer = "policy"
    #: score bundles with the verifier (only Spearman selection needs scores)
    calls_verifier = False
    #: how B* is chosen: "spearman" (Eq. 5–7) | "random" | "single"
    selection = "spearman"
    #: skip bundle writing for groups whose rewards are all equal (no ρ is defined there)
    skips_equal_reward_groups = False
    #: the OPSD family's loss term (methods/distill.py: Distillation); such a method also has
    #: `teacher_contexts(...)`, and the step then runs a no-grad teacher pass. None: no teacher
    distillation = None

    def __init__(self, config) -> None:
        self.alpha = 0.0  # Eq. 9: A = A_GRPO + α·e·Δ; 0 = the plain replay only
        self.adv_eps = config.optim.adv_eps
        self.norm_by_std = config.optim.norm_adv_by_std

    @property
    def writes_bundles(self) -> bool:
        return self.num_bundles > 0

    def advantages(self, groups: Sequence) -> Advantages:
        """Eq. 2: (r − mean) / (std + ε) within each group, broadcast to every turn."""
        rewards = torch.tensor([t.reward for g in groups for t in g.trajectories], dtype=torch.float32)
        group_ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.trajectories], dtype=torch.long)
        flat = iter(ops.grpo_advantages(rewards, group_ids, self.adv_eps, self.norm_by_std).tolist())
        episode = [[next(flat) for _ in g.trajectories] for g in groups]
        turn = [[[a] * len(t.records) for a, t in zip(values, g.trajectories)] for values, g in zip(episode, groups)]
        return Advantages(episode, turn)

    def bundle_request(self, groups: Sequence) -> BundleRequest | None:
        """The bundles this step must write, or None when it writes none (GRPO, a file's rubric)."""
        if not self.writes_bundles:
            return None
        return BundleRequest([g for g in groups if not self._skips(g)], self.num_bundles, self.bundle_writer)

    def candidates(self, groups: Sequence, request: BundleRequest | None, written: list) -> list[Candidates]:
        """One Candidates per group: the bundles `written` for `request` (one Candidates per requested
        group, in its order), or a reason why none were written."""
        if not self.writes_bundles:
            return [Candidates(reason="the method writes no bundles") for _ in groups]
        written = iter(written)
        return [Candidates(reason="rewards equal within the group: no ρ defined, bundles not generated")
                if self._skips(g) else next(written) for g in groups]

    def _skips(self, group) -> bool:
        return self.skips_equal_reward_groups and not group.rewards_differ

    def rubric_for(self, group, candidates: Candidates, selection: Alignment | None) -> RubricBundle | None:
        """The privileged rubric spliced into this group's contexts for paired replay (Eq. 8)."""
        if selection is None or selection.index is None:
            return None
        return candidates.bundles[selection.index]

    def step_metrics(self, groups: Sequence) -> dict:
        """Metrics only this method makes, merged into the step's: {name: (value, reduction)},
        the reduction being one of orsd.train.metrics.REDUCTIONS (how ranks combine it)."""
        return {}

    # offline state that must survive a checkpoint (none for most methods)
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
