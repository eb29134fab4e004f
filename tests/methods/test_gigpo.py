"""GiGPO advantages against the hand-computed worked example of the team's baseline note (§1).

γ = 0.5, ω = 1, N = 3, terminal rewards only:
  τ1: anchors o0, o1, o2, R = 1 -> step returns 0.25, 0.5, 1
  τ2: anchors o0, o1, o3, R = 0 -> 0, 0, 0
  τ3: anchors o0, o2,     R = 1 -> 0.5, 1
Every expected number below was computed by hand from the formulas (see the comments), not read
back from the code.
"""

import pytest

from orsd.envs.base import Task
from orsd.methods import METHODS, make_method
from orsd.train.config import load_config
from orsd.train.records import Group, Trajectory, TurnRecord


def trajectory(anchors: list[str], reward: float, task: Task) -> Trajectory:
    """A finished trajectory whose action t was taken in observation anchors[t]."""
    records = [TurnRecord(turn=t, context_ids=[1], response_ids=[2], rollout_logprobs=[-1.0], rubric_slot=0,
                          response_text="", action="look", observation=f"after {t}", valid_action=True,
                          no_progress=False, truncated=False, context_truncated=False)
               for t in range(len(anchors))]
    return Trajectory(task=task, observations=anchors + ["final"], actions=["look"] * len(anchors),
                      records=records, reward=reward)


def worked_example() -> Group:
    task = Task(id="t", split="train", description="d", kind="k")
    return Group(task, [trajectory(["o0", "o1", "o2"], 1.0, task),
                        trajectory(["o0", "o1", "o3"], 0.0, task),
                        trajectory(["o0", "o2"], 1.0, task)])


def gigpo(mode: str, stats: str, omega: float = 1.0, gamma: float = 0.5):
    return make_method(load_config(None, ["method.name=gigpo", f"method.gigpo_mode={mode}",
                                          f"method.gigpo_episode_stats={stats}", f"method.gigpo_omega={omega}",
                                          f"method.gigpo_gamma={gamma}"]))


# A^E: cross-step rows are [1,1,1, 0,0,0, 1,1]: mean 5/8 = 0.625, unbiased std 0.517549.
# Per trajectory: [1, 0, 1]: mean 2/3, std 0.577350. mean_std_norm divides by std + 1e-6.
EPISODE = {
    ("mean_norm", "turns"): [0.375, -0.625, 0.375],
    ("mean_std_norm", "turns"): [0.724567, -1.207612, 0.724567],
    ("mean_norm", "trajectories"): [1 / 3, -2 / 3, 1 / 3],
    ("mean_std_norm", "trajectories"): [0.577349, -1.154699, 0.577349],
}
# A^S: o0 = {0.25, 0, 0.5}: mean 0.25, std 0.25 -> 0, -0.25, +0.25 or 0, -0.999996, +0.999996;
# o1 = {0.5, 0}: ±0.25 or ±0.707105 (std 0.353553); o2 = {1, 1}: 0; o3 singleton: 0.
STEP = {
    "mean_norm": [[0.0, 0.25, 0.0], [-0.25, -0.25, 0.0], [0.25, 0.0]],
    "mean_std_norm": [[0.0, 0.707105, 0.0], [-0.999996, -0.707105, 0.0], [0.999996, 0.0]],
}
# A = A^E + ω·A^S, the note's "combined" rows and their three siblings, added by hand
COMBINED = {
    ("mean_norm", "turns"): [[0.375, 0.625, 0.375], [-0.875, -0.875, -0.625], [0.625, 0.375]],
    ("mean_std_norm", "turns"): [[0.724567, 1.431672, 0.724567], [-2.207608, -1.914717, -1.207612],
                                 [1.724563, 0.724567]],
    ("mean_norm", "trajectories"): [[0.333333, 0.583333, 0.333333], [-0.916667, -0.916667, -0.666667],
                                    [0.583333, 0.333333]],
    ("mean_std_norm", "trajectories"): [[0.577349, 1.284454, 0.577349], [-2.154695, -1.861804, -1.154699],
                                        [1.577345, 0.577349]],
}


def test_gigpo_is_registered():
    assert METHODS["gigpo"].name == "gigpo"


@pytest.mark.parametrize("mode,stats", sorted(COMBINED))
def test_worked_example(mode, stats):
    advantages = gigpo(mode, stats).advantages([worked_example()])
    assert advantages.episode[0] == pytest.approx(EPISODE[mode, stats], abs=2e-6)
    for got, expected in zip(advantages.turn[0], COMBINED[mode, stats]):
        assert got == pytest.approx(expected, abs=2e-6)


@pytest.mark.parametrize("mode", sorted(STEP))
def test_omega_scales_the_step_term_only(mode):
    """ω = 2 adds the step term twice: A(ω=2) − A(ω=1) = A^S."""
    one = gigpo(mode, "turns", omega=1.0).advantages([worked_example()]).turn[0]
    two = gigpo(mode, "turns", omega=2.0).advantages([worked_example()]).turn[0]
    for a, b, step in zip(one, two, STEP[mode]):
        assert [y - x for x, y in zip(a, b)] == pytest.approx(step, abs=2e-6)


