"""warm_start.noise on the shop: a random valid command (Env.random_action) replaces the expert's with
probability `noise`, the label staying the expert's, so the demonstrations show recoveries."""

import random

import pytest

from orsd import envs
from orsd.train.warmstart import play


@pytest.fixture(scope="module")
def shop():
    return envs.make("webshop", max_actions=60)


def played(shop, noise, episodes=10, seed=0):
    """(executed actions, expert labels, won) per episode; the label is the expert's command at the
    state the turn saw, whatever was then executed."""
    rng = random.Random(seed)
    out = []
    for _ in range(episodes):
        trajectory, turns = play(shop, shop.sample_task(rng), rng, noise, 60, context_of=lambda episode, t: None)
        replay = shop.fork()
        replay.reset(trajectory.task)
        for action, (_, label) in zip(trajectory.actions, turns):
            assert label == replay.expert_action()  # the label: the expert at that very state
            replay.step(action)
        out.append((trajectory.actions, [label for _, label in turns], replay.won))
    return out


def test_without_noise_every_step_is_the_experts(shop):
    for actions, labels, won in played(shop, 0.0):
        assert actions == labels and won


def test_with_noise_some_steps_are_not_the_experts_and_every_episode_still_ends_as_the_experts(shop):
    episodes = played(shop, 0.3)
    off = [sum(a != label for a, label in zip(actions, labels)) for actions, labels, _ in episodes]
    assert sum(off) >= 5 and sum(o > 0 for o in off) >= 3  # wrong steps in several episodes...
    assert all(won for _, _, won in episodes)  # ...and the expert recovers from each: every purchase scores 1
    recovered = [labels[i + 1] for actions, labels, _ in episodes for i in range(len(actions) - 1)
                 if actions[i] != labels[i]]
    assert any(label.startswith("click[") for label in recovered)  # e.g. back to search, < Prev, the right option


def test_the_shops_random_command_is_valid_on_every_page_and_never_buys(shop):
    rng = random.Random(1)
    assert shop.list_admissible is False and shop.fork().admissible_actions() is None  # the knob's old dead end
    pages = set()
    for _ in range(6):
        episode = shop.fork()
        episode.reset(shop.sample_task(rng))
        while not episode.done:
            command = episode.random_action(rng)
            assert command is not None and command != "click[Buy Now]"
            pages.add(episode.state.page)
            _, _, info = episode.step(command if rng.random() < 0.5 else episode.expert_action())
            assert info["valid_action"]
        assert episode.random_action(rng) is None  # nothing to draw once the episode is over
    assert len(pages) >= 3  # the search page, results and items at least
