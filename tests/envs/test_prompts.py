"""Prompt building: system + task + full history with action-only assistant turns."""

import dataclasses
from types import SimpleNamespace

import pytest

from orsd.envs import Task, make, parse_action
from orsd.envs.prompts import (
    SYSTEM_PROMPTS, TEMPLATES, build_messages, demonstration_answer,
)


@pytest.fixture(scope="module")
def episode():
    env = make("webshop").fork()
    task = env.tasks("train")[0]
    observations = [env.reset(task)]
    actions = [env.expert_action(), None]
    for action in actions:
        observations.append(env.step(action)[0])
    return env, task, observations, actions


def test_webshop_messages_structure(episode):
    env, task, observations, actions = episode
    messages = build_messages(env, task, observations, actions)
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert "<think>...</think>" in system and "<action>...</action>" in system
    assert "search[<query>]" in system and "at most 15 actions" in system
    assert messages[1]["content"] == (
        f"Task: {task.description}\nStep 1 of 15. Observation: {observations[0]}")
    assert messages[2]["content"] == f"<action>{actions[0]}</action>"  # no reasoning kept
    assert messages[3]["content"] == f"Step 2 of 15. Observation: {observations[1]}"
    assert messages[4]["content"] == TEMPLATES["webshop"].invalid_reply
    assert parse_action(messages[4]["content"]) is None
    assert messages[5]["content"] == f"Step 3 of 15. Observation: {observations[2]}"


def test_admissible_actions_only_in_the_last_message():
    env = SimpleNamespace(name="alfworld", max_actions=50)
    task = Task(id="t", split="train", description="put a clean apple in fridge", kind="clean")
    messages = build_messages(env, task, ["You are in a room.", "You arrive at fridge 1."],
                              ["go to fridge 1"], admissible=["open fridge 1", "look"])
    assert "ALFWorld" in messages[0]["content"] and "at most 50 actions" in messages[0]["content"]
    assert "Admissible" not in messages[1]["content"]
    assert messages[-1]["content"] == (
        "Step 2 of 50. Observation: You arrive at fridge 1.\n"
        "Admissible actions: open fridge 1, look")


def test_first_turn_only(episode):
    env, task, observations, _ = episode
    messages = build_messages(env, task, observations[:1], [], admissible=["search[<query>]"])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].endswith("\nAdmissible actions: search[<query>]")


def test_templates_can_be_overridden(episode):
    env, task, observations, actions = episode
    short = dataclasses.replace(TEMPLATES["webshop"], system="Shop. {max_actions} moves.",
                                user="[{step}/{max_actions}] {observation}")
    messages = build_messages(env, task, observations, actions, templates=short)
    assert messages[0]["content"] == "Shop. 15 moves."
    assert messages[3]["content"] == f"[2/15] {observations[1]}"
    assert SYSTEM_PROMPTS["webshop"] == TEMPLATES["webshop"].system


def test_observations_with_braces_are_kept_verbatim(episode):
    env, task, _, _ = episode
    messages = build_messages(env, task, ["odd {page} text {}"], [])
    assert messages[1]["content"].endswith("odd {page} text {}")


def test_build_messages_errors(episode):
    env, task, observations, actions = episode
    with pytest.raises(ValueError, match="one more element than actions"):
        build_messages(env, task, observations, actions[:1])
    with pytest.raises(ValueError, match="no prompt templates for env name 'chess'"):
        build_messages(SimpleNamespace(name="chess", max_actions=3), task, ["x"], [])
    with pytest.raises(TypeError, match="admissible must be a list of str"):
        build_messages(env, task, observations, actions, admissible="look")
    with pytest.raises(TypeError, match="task must be"):
        build_messages(env, "task", observations, actions)
    with pytest.raises(TypeError, match="actions must all be str or None"):
        build_messages(env, task, observations, [1, None])
    with pytest.raises(TypeError, match="env must have"):
        build_messages(object(), task, observations, actions)


def test_demonstration_answer():
    answer = demonstration_answer("webshop", "click[Buy Now]", "all options are chosen")
    assert answer == "<think>all options are chosen</think><action>click[Buy Now]</action>"
    assert parse_action(answer) == "click[Buy Now]"
    assert demonstration_answer("alfworld", "look") == "<think></think><action>look</action>"
    with pytest.raises(ValueError, match="env_name must be one of"):
        demonstration_answer("chess", "e4")
