"""The sped-up engine plays exactly like TextWorld's own PddlEnv + alfworld's wrappers."""

from __future__ import annotations

import json
import os
import inspect
import subprocess
import sys
import textwrap

import pytest
from helpers.alfworld import SIZES  # cache_dir (tests/envs/conftest.py) is built with these sizes

pytest.importorskip("alfworld", reason="the [alfworld] extra is not installed")

from orsd.envs.alfworld import engine as alfworld_engine, generator as alfworld_generator  # noqa: E402


def random_walk(env, gamefile, seed, steps):
    """A fixed random walk: the observation, command list and `won` of every state along it. Played
    here on our engine and, from this function's source (UPSTREAM), on the upstream stack."""
    import random

    env.load(gamefile)
    state = env.reset()
    rng = random.Random(seed)
    trace = [[state.feedback, state["admissible_commands"], state["won"]]]
    for _ in range(steps):
        state, _, _ = env.step(rng.choice(state["admissible_commands"]))
        trace.append([state.feedback, state["admissible_commands"], state["won"]])
    return trace


# Plays the same walk with the untouched upstream stack (no orsd import: a fresh process,
# so none of our memoisation is installed) and prints every observation and command list.
UPSTREAM = inspect.getsource(random_walk) + textwrap.dedent("""
    import json, sys
    import textworld
    from textworld.envs import PddlEnv
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
    infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
    env = AlfredDemangler(AlfredInfos(PddlEnv(infos)))
    print(json.dumps(random_walk(env, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
""")


def check_against_upstream(gamefile, seed, steps):
    upstream = subprocess.run([sys.executable, "-c", UPSTREAM, gamefile, str(seed), str(steps)],
                              capture_output=True, text=True, timeout=600, check=True)
    expected = json.loads(upstream.stdout)
    engine = alfworld_engine.new_engine()
    # twice: the second run goes through the shared caches (record, commands, parsers)
    assert random_walk(engine, gamefile, seed, steps) == expected
    assert random_walk(engine, gamefile, seed, steps) == expected
    alfworld_engine.close_engine(engine)


def test_same_text_and_commands_as_upstream_textworld(cache_dir):
    entries = alfworld_generator.prepare(cache_dir, 0, SIZES, num_workers=2)
    kitchen = next(e for e in entries["train"] if e["task_type"] == "pick_heat_then_place_in_recep")
    check_against_upstream(kitchen["gamefile"], seed=0, steps=20)


@pytest.mark.slow
def test_same_text_and_commands_as_upstream_textworld_every_type(cache_dir):
    entries = alfworld_generator.prepare(cache_dir, 0, SIZES, num_workers=2)
    for seed, entry in enumerate(entries["train"][::2]):  # one task of each type
        check_against_upstream(entry["gamefile"], seed, steps=25)


def test_translation_does_not_leak_sys_argv(cache_dir):
    entry = alfworld_generator.prepare(cache_dir, 0, SIZES, num_workers=2)["valid_seen"][0]
    argv = list(sys.argv)
    engine = alfworld_engine.new_engine()
    engine.load(entry["gamefile"])
    engine.reset()
    assert alfworld_engine.planner_plan(engine)
    assert sys.argv == argv
    alfworld_engine.close_engine(engine)


def test_importing_the_engine_leaves_alfworld_data_unset(monkeypatch):
    code = ("import os; from orsd.envs.alfworld import engine as e; e.require_alfworld(); "
            "print(os.environ.get('ALFWORLD_DATA'))")
    environment = {k: v for k, v in os.environ.items() if k != "ALFWORLD_DATA"}
    environment["PYTHONPATH"] = os.pathsep.join(sys.path)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=environment, check=True)
    assert result.stdout.strip() == "None"
