"""The protocol (orsd.envs.base): `step` never raises on a bad action. Every environment flags an
action that is not a string invalid, counts it and leaves the episode where it was."""

from __future__ import annotations

import pytest

from orsd.envs import make

#: what a buggy parser or a hostile caller could hand to step() instead of text
NON_STRINGS = [3, 3.5, float("nan"), True, b"search[shirt]", bytearray(b"look"), ["click[Buy Now]"],
               ("look",), {"action": "look"}, object(), Exception("look")]
#: the ALFWorld tests' task set (tests/envs/test_alfworld.py): the same folder and sizes, built once
ALFWORLD_SIZES = {"train": 12, "valid_seen": 6, "valid_unseen": 6}


@pytest.fixture(scope="module", params=["webshop", "alfworld"])
def env(request, tmp_path_factory):
    if request.param == "webshop":
        return make("webshop", seed=0)
    pytest.importorskip("alfworld", reason="the [alfworld] extra is not installed")
    from orsd.envs.alfworld import generator

    folder = tmp_path_factory.getbasetemp() / "alfworld-cache"
    generator.prepare(folder, 0, ALFWORLD_SIZES, num_workers=2)
    return make("alfworld", split="train", seed=0, split_sizes=ALFWORLD_SIZES, cache_dir=folder, source="generated")


@pytest.mark.parametrize("action", NON_STRINGS, ids=lambda a: type(a).__name__)
def test_a_non_string_action_is_flagged_invalid_never_raised(env, action):
    episode = env.fork()
    task = episode.tasks("train")[0]
    first = episode.reset(task)
    observation, done, info = episode.step(action)
    assert info["valid_action"] is False and info["won"] is False and not done
    assert isinstance(observation, str) and observation
    assert (episode.num_actions, episode.num_invalid) == (1, 1)
    assert episode.expert_action() is not None  # the episode goes on from where it was
    _, _, info = episode.step(episode.expert_action())
    assert info["valid_action"] is True
    assert episode.reset(task) == first
