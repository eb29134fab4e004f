"""`orsd-train`: build everything from the config, train, and leave an inspectable run directory."""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from pathlib import Path

from .config import ConfigError, field_docs, load_config, to_yaml


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        prog="orsd-train",
        description="Train an LLM agent with GRPO + Online Rubric Self-Distillation (arXiv 2611.06543). "
                    "With no arguments: the embedded CPU default (SmolLM2-135M on the offline shop).",
        epilog="overrides: section.key=value (YAML values), e.g. rubric.num_bundles=2 method.name=grpo. "
               "All keys: orsd-train --help-config, or docs/config.md.")
    parser.add_argument("--config", help="YAML config (a preset from configs/, or your own)")
    parser.add_argument("--run-dir", help="run directory (default runs/<train.run_name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its last checkpoint (same results as unbroken)")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved, validated config and exit")
    parser.add_argument("--help-config", action="store_true", help="list every config key with its default")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.help_config:
        for key, type_name, default, help_text in field_docs():
            print(f"{key} ({type_name}, default {default!r}): {help_text}")
        return 0
    try:
        config = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as error:
        print(f"orsd-train: config error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(to_yaml(config), end="")
        return 0
    summary = run(config, args.run_dir, resume=args.resume)
    print(format_summary(summary))
    return 0


def run(config, run_dir: str | None = None, resume: bool = False, log=print) -> dict:
    """Train for `train.steps` steps (continuing from the last checkpoint when `resume`); returns the
    summary, also appended to summary.jsonl."""
    from orsd.report.reporter import Reporter, write_report
    from orsd.report.run_dir import RunDir
    from orsd.train import checkpoint
    from orsd.train.build import build
    from orsd.train.config import to_dict
    from orsd.train.distributed import launch_env

    started = time.perf_counter()
    main_rank = launch_env()[0] == 0  # only rank 0 writes the run directory and talks
    log = log if main_rank else (lambda *_: None)
    out = RunDir(run_dir or Path("runs") / config.train.run_name, writer=main_rank)
    resume_from = checkpoint.latest(out.path) if resume else None
    if resume_from is None and out.read("steps.jsonl"):
        raise SystemExit(f"orsd-train: {out.path} already holds a run; pass --resume to continue it "
                         f"or --run-dir for a new one")
    out.write_config(to_dict(config))
    out.write_environment(config.train.seed)
    trainer, warm_losses = build(config, out.path, resume_from, log)
    if resume_from is not None:
        checkpoint.restore(trainer, resume_from)
        out.truncate_after(trainer.step_index)  # drop records of steps the checkpoint does not hold
        log(f"resumed from {resume_from} at step {trainer.step_index}")
    t = config.train
    reporter = Reporter(out.path, tensorboard=t.tensorboard and main_rank, wandb=t.wandb and main_rank,
                        config=config, purge_step=trainer.step_index + 1 if resume_from is not None else None)
    try:
        steps, setup_seconds = train_loop(config, trainer, out, reporter, log, started)
    finally:
        reporter.close()
    final = checkpoint.latest(out.path)
    summary = summarize(config, steps, setup_seconds, time.perf_counter() - started, warm_losses, final)
    out.append("summary.jsonl", summary)
    if t.report and main_rank:
        log(f"report: {write_report(out.path)}")
    return summary


def train_loop(config, trainer, out, reporter, log, started):
    from tqdm import tqdm

    from orsd.train import checkpoint
    from orsd.train.evaluate import evaluate_trainer, format_eval

    t = config.train

    def evaluate_now():  # on rank 0 only: every rank holds (or generates from) the full policy
        if trainer.rank == 0:
            result = evaluate_trainer(trainer, trainer.step_index)
            out.append("eval.jsonl", result)
            reporter.log_eval(result)
            log(format_eval(result))
        if trainer.dist is not None:
            trainer.dist.barrier()

    if t.eval_before and trainer.step_index == 0:
        evaluate_now()
    setup_seconds = time.perf_counter() - started
    steps = []
    bar = tqdm(range(trainer.step_index, t.steps), desc="orsd-train", disable=not t.progress or trainer.rank != 0,
               unit="step",
               initial=trainer.step_index, total=t.steps)
    for _ in bar:
        result = trainer.step()
        record = dict(result.metrics, seconds=result.seconds)
        out.append("steps.jsonl", record)
        for i, group in enumerate(result.records):
            out.append("groups.jsonl", dict(step=record["step"], group=i, **group))
        reporter.log_step(record)
        steps.append(record)
        bar.set_postfix(reward=f"{record['reward_mean']:.3f}", bundle=f"{record['groups_with_bundle']:.2f}")
        if t.eval_every and trainer.step_index % t.eval_every == 0:
            evaluate_now()
        if t.save_every and trainer.step_index % t.save_every == 0 and trainer.step_index < t.steps:
            checkpoint.save(trainer, out.path, t.keep_checkpoints)
    checkpoint.save(trainer, out.path, t.keep_checkpoints)
    return steps, setup_seconds


def summarize(config, steps: list[dict], setup_seconds: float, wall_seconds: float, warm_losses, final) -> dict:
    def mean(key):
        values = [s[key] for s in steps if s.get(key) is not None]
        return sum(values) / len(values) if values else None

    stages: dict[str, float] = {}
    for s in steps:
        for name, value in s["seconds"].items():
            stages[name] = stages.get(name, 0.0) + value / len(steps)
    return {
        "method": config.method.name,
        "steps": len(steps),
        "wall_seconds": wall_seconds,
        "setup_seconds": setup_seconds,
        "stage_seconds_per_step": stages,
        "reward_first": steps[0]["reward_mean"] if steps else None,
        "reward_last": steps[-1]["reward_mean"] if steps else None,
        "reward_mean": mean("reward_mean"),
        "success_rate_mean": mean("success_rate"),
        "fraction_groups_rewards_differ": mean("groups_rewards_differ"),
        "fraction_groups_with_bundle": mean("groups_with_bundle"),
        "valid_token_fraction_mean": mean("valid_token_fraction"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "warm_start_loss": [warm_losses[0], warm_losses[-1]] if warm_losses else None,
        "checkpoint": str(final),
    }


def format_summary(s: dict) -> str:
    def num(v, fmt=".3f"):
        return "n/a" if v is None else format(v, fmt)

    lines = [
        f"done: {s['steps']} {s['method']} steps in {s['wall_seconds']:.0f} s (setup {s['setup_seconds']:.0f} s), "
        f"peak RSS {s['peak_rss_mb']:.0f} MB",
        f"reward: first {num(s['reward_first'])}, last {num(s['reward_last'])}, mean {num(s['reward_mean'])}; "
        f"success {num(s['success_rate_mean'])}",
        f"groups whose rewards differ: {num(s['fraction_groups_rewards_differ'], '.0%')}; "
        f"groups with a selected bundle: {num(s['fraction_groups_with_bundle'], '.0%')}; "
        f"response tokens with e=1: {num(s['valid_token_fraction_mean'], '.0%')}",
        "seconds per step: " + ", ".join(f"{k} {v:.1f}" for k, v in s["stage_seconds_per_step"].items()),
        f"model: {s['checkpoint']}",
    ]
    return "\n".join(lines)


def eval_main(argv: list[str] | None = None) -> int:
    """`orsd-eval`: evaluate a checkpoint on held-out tasks (see orsd.train.evaluate)."""
    from orsd.train.evaluate import main as evaluate_main

    return evaluate_main(argv)


if __name__ == "__main__":
    sys.exit(main())
