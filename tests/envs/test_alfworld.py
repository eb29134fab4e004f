"""AlfworldEnv on the real alfworld/TextWorld engine with generated tasks: experts win, random
play does not, bad actions never raise, forks are independent, official-data handling."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys

import pytest
from helpers.alfworld import SIZES  # cache_dir (tests/envs/conftest.py) is built with these sizes

pytest.importorskip("alfworld", reason="the [alfworld] extra is not installed")

from orsd.envs import INFO_KEYS, Task, make  # noqa: E402
from orsd.envs.alfworld import engine as alfworld_engine  # noqa: E402
from orsd.envs.alfworld.env import NOTHING_HAPPENS, AlfworldEnv  # noqa: E402
from orsd.envs.alfworld.scenes import TASK_TYPES  # noqa: E402


@pytest.fixture
def env(cache_dir, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    return make("alfworld", split="train", seed=0, split_sizes=SIZES, cache_dir=cache_dir)


def play_expert(env, task):
    observation = env.reset(task)
    done, info = False, {}
    while not done:
        observation, done, info = env.step(env.expert_action())
    return info, observation


def test_split_sizes_and_types(env):
    for split in env.splits:
        tasks = env.tasks(split)
        assert len(tasks) == SIZES[split]
        kinds = [t.kind for t in tasks]
        assert set(kinds) == set(TASK_TYPES)  # every type in every split
        assert {kinds.count(k) for k in TASK_TYPES} == {SIZES[split] // 6}
        assert all(t.split == split and t.id.startswith(split + "/") for t in tasks)
        assert len({t.id for t in tasks}) == len(tasks)


def test_first_observation_and_description(env):
    task = next(t for t in env.tasks("train") if t.kind == "pick_clean_then_place_in_recep")
    observation = env.reset(task)
    assert observation.startswith("You are in the middle of a room. Looking quickly around you, you see a ")
    assert observation.endswith(f"Your task is to: {task.description}.")
    assert "clean" in task.description and "_bar_" not in observation
    assert "look" in env.admissible_actions() and any(a.startswith("go to ") for a in env.admissible_actions())


def test_expert_wins_every_task_of_every_type(env):
    """The planner expert wins all train tasks (2 per type) and the held-out ones."""
    tasks = env.tasks("train") + env.tasks("valid_seen")[::2] + env.tasks("valid_unseen")[::2]
    for task in tasks:
        info, _ = play_expert(env, task)
        assert info["won"] and info["score"] == 1.0, task.id
        assert env.last_expert == "planner" and env.num_expert_fallbacks == 0
        assert env.num_invalid == 0 and env.num_actions <= 15


def test_expert_recovers_after_wrong_moves(env):
    rng = random.Random(3)
    for task in [t for t in env.tasks("train") if t.kind in ("pick_and_place_simple", "pick_heat_then_place_in_recep")]:
        env.reset(task)
        for _ in range(6):  # wander: go somewhere, open things, pick up the wrong object
            observation, done, info = env.step(rng.choice(env.admissible_actions()))
            if done:
                break
        while not done:
            observation, done, info = env.step(env.expert_action())
        assert info["won"], task.id
        assert env.last_expert == "planner"


def test_random_policy_almost_never_wins_and_never_raises(env):
    """50 episodes x 50 actions: random admissible commands, garbage and None (2,500 actions)."""
    rng = random.Random(0)
    tasks = env.tasks("train")
    wins = actions = 0
    garbage = [None, "", "   ", "jump", "go to the moon", "take mug 99 from cabinet 1", "put everything away",
               "<action>look</action>", 42, "x" * 10_000, "go to", "ouvre le frigo", "🙂"]
    for episode in range(50):
        env.reset(tasks[episode % len(tasks)])
        done = False
        while not done:
            action = rng.choice(garbage) if rng.random() < 0.2 else rng.choice(env.admissible_actions())
            observation, done, info = env.step(action)
            actions += 1
            assert set(INFO_KEYS) <= set(info) and isinstance(observation, str) and observation
        wins += info["won"]
    assert actions >= 1000
    assert wins <= 5, f"random play won {wins}/50 episodes"


@pytest.mark.slow
def test_a_thousand_random_episodes_run_without_an_exception(cache_dir, monkeypatch):
    """The issue's 1,000 random episodes, over all 24 test tasks (horizon 20 to bound CI time)."""
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    env = AlfworldEnv("train", 0, max_actions=20, split_sizes=SIZES, cache_dir=cache_dir)
    tasks = env.tasks("train") + env.tasks("valid_seen") + env.tasks("valid_unseen")
    rng = random.Random(1)
    wins = 0
    for episode in range(1000):
        env.reset(tasks[episode % len(tasks)])
        while not env.done:
            roll = rng.random()
            action = None if roll < 0.05 else "open sesame" if roll < 0.1 else rng.choice(env.admissible_actions())
            _, _, info = env.step(action)
        wins += info["won"]
    assert wins < 50


