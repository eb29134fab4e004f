"""ALFWorld throughput (pytest-benchmark) and the ALFWorld figures for the README.

    pytest benchmarks/bench_env_alfworld.py --benchmark-only   # reset and step timings
    python benchmarks/bench_env_alfworld.py [--episodes 144]   # counts, build cost, success rates

Both use the generated tasks of seed 0 in ~/.cache/orsd/alfworld (built on first use: the
pytest part builds a small set, about a minute; the script the default splits, see
docs/alfworld.md for what that costs).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path

from orsd.envs import make
from orsd.envs.alfworld import AlfworldEnv
from orsd.envs.alfworld.generator import cache_root, split_folder
from orsd.envs.alfworld.scenes import TASK_TYPES

BENCH_SIZES = {"train": 12, "valid_seen": 6, "valid_unseen": 6}
GARBAGE = (None, "", "jump", "go to the moon", "take everything")


def random_action(env: AlfworldEnv, rng: random.Random) -> str | None:
    """An admissible command 80% of the time, else garbage or no action."""
    if rng.random() < 0.2:
        return rng.choice(GARBAGE)
    return rng.choice(env.admissible_actions())


def run_episodes(env: AlfworldEnv, tasks, policy) -> tuple[int, int]:
    """(wins, attempted actions) of one episode per task."""
    wins = actions = 0
    for task in tasks:
        env.reset(task)
        info = {"won": False}
        while not env.done:
            _, _, info = env.step(policy(env))
            actions += 1
        wins += info["won"]
    return wins, actions


def _bench_env() -> AlfworldEnv:
    return make("alfworld", split="train", seed=0, split_sizes=BENCH_SIZES, source="generated")


def test_bench_alfworld_reset(benchmark):
    """Reset of a task whose game this process has loaded before (the trainer's common case)."""
    env = _bench_env()
    task = env.tasks("train")[2]
    env.reset(task)
    benchmark(env.reset, task)


def test_bench_alfworld_reset_new_game(benchmark):
    """First reset of a game in this process: parse + PDDL translation (cached afterwards)."""
    from orsd.envs.alfworld import engine as alfworld_engine

    env = _bench_env()
    tasks = env.tasks("train") + env.tasks("valid_seen") + env.tasks("valid_unseen")

    def first_reset(task):
        alfworld_engine._records.clear()  # forget the translation, as a fresh process would
        env._loaded_gamefile = None
        env.reset(task)

    queue = iter(tasks * 100)
    benchmark.pedantic(lambda: first_reset(next(queue)), rounds=len(tasks), iterations=1)


def test_bench_alfworld_random_steps(benchmark):
    """Steps of a random policy (mostly admissible commands) over the benchmark tasks."""
    env = _bench_env()
    tasks = env.tasks("train")
    rng = random.Random(0)
    steps = run_episodes(env, tasks, lambda e: random_action(e, rng))[1]  # warm the caches
    benchmark.extra_info["steps_per_round"] = steps
    benchmark.pedantic(run_episodes, args=(env, tasks, lambda e: random_action(e, rng)), rounds=3, iterations=1)
    benchmark.extra_info["steps_per_second"] = steps / benchmark.stats.stats.mean


def test_bench_alfworld_expert_episodes(benchmark):
    """Expert episodes (stored planner plan, no replanning) over the benchmark tasks."""
    env = _bench_env()
    tasks = env.tasks("valid_unseen")
    benchmark.pedantic(run_episodes, args=(env, tasks, lambda e: e.expert_action()), rounds=3, iterations=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=144, help="episodes per (policy, split)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    env = make("alfworld", split="train", seed=args.seed, num_workers=args.workers, source="generated")
    for split in env.splits:
        env.tasks(split)
    print(f"tasks ready (generated now or loaded from the cache): {time.perf_counter() - start:.1f} s")

    print("\n| split | " + " | ".join(TASK_TYPES) + " | total | rooms |")
    print("|---" * (len(TASK_TYPES) + 3) + "|")
    for split in env.splits:
        tasks = env.tasks(split)
        counts = Counter(t.kind for t in tasks)
        rooms = len({t.payload["floor_plan"] for t in tasks})
        print(f"| {split} | " + " | ".join(str(counts[k]) for k in TASK_TYPES) + f" | {len(tasks)} | {rooms} |")

    print("\n| split | build s | checks s (summed over workers) | check s per task: mean / median / max | rejected |")
    print("|---|---|---|---|---|")
    root = cache_root(None, args.seed)
    for split in env.splits:
        manifest = json.loads((root / split_folder(split, env._catalog.split_sizes) / "manifest.json").read_text())
        seconds = [t["check_seconds"] for t in manifest["tasks"]]
        print(f"| {split} | {manifest['build_seconds']:.0f} | {manifest['check_seconds']:.0f} | "
              f"{statistics.mean(seconds):.2f} / {statistics.median(seconds):.2f} / {max(seconds):.2f} | "
              f"{manifest['num_rejected']} |")
    by_type: dict[str, list[float]] = {}
    for split in env.splits:
        manifest = json.loads((root / split_folder(split, env._catalog.split_sizes) / "manifest.json").read_text())
        for t in manifest["tasks"]:
            by_type.setdefault(t["task_type"], []).append(t["check_seconds"])
    print("\n| task type | check s mean | max | plan length mean |")
    print("|---|---|---|---|")
    lengths: dict[str, list[int]] = {}
    for split in env.splits:
        for path in [Path(t.payload["gamefile"]) for t in env.tasks(split)]:
            game = json.loads(path.read_text())
            lengths.setdefault(json.loads((path.parent / "traj_data.json").read_text())["task_type"], []).append(
                len(game["walkthrough"]))
    for kind in TASK_TYPES:
        print(f"| {kind} | {statistics.mean(by_type[kind]):.2f} | {max(by_type[kind]):.2f} | "
              f"{statistics.mean(lengths[kind]):.1f} |")

    rng = random.Random(args.seed)
    print("\n| policy | split | episodes | success | actions/s |")
    print("|---|---|---|---|---|")
    for name, policy in (("expert", lambda e: e.expert_action()), ("random", lambda e: random_action(e, rng))):
        for split in ("train", "valid_seen", "valid_unseen"):
            tasks = env.tasks(split)
            tasks = random.Random(1).sample(tasks, min(args.episodes, len(tasks)))
            started = time.perf_counter()
            wins, actions = run_episodes(env, tasks, policy)
            seconds = time.perf_counter() - started
            print(f"| {name} | {split} | {len(tasks)} | {wins / len(tasks):.3f} | {actions / seconds:.0f} |")


if __name__ == "__main__":
    main()
