"""Held-out evaluation: fixed tasks of a held-out split, a few samples each at temperature 0.6.

Reports what the paper reports: success rate (overall and per ALFWorld task type) and, for the
shop, WebShop's official score, and beside them one small record per episode (`episode_records`)
so that two evaluations can be paired episode by episode. The same `num_tasks` tasks of the split
(a fixed sample stratified by task kind, `eval_tasks`) are used every time, so evaluations of one
run, and of different runs, are comparable.

Common random numbers: every episode samples with keyed sampling (engines/base.py), its turn t
keyed `heldout:<task id>:<sample>:<t>` and seeded by train.seed. An episode therefore draws the
same random numbers whatever else is evaluated with it, in whatever batches, and whenever the
evaluation runs: one policy gives the same episodes every time, and two policies (the start and the
end of a run, two arms of a seed) meet the same random numbers episode by episode, so their
difference is paired. The global torch generator is neither read nor reseeded, so when an
evaluation runs never changes training.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

from orsd import envs
from orsd.engines.base import Sampling
from orsd.engines.hf import HfEngine

from .model import autocast
from .records import Group
from .rollout import Episodes, rollout

DEFAULT_EVAL_SPLIT = {"webshop": "test", "alfworld": "valid_unseen"}


def eval_tasks(env, split: str, num_tasks: int) -> list:
    """The held-out sample: `num_tasks` tasks of the split, stratified by task kind (WebShop's
    product category, ALFWorld's task type).

    Each kind's tasks are shuffled with a seed of their own, and tasks are taken round-robin over
    the kinds (in a seeded order): every kind gets `num_tasks // kinds` tasks or one more (the
    first kinds of that order), a kind with fewer tasks than its share leaves the rest to the
    others, and a smaller sample is the start of a larger one. The seeds are fixed, not the run's:
    every run, and every evaluation of a run, sees the same tasks."""
    tasks = env.tasks(split)
    if not tasks:
        raise ValueError(f"split={split!r} of env {env.name!r} has no tasks to evaluate on")
    by_kind: dict[str, list] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.id):
        by_kind[task.kind].append(task)
    for kind, members in by_kind.items():
        random.Random(f"eval_tasks:{kind}").shuffle(members)
    kinds = sorted(by_kind)
    random.Random("eval_tasks").shuffle(kinds)
    chosen = [by_kind[kind][rank] for rank in range(max(map(len, by_kind.values())))
              for kind in kinds if rank < len(by_kind[kind])]
    return chosen[:num_tasks]


def episode_records(groups: list[Group]) -> list[dict]:
    """One record per episode, small enough for eval.jsonl (no token ids, no observations): the
    task and its kind, the sample index, the outcome, the actions taken (None where the reply had
    no parsable action), how many were invalid, the turns and the env error ("" if none). (task,
    sample) names the episode across evaluations: its random numbers are the same in every one."""
    return [{"task": group.task.id, "kind": group.task.kind, "sample": sample, "score": t.score,
             "won": t.won, "actions": list(t.actions), "invalid_actions": t.num_invalid,
             "turns": len(t.actions), "error": t.error}
            for group in groups for sample, t in enumerate(group.trajectories)]


def summarize(groups: list[Group], env_name: str, split: str, step: int) -> dict:
    """success rate and mean official score, overall and per task kind (ALFWorld task type), and
    the episodes' records."""
    per_kind: dict[str, list] = defaultdict(list)
    trajectories = [t for g in groups for t in g.trajectories]
    for trajectory in trajectories:
        per_kind[trajectory.task.kind].append(trajectory)
    episodes = max(len(trajectories), 1)
    return {
        "step": step,
        "env": env_name,
        "split": split,
        "num_tasks": len(groups),
        "num_episodes": len(trajectories),
        "success_rate": sum(t.won for t in trajectories) / episodes,
        "score_mean": sum(t.score for t in trajectories) / episodes,
        "env_errors": sum(bool(t.error) for t in trajectories),
        "per_kind": {kind: {"success_rate": sum(t.won for t in ts) / len(ts),
                            "score_mean": sum(t.score for t in ts) / len(ts), "episodes": len(ts)}
                     for kind, ts in sorted(per_kind.items())},
        "episodes": episode_records(groups),
    }


@contextmanager
def engine_batch_size(engine, batch_size: int | None):
    """The engine batches at most `batch_size` requests meanwhile (0: as many as its token budget
    allows; None, or an engine without a batch size such as vllm's: as it does)."""
    if batch_size is None or not hasattr(engine, "batch_size"):
        yield
        return
    saved, engine.batch_size = engine.batch_size, batch_size
    try:
        yield
    finally:
        engine.batch_size = saved


def evaluate(engine, tokenizer, env, split: str, num_tasks: int, episodes: Episodes, step: int = 0,
             batch_size: int | None = None) -> dict:
    """`episodes.samples` episodes on each of `num_tasks` held-out tasks of `split`, sampled as
    `episodes.sampling` says (its seed keys them: module docstring), `batch_size` requests per engine
    batch (train.eval_batch_size; None: the engine's own)."""
    tasks = eval_tasks(env, split, num_tasks)
    with engine_batch_size(engine, batch_size):
        groups = rollout(engine, tokenizer, env, tasks, episodes, group_keys=[f"heldout:{t.id}" for t in tasks])
    return {**summarize(groups, env.name, split, step), "seed": episodes.sampling.seed}


def eval_episodes(config, samples: int = 0) -> Episodes:
    """A run's held-out episodes: train.eval_samples (or `samples`) per task at train.eval_temperature,
    with the rollouts' nucleus and top-k filters and budgets, keyed by train.seed."""
    t, r = config.train, config.rollout
    return Episodes.from_config(config, samples or t.eval_samples,
                                Sampling(t.eval_temperature, r.top_p, r.max_new_tokens, top_k=r.top_k, seed=t.seed))


class HeldOut:
    """Evaluations of a run's current policy through its engine on the held-out split (env.eval_split
    or the env's default), the env made on first use."""

    def __init__(self, config, policy, engine, tokenizer):
        self.config, self.policy, self.engine, self.tokenizer = config, policy, engine, tokenizer
        self.split = config.env.eval_split or DEFAULT_EVAL_SPLIT[config.env.name]
        self.env = None

    def __call__(self, step: int) -> dict:
        cfg = self.config
        self.env = self.env or make_eval_env(cfg, self.split)
        with autocast(self.policy, cfg.model.autocast):
            return evaluate(self.engine, self.tokenizer, self.env, self.split, cfg.train.eval_tasks,
                            eval_episodes(cfg), step, cfg.train.eval_batch_size)


def make_eval_env(config, split: str):
    """The run's env (envs.from_config) on the held-out `split`."""
    return envs.from_config(config.env, split)


def format_eval(result: dict) -> str:
    lines = [f"{result['env']} {result['split']} @ step {result['step']}: success {result['success_rate']:.3f}, "
             f"score {result['score_mean']:.3f} over {result['num_episodes']} episodes"]
    for kind, row in result["per_kind"].items():
        lines.append(f"  {kind}: success {row['success_rate']:.3f} ({row['episodes']} episodes)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`orsd-eval CHECKPOINT [--config FILE] [--split S] [--tasks K] [--samples N] [--run-dir DIR]`."""
    from .config import ConfigError, load_config
    from .model import load_policy, load_tokenizer
    from orsd.report.run_dir import RunDir

    parser = argparse.ArgumentParser(prog="orsd-eval", description="Evaluate a policy checkpoint on held-out tasks.")
    parser.add_argument("checkpoint", help="an HF model directory: a run's checkpoint runs/<name>/checkpoints/step_<k> "
                        "(written every train.save_every steps and at the end; the summary names the last one), "
                        "or any model directory")
    parser.add_argument("--config", help="the run's config.yaml (env, budgets); default: the embedded default")
    parser.add_argument("--split", default="", help="held-out split (default: test / valid_unseen)")
    parser.add_argument("--tasks", type=int, default=0, help="number of held-out tasks (default: train.eval_tasks)")
    parser.add_argument("--samples", type=int, default=0, help="samples per task (default: train.eval_samples)")
    parser.add_argument("--step", type=int, default=-1, help="step number recorded with the result")
    parser.add_argument("--run-dir", help="append the result to RUN_DIR/eval.jsonl")
    parser.add_argument("overrides", nargs="*", help="section.key=value config overrides")
    args = parser.parse_intermixed_args(argv)  # overrides may come before, between and after the options
    try:
        config = load_config(args.config, [*args.overrides, f"model.path={args.checkpoint}"])
    except ConfigError as error:
        print(f"orsd-eval: config error: {' '.join(str(error).splitlines())}", file=sys.stderr)
        return 2
    for name in ("tasks", "samples"):
        if getattr(args, name) < 0:
            print(f"orsd-eval: --{name}={getattr(args, name)} must be >= 0", file=sys.stderr)
            return 2
    split = args.split or config.env.eval_split or DEFAULT_EVAL_SPLIT[config.env.name]
    tokenizer = load_tokenizer(args.checkpoint)
    # a random: model is seeded by train.seed, as orsd-train seeds it (orsd-study's shared start evaluation
    # of a seed must evaluate the very policy that seed's runs start from)
    policy = load_policy(args.checkpoint, config.model.dtype, config.model.device, config.model.attn_implementation,
                         config.train.seed)
    start = time.perf_counter()
    with autocast(policy, config.model.autocast):
        result = evaluate(HfEngine(policy, tokenizer, config.train.eval_batch_size), tokenizer,
                          make_eval_env(config, split), split, args.tasks or config.train.eval_tasks,
                          eval_episodes(config, args.samples), args.step)
    result["checkpoint"] = args.checkpoint
    result["seconds"] = time.perf_counter() - start
    print(format_eval(result))
    if args.run_dir:
        RunDir(args.run_dir).append("eval.jsonl", result)
    return 0


if __name__ == "__main__":  # orsd-study runs the shared start evaluation as `python -m orsd.train.evaluate`
    sys.exit(main())