@pytest.mark.parametrize("action", [None, "", "  ", "fly", "go to", "take", 7, b"look", "look look",
                                    "<action>look</action>", "x" * 5000, "\x00\n\t"])
def test_invalid_actions_are_counted_not_raised(env, action):
    task = env.tasks("train")[0]
    first = env.reset(task)
    before = env.admissible_actions()
    observation, done, info = env.step(action)
    assert observation == NOTHING_HAPPENS and not done
    assert info["valid_action"] is False and info["no_progress"] is True and info["won"] is False
    assert env.num_invalid == 1 and env.num_actions == 1 and env.num_no_progress == 1
    assert env.admissible_actions() == before and env.reset(task) == first


def test_commands_are_matched_case_and_space_insensitively(env):
    env.reset(env.tasks("train")[0])
    target = next(a for a in env.admissible_actions() if a.startswith("go to "))
    _, _, info = env.step("  " + target.upper().replace(" ", "   ") + " ")
    assert info["valid_action"] and not info["no_progress"]


def test_no_progress_means_the_world_did_not_change(env):
    env.reset(env.tasks("train")[0])
    _, _, info = env.step("look")
    assert info["valid_action"] and info["no_progress"]
    _, _, info = env.step("inventory")
    assert info["valid_action"] and info["no_progress"]
    target = next(a for a in env.admissible_actions() if a.startswith("go to "))
    _, _, info = env.step(target)
    assert info["valid_action"] and not info["no_progress"]
    assert target not in env.admissible_actions()  # going where you are is not a command
    _, _, info = env.step("examine " + target[len("go to "):])
    assert info["valid_action"] and info["no_progress"]
    assert env.num_no_progress == 3 and env.num_invalid == 0


def test_horizon_and_step_after_done(cache_dir, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    env = AlfworldEnv("train", 0, max_actions=3, split_sizes=SIZES, cache_dir=cache_dir)
    env.reset(env.tasks("train")[0])
    results = [env.step("look") for _ in range(3)]
    assert [done for _, done, _ in results] == [False, False, True]
    assert results[-1][2]["won"] is False
    with pytest.raises(RuntimeError, match="over"):
        env.step("look")
    with pytest.raises(RuntimeError, match="over"):
        env.expert_action()


def test_episode_methods_before_reset(env):
    assert env.admissible_actions() is None
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")
    with pytest.raises(RuntimeError, match="reset"):
        env.expert_action()
    with pytest.raises(TypeError, match="Task"):
        env.reset("pick_and_place_simple")


def test_forks_do_not_share_episode_state(env):
    tasks = env.tasks("train")
    solo = env.fork()
    expected = [solo.reset(tasks[0])] + [solo.step(a)[0] for a in ("look", "inventory")]
    a, b = env.fork(), env.fork()
    first_a, first_b = a.reset(tasks[0]), b.reset(tasks[6])
    b.step(b.admissible_actions()[0])
    seen = [first_a, a.step("look")[0]]
    b.step(b.expert_action())
    seen.append(a.step("inventory")[0])
    assert seen == expected and first_b != first_a
    assert (a.num_actions, b.num_actions) == (2, 2) and a.task.id != b.task.id
    assert a.tasks("train") == b.tasks("train")  # the task lists are shared data


def test_forks_play_concurrently_in_threads(env):
    import concurrent.futures

    tasks = env.tasks("train")[:4]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda task: play_expert(env.fork(), task)[0]["won"], tasks))
    assert results == [True] * 4


def test_planner_failure_falls_back_to_handcoded_expert(env, monkeypatch):
    monkeypatch.setattr(alfworld_engine, "planner_plan", lambda engine: [])
    task = next(t for t in env.tasks("train") if t.kind == "pick_and_place_simple")
    env.reset(task)
    env._plan = None  # forget the stored walkthrough, so the (failing) planner is asked
    action = env.expert_action()
    assert env.last_expert == "handcoded" and env.num_expert_fallbacks == 1
    assert action in env.admissible_actions()
    done, info = False, {}
    while not done:
        _, done, info = env.step(env.expert_action())
    assert env.last_expert == "handcoded"
    assert info["won"], "alfworld's hand-coded expert should solve a pick-and-place task in 50 actions"


