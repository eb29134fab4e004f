"""Eq. 12 and Eq. 13 by hand, argument checks, and episode_reward on real shop episodes."""

import pytest

from orsd.envs import make
from orsd.envs.rewards import alfworld_reward, episode_reward, webshop_reward


def test_alfworld_reward_eq12():
    assert alfworld_reward(True) == 1.0
    assert alfworld_reward(False) == 0.0
    with pytest.raises(TypeError, match="won must be a bool"):
        alfworld_reward(0.5)
    with pytest.raises(TypeError, match="won must be a bool"):
        alfworld_reward("yes")


@pytest.mark.parametrize(
    "score, n_invalid, n_no_progress, n_actions, expected",
    [
        (1.0, 0, 0, 5, 1.0),  # 0.5 + 0.5
        (0.8, 0, 0, 5, 0.4),  # no success bonus below 1
        (0.8, 2, 1, 10, 0.4 - 0.05 * 2 / 10 - 0.025 * 1 / 10),  # = 0.3875
        (1.0, 1, 2, 4, 1.0 - 0.0125 - 0.0125),  # = 0.975
        (0.0, 15, 0, 15, -0.05),  # every action invalid
        (0.0, 0, 15, 15, -0.025),  # every action loops
        (0.0, 0, 0, 0, 0.0),  # max(T, 1) keeps T = 0 finite
    ],
)
def test_webshop_reward_eq13(score, n_invalid, n_no_progress, n_actions, expected):
    assert webshop_reward(score, n_invalid, n_no_progress, n_actions) == pytest.approx(expected)


def test_webshop_reward_hand_value():
    assert webshop_reward(0.8, 2, 1, 10) == pytest.approx(0.3875)


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((1.5, 0, 0, 1), ValueError, "score must be a finite float in"),
        ((float("nan"), 0, 0, 1), ValueError, "score must be a finite float in"),
        (("1", 0, 0, 1), TypeError, "score must be a float"),
        ((True, 0, 0, 1), TypeError, "score must be a float"),
        ((0.5, -1, 0, 1), ValueError, "n_invalid must be >= 0"),
        ((0.5, 0, 1.0, 1), TypeError, "n_no_progress must be an int"),
        ((0.5, 0, 0, -2), ValueError, "n_actions must be >= 0"),
        ((0.5, 4, 0, 3), ValueError, "n_invalid must be <= n_actions"),
        ((0.5, 0, 4, 3), ValueError, "n_no_progress must be <= n_actions"),
    ],
)
def test_webshop_reward_rejects_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        webshop_reward(*args)


def test_episode_reward_with_invalid_and_looping_actions():
    env = make("webshop", seed=0).fork()
    env.reset(env.tasks("train")[3])
    env.step(None)  # invalid: no parsable action
    env.step("dance[now]")  # invalid: unknown command
    env.step(env.expert_action())  # search: new results page
    env.step("click[Back to Search]")  # back to the start page: seen before -> no progress
    env.step(env.expert_action())  # the same search again: seen before -> no progress
    assert (env.num_invalid, env.num_no_progress) == (2, 2)
    while not env.done:
        env.step(env.expert_action())
    assert env.last_info["score"] == 1.0
    n_actions = env.num_actions
    assert episode_reward(env) == pytest.approx(1.0 - 0.05 * 2 / n_actions - 0.025 * 2 / n_actions)


def test_episode_reward_without_purchase_is_penalty_only():
    env = make("webshop", seed=0, max_actions=4).fork()
    env.reset(env.tasks("train")[0])
    for action in (None, env.expert_action(), "click[Back to Search]", "look"):
        env.step(action)
    assert env.done and env.last_info["truncated"] and env.last_info["score"] == 0.0
    assert episode_reward(env) == pytest.approx(-0.05 * 2 / 4 - 0.025 * 1 / 4)


def test_episode_reward_needs_finished_episode():
    env = make("webshop").fork()
    env.reset(env.tasks("train")[0])
    with pytest.raises(ValueError, match="not finished"):
        episode_reward(env)
    with pytest.raises(TypeError, match="env must be an orsd.envs.Env"):
        episode_reward("webshop")


def test_webshop_reward_counts_may_overlap():
    """Eq. 13 is defined for each count in [0, T] on its own: a repeated invalid action is both."""
    by_hand = 0.5 * 0.25 - 0.05 * 3 / 3 - 0.025 * 3 / 3
    assert webshop_reward(0.25, 3, 3, 3) == pytest.approx(by_hand)
