"""GiGPO (Feng et al., NeurIPS 2025, arXiv 2505.10978): group-in-group advantages, no critic.

A_{i,t} = A^E_i + ω·A^S_{i,t} (their Eq. 8): the episode term A^E normalises the trajectory reward
within the task group (Eq. 3); the step term A^S normalises the γ-discounted return from turn t
(Eq. 5) within the *anchor group* of turns taken in the same state (Eq. 6–7). Read from the
authors' verl-agent (`gigpo/core_gigpo.py` at commit 796ed310287f; see docs/methods.md).

What orsd decides where the source leaves a choice (each is documented in docs/methods.md):
- the anchor is the exact text of the observation the action was taken in
  (`trajectory.observations[t]`, recorded at rollout time), compared only within one task group;
  nothing is normalised, so aliased states ("Invalid action: ... Nothing happened.") merge, as
  faithful GiGPO merges them;
- the per-turn reward is ORSD's trajectory reward (Eq. 12/13) placed on the last turn, with no
  extra per-turn invalid-action penalty (Eq. 12/13 already penalise invalid and looping actions);
- episode statistics over turn rows (verl-agent's code) or over trajectories (GRPO), a config key;
  a trajectory without turns (failed reset, reward 0) has no turn row, and counts among the
  trajectories as GRPO's Eq. 2 counts it (orsd/methods/base.py), so both normalise a group alike;
- returns and statistics in float64, and a group whose std is below 1e-6 counts as constant
  (its term is 0): returns equal up to float noise are not blown up by the 1e-6 divisor.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import Advantages, Method

MODES = ("mean_norm", "mean_std_norm")
#: "turns": mean/std over turn rows (a trajectory counts once per turn, as verl-agent's
#: compute_mean_std_cross_steps=True); "trajectories": over the N trajectories (GRPO, ORSD Eq. 2)
EPISODE_STATS = ("turns", "trajectories")
#: verl-agent's epsilon: added to the std in mean_std_norm; a std below it counts as zero
EPSILON = 1e-6


def normalise(values: np.ndarray, mode: str) -> np.ndarray:
    """(x − mean) / F over one group of two or more values: F = 1 (mean_norm) or unbiased std + ε
    (mean_std_norm). A group whose std is below ε is constant up to float noise: zeros."""
    std = values.std(ddof=1)
    if std < EPSILON:
        return np.zeros_like(values)
    centred = values - values.mean()
    return centred if mode == "mean_norm" else centred / (std + EPSILON)


def step_returns(reward: float, num_turns: int, gamma: float) -> np.ndarray:
    """Eq. 5 with the trajectory reward on the last turn and 0 before: R_t = γ^(T−1−t)·R."""
    return reward * gamma ** np.arange(num_turns - 1, -1, -1, dtype=np.float64)


def anchor_groups(group) -> list[list[tuple[int, int]]]:
    """Eq. 6: the (trajectory, turn) pairs of one task group, grouped by the exact observation
    text each action was taken in, in order of first appearance."""
    members: dict[str, list[tuple[int, int]]] = {}
    for i, trajectory in enumerate(group.trajectories):
        for t in range(len(trajectory.records)):
            members.setdefault(trajectory.observations[t], []).append((i, t))
    return list(members.values())


class GiGPO(Method):
    name = "gigpo"

    def __init__(self, config) -> None:
        super().__init__(config)
        m = config.method
        self.omega = m.gigpo_omega
        self.gamma = m.gigpo_gamma
        self.mode = m.gigpo_mode
        self.episode_stats = m.gigpo_episode_stats
        if self.mode not in MODES:
            raise ValueError(f"method.gigpo_mode={self.mode!r}: expected one of {MODES}")
        if self.episode_stats not in EPISODE_STATS:
            raise ValueError(f"method.gigpo_episode_stats={self.episode_stats!r}: expected one of {EPISODE_STATS}")

    def advantages(self, groups: Sequence) -> Advantages:
        episode, turn = [], []
        for group in groups:
            rewards = np.array(group.rewards, dtype=np.float64)
            lengths = [len(t.records) for t in group.trajectories]
            a_episode = self.episode_advantages(rewards, lengths)
            a_step = self.step_advantages(group, rewards, lengths)
            episode.append(a_episode.tolist())
            turn.append([(a + self.omega * s).tolist() for a, s in zip(a_episode, a_step)])
        return Advantages(episode, turn)

    def episode_advantages(self, rewards: np.ndarray, lengths: list[int]) -> np.ndarray:
        """Eq. 3 within one task group. As verl-agent, a group with a single entry is scored
        against mean 0 and std 1, so A^E = R there (GRPO would give 0)."""
        rows = np.repeat(rewards, lengths) if self.episode_stats == "turns" else rewards
        if len(rows) == 0:  # no trajectory took a turn: nothing is trained on
            return np.zeros_like(rewards)
        if len(rows) == 1:
            return rewards.copy()
        std = rows.std(ddof=1)
        if std < EPSILON:
            return np.zeros_like(rewards)
        centred = rewards - rows.mean()
        return centred if self.mode == "mean_norm" else centred / (std + EPSILON)

    def step_advantages(self, group, rewards: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
        """Eq. 7 per turn: returns normalised within their anchor group; 0 in a singleton group."""
        returns = [step_returns(r, n, self.gamma) for r, n in zip(rewards, lengths)]
        out = [np.zeros(n) for n in lengths]
        for members in anchor_groups(group):
            if len(members) < 2:
                continue
            values = normalise(np.array([returns[i][t] for i, t in members]), self.mode)
            for (i, t), value in zip(members, values):
                out[i][t] = value
        return out

    def step_metrics(self, groups: Sequence) -> dict:
        """Pitfall 1 of the note: turns in singleton anchor groups get A^S = 0 (plain episode
        advantage), so the share of turns in groups of two or more says how much GiGPO adds."""
        sizes = [len(members) for group in groups for members in anchor_groups(group) for _ in members]
        anchored = sum(size >= 2 for size in sizes)
        return {"gigpo_anchored_turn_share": (anchored / len(sizes) if sizes else 0.0, "mean"),
                "gigpo_anchored_turns": (anchored, "sum")}
