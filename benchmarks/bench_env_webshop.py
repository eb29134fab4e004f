"""Shop throughput (pytest-benchmark) and the shop's figures for the README.

    pytest benchmarks/bench_env_webshop.py --benchmark-only     # steps per second
    python benchmarks/bench_env_webshop.py [--tasks 200]        # task counts, expert/random rates
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from orsd.envs import make
from orsd.envs.webshop import WebShopEnv

GARBAGE = ("", "buy", "click[", "search[]", "click[nothing here]", "go to fridge 1")


def random_action(env: WebShopEnv, rng: random.Random) -> str | None:
    """Uniform over: no action, a garbage command, a 3-word search from the instruction, a click
    on a random clickable of the page."""
    available = env.available_actions()
    choices = ["none", "garbage"]
    choices.append("search" if available["has_search_bar"] else "click")
    if available["clickables"]:
        choices.append("click")
    kind = rng.choice(choices)
    if kind == "none":
        return None
    if kind == "garbage":
        return rng.choice(GARBAGE)
    if kind == "search":
        words = env.goal.instruction_text.split()
        return f"search[{' '.join(rng.sample(words, 3))}]"
    return f"click[{rng.choice(available['clickables'])}]"


def run_episodes(env: WebShopEnv, tasks, policy) -> tuple[int, float, int]:
    """(successes, summed score, steps) of one episode per task."""
    wins, score, steps = 0, 0.0, 0
    for task in tasks:
        episode = env.fork()
        episode.reset(task)
        while not episode.done:
            _, _, info = episode.step(policy(episode))
            steps += 1
        wins += info["won"]
        score += info["score"]
    return wins, score, steps


def _bench(benchmark, policy_name: str) -> None:
    env = make("webshop", split="test", seed=0)
    tasks = env.tasks("test")[:20]
    rng = random.Random(0)
    policy = (lambda e: e.expert_action()) if policy_name == "expert" else (
        lambda e: random_action(e, rng))
    steps = run_episodes(env, tasks, policy)[2]  # warm the search cache like a long run does
    benchmark.extra_info["steps_per_round"] = steps
    benchmark(run_episodes, env, tasks, policy)
    benchmark.extra_info["steps_per_second"] = steps / benchmark.stats.stats.mean


def test_bench_webshop_expert_steps(benchmark):
    _bench(benchmark, "expert")


def test_bench_webshop_random_steps(benchmark):
    _bench(benchmark, "random")


def test_bench_webshop_search_uncached(benchmark):
    env = make("webshop", seed=0)
    queries = iter([f"{t.description} {i}" for i, t in enumerate(env.tasks("train"))] * 20)
    benchmark(lambda: env.index.search(next(queries)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=200, help="test tasks per policy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    env = make("webshop", split="test", seed=args.seed)
    print(f"build (catalog of {len(env.catalog.products)} products, BM25 index, tasks): "
          f"{time.perf_counter() - start:.2f} s")
    print("\n| split | " + " | ".join(sorted({t.kind for t in env.tasks('train')})) + " | total |")
    print("|---" * 7 + "|")
    for split in env.splits:
        counts = Counter(t.kind for t in env.tasks(split))
        print(f"| {split} | " + " | ".join(str(counts[k]) for k in sorted(counts))
              + f" | {sum(counts.values())} |")
    tasks = env.tasks("test")[:args.tasks]
    rng = random.Random(args.seed)
    print(f"\n| policy ({len(tasks)} test tasks) | success | mean score | steps/s |")
    print("|---|---|---|---|")
    for name, policy in (("expert", lambda e: e.expert_action()),
                         ("random", lambda e: random_action(e, rng))):
        start = time.perf_counter()
        wins, score, steps = run_episodes(env, tasks, policy)
        seconds = time.perf_counter() - start
        print(f"| {name} | {wins / len(tasks):.3f} | {score / len(tasks):.3f} | "
              f"{steps / seconds:.0f} |")


if __name__ == "__main__":
    main()