def test_anchor_share_metric():
    """o0 (3 turns), o1 (2) and o2 (2) are shared, o3 is a singleton: 7 of 8 turns."""
    metrics = gigpo("mean_norm", "turns").step_metrics([worked_example()])
    assert metrics["gigpo_anchored_turn_share"] == (7 / 8, "mean")
    assert metrics["gigpo_anchored_turns"] == (7, "sum")


def test_anchors_are_exact_text_within_one_task_group():
    """A trailing space makes another state; the same text in another task's group is another anchor."""
    task, other = Task("a", "train", "d", "k"), Task("b", "train", "d", "k")
    groups = [Group(task, [trajectory(["s"], 1.0, task), trajectory(["s "], 0.0, task)]),
              Group(other, [trajectory(["s"], 0.0, other)])]
    method = gigpo("mean_norm", "trajectories")
    assert method.step_metrics(groups)["gigpo_anchored_turns"] == (0, "sum")
    # no anchor group: the turn advantage is the episode advantage alone (0.5, −0.5), and the
    # single trajectory of the second group keeps its reward (verl-agent: mean 0, std 1)
    assert method.advantages(groups).turn == [[[0.5], [-0.5]], [[0.0]]]
    groups[1].trajectories[0].reward = 0.7
    assert method.advantages(groups).turn[1] == [[0.7]]


def test_returns_equal_up_to_float_noise_give_zero():
    """Pitfall 6: returns 1 and 1 + 1e-9 in one anchor group are constant, not ±0.0005."""
    task = Task("t", "train", "d", "k")
    group = Group(task, [trajectory(["s"], 1.0, task), trajectory(["s"], 1.0 + 1e-9, task)])
    advantages = gigpo("mean_std_norm", "trajectories").advantages([group])
    assert advantages.turn == [[[0.0], [0.0]]]


def test_discount_uses_turns_to_the_end():
    """γ = 0.9: returns of a 3-turn success are 0.81, 0.9, 1; a 1-turn failure is 0 in the shared
    first state o0: mean_norm A^S = ±(0.81 − 0)/2 at turn 0, A^E = ±0.5 (per trajectory)."""
    task = Task("t", "train", "d", "k")
    group = Group(task, [trajectory(["o0", "x", "y"], 1.0, task), trajectory(["o0"], 0.0, task)])
    turn = gigpo("mean_norm", "trajectories", gamma=0.9).advantages([group]).turn[0]
    assert turn[0] == pytest.approx([0.5 + 0.405, 0.5, 0.5])
    assert turn[1] == pytest.approx([-0.5 - 0.405])


def with_a_failed_reset() -> Group:
    """The worked example plus a fourth trajectory whose reset raised: no turn, reward 0 (rollout.py)."""
    group = worked_example()
    group.trajectories.append(Trajectory(task=group.task, observations=[], actions=[], error="reset failed: boom"))
    return group


@pytest.mark.parametrize("mode, grpo_by_std", [("mean_norm", "false"), ("mean_std_norm", "true")])
def test_a_trajectory_without_turns_counts_in_trajectory_statistics_as_in_grpo(mode, grpo_by_std):
    """`trajectories` normalises over the group as GRPO's Eq. 2 does in orsd, where a failed reset
    is a reward of 0 among the N: rewards [1, 0, 1, 0], mean 0.5, unbiased std 0.577350."""
    group = with_a_failed_reset()
    advantages = gigpo(mode, "trajectories").advantages([group])
    grpo = make_method(load_config(None, ["method.name=grpo", f"optim.norm_adv_by_std={grpo_by_std}"]))
    expected = {"mean_norm": [0.5, -0.5, 0.5, -0.5], "mean_std_norm": [0.866024, -0.866024, 0.866024, -0.866024]}
    assert advantages.episode[0] == pytest.approx(expected[mode], abs=2e-6)
    assert grpo.advantages([group]).episode[0] == pytest.approx(expected[mode], abs=2e-6)
    assert advantages.turn[0][3] == []  # nothing of it is trained on


def test_a_trajectory_without_turns_has_no_row_in_turn_statistics():
    """`turns` takes one row per turn: the failed reset adds none, so the others' A^E are the worked
    example's (rows [1,1,1, 0,0,0, 1,1], mean 0.625) and its own is R − 0.625 = −0.625."""
    advantages = gigpo("mean_norm", "turns").advantages([with_a_failed_reset()])
    assert advantages.episode[0] == pytest.approx([0.375, -0.625, 0.375, -0.625], abs=2e-6)
    assert advantages.turn[0][:3] == [pytest.approx(row, abs=2e-6) for row in COMBINED["mean_norm", "turns"]]
