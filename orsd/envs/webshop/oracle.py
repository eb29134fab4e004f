"""An oracle rubric for a shop task: process criteria written from the goal itself.

Built from what the task asks for (its product type, attributes, options and price bound), so it
says everything a rubric could usefully tell about that task: the upper bound a policy-written
bundle is measured against (the study's `static_rubric` oracle arm, the Δ probe's rubric kind
"oracle"; docs/evidence.md). It has a bundle's form (5–8 numbered criteria, each an observable
statement about the agent), so it is spliced and replayed exactly like B*.

    python -m orsd.envs.webshop.oracle --train-tasks 8 --out configs/rubrics/cpu_study_oracle.yaml

writes the rubric file (task id -> criteria) of a fixed training pool, for method.rubric_file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from orsd.envs.base import Task
from orsd.envs.webshop.catalog import Goal


def oracle_rubric(task: Task) -> list[str]:
    """5–7 criteria for `task` (a shop task): search, product, each option, price, purchase."""
    goal = Goal.from_dict(task.payload["goal"])
    attributes = " and ".join(goal.attributes) if goal.attributes else "as the instruction describes"
    criteria = [
        f"The agent searches for {goal.query} with words of the instruction, such as \"{goal.search_text}\".",
        f"The agent opens a product that is a {goal.query} described as {attributes}.",
        *(f"On the product page the agent clicks the {name} option \"{value}\"." for name, value in goal.goal_options),
        f"The agent only buys a product whose price is lower than {goal.price_upper:.2f} dollars.",
        "The agent clicks Buy Now after choosing every option the instruction names"
        + (f" ({', '.join(v for _, v in goal.goal_options)})." if goal.goal_options else "."),
    ]
    if len(criteria) < 5:  # a goal without options: one more observable step keeps the bundle's form
        criteria.insert(2, "The agent reads the product's title before choosing it, instead of buying the first result.")
    return criteria[:8]


def train_pool(split: str, size: int, seed: int = 0, **options) -> list[Task]:
    """The training pool a run with env.train_tasks=`size` samples from (Trainer.task_pool)."""
    from orsd.envs import make

    return make("webshop", split=split, seed=seed, **options).task_pool(size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orsd.envs.webshop.oracle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-tasks", type=int, required=True, help="env.train_tasks of the run (>= 1)")
    parser.add_argument("--split", default="train", help="env.split of the run (default: train)")
    parser.add_argument("--seed", type=int, default=0, help="env.seed of the run (default: 0)")
    parser.add_argument("--out", required=True, help="the YAML file to write (task id -> criteria)")
    args = parser.parse_args(argv)
    if args.train_tasks < 1:
        parser.error(f"--train-tasks={args.train_tasks}: expected a task count >= 1")
    tasks = train_pool(args.split, args.train_tasks, args.seed)
    header = (f"# Oracle rubrics (orsd.envs.webshop.oracle) of the shop's {args.split} pool of {len(tasks)} tasks "
              f"(env.train_tasks={args.train_tasks}, env.seed={args.seed}): written from each goal, an upper bound\n"
              "# on what a rubric could tell. For method.name=static_rubric, method.rubric_file=<this file>.\n")
    body = yaml.safe_dump({task.id: oracle_rubric(task) for task in tasks}, sort_keys=False, width=200)
    Path(args.out).write_text(header + body)
    print(f"wrote {args.out}: {len(tasks)} tasks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