def test_resets_reuse_the_translation(env, monkeypatch):
    """The trainer resets N episodes per task: only the first load of a game translates it."""
    calls = []
    translate = alfworld_engine._translate
    monkeypatch.setattr(alfworld_engine, "_translate", lambda *a: calls.append(1) or translate(*a))
    tasks = env.tasks("valid_unseen")[:2]
    alfworld_engine._records.clear()
    forks = [env.fork() for _ in range(3)]
    observations = {task.id: {f.reset(task) for f in forks for _ in range(2)} for task in tasks}
    assert len(calls) == 2 and all(len(texts) == 1 for texts in observations.values())


def test_bad_constructor_arguments(cache_dir):
    with pytest.raises(ValueError, match="split='test'"):
        AlfworldEnv("test")
    with pytest.raises(TypeError, match="seed"):
        AlfworldEnv("train", seed="0")
    with pytest.raises(ValueError, match="max_actions"):
        AlfworldEnv("train", max_actions=0)
    with pytest.raises(ValueError, match="split_sizes"):
        AlfworldEnv("train", split_sizes={"dev": 10})
    with pytest.raises(ValueError, match="split_sizes"):
        AlfworldEnv("train", split_sizes={"train": 3})
    with pytest.raises(ValueError, match="source"):
        AlfworldEnv("train", source="web")
    with pytest.raises(ValueError, match="num_workers"):
        AlfworldEnv("train", num_workers=0)


def test_empty_alfworld_data_is_a_clear_error(tmp_path, monkeypatch):
    """An error, not AlfredTWEnv's hang on an empty game list."""
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="json_2.1.1"):
        make("alfworld", split="train")
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    env = make("alfworld", split="train")
    with pytest.raises(ValueError, match="no solvable ALFWorld games"):
        env.tasks("train")
    with pytest.raises(ValueError, match="source='official'"):
        monkeypatch.delenv("ALFWORLD_DATA")
        make("alfworld", split="train", source="official")


def test_official_layout_is_played_when_alfworld_data_is_set(env, tmp_path, monkeypatch):
    """Our games are written in ALFWorld's own layout, so they serve as a stand-in official set."""
    root = tmp_path / "data"
    for split in ("train", "valid_unseen"):
        for task in env.tasks(split)[:3]:
            source = os.path.dirname(task.payload["gamefile"])
            shutil.copytree(source, root / "json_2.1.1" / split / task.id.split("/", 1)[1])
    unsolvable = root / "json_2.1.1" / "train" / "zz-unsolvable" / "trial_0"
    shutil.copytree(os.path.dirname(env.tasks("train")[0].payload["gamefile"]), unsolvable)
    game = json.loads((unsolvable / "game.tw-pddl").read_text())
    game["solvable"] = False
    (unsolvable / "game.tw-pddl").write_text(json.dumps(game))
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    official = make("alfworld", split="train")
    tasks = official.tasks("train")
    assert [t.id for t in tasks] == sorted(t.id for t in env.tasks("train")[:3])
    assert {t.payload["source"] for t in tasks} == {"official"}
    by_id = {t.id: t for t in env.tasks("train")}
    assert all(t.description == by_id[t.id].description for t in tasks)
    info, _ = play_expert(official, tasks[0])
    assert info["won"]
    generated = make("alfworld", split="train", source="generated", split_sizes=SIZES, cache_dir=env._catalog.cache_dir)
    assert generated.tasks("train") == env.tasks("train")


def test_task_from_a_missing_cache_is_a_clear_error(env):
    task = env.tasks("train")[0]
    gone = Task(task.id, task.split, task.description, task.kind, dict(task.payload, gamefile="/nonexistent/game.tw-pddl"))
    with pytest.raises(ValueError, match="missing"):
        env.reset(gone)


def test_importing_orsd_envs_needs_no_alfworld(tmp_path):
    """With alfworld unimportable, `orsd.envs` imports and asking for the env says what to install."""
    code = (
        "import sys; sys.modules['alfworld'] = None; sys.modules['textworld'] = None\n"
        "import orsd.envs\n"
        "try:\n    orsd.envs.make('alfworld')\nexcept ImportError as e:\n    print('IMPORT-ERROR', e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert result.returncode == 0, result.stderr
    assert "IMPORT-ERROR" in result.stdout and "pip install 'orsd[alfworld]'" in result.stdout
