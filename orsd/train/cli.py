"""`orsd-train`: build everything from the config, train, and leave an inspectable run directory."""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from .config import ConfigError, field_docs, load_config, resumable_keys, to_dict, to_yaml


class RunError(Exception):
    """The run cannot start as asked (the run directory, a resumed config, the verifier endpoint);
    the message says why and what to do."""


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        prog="orsd-train",
        description="Train an LLM agent with GRPO + Online Rubric Self-Distillation (arXiv 2611.06543). "
                    "With no arguments: the embedded CPU default (SmolLM2-135M on the offline shop).",
        epilog="overrides: section.key=value (YAML values), e.g. rubric.num_bundles=2 method.name=grpo. "
               "All keys: orsd-train --help-config, or docs/config.md.")
    parser.add_argument("--config", help="YAML config (a preset from configs/, or your own); with --resume it is "
                                         "layered on the run's own config.yaml")
    parser.add_argument("--run-dir", help="run directory (default runs/<train.run_name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its last checkpoint with the run's own config.yaml "
                             "(same results as unbroken); overrides may change only the keys marked resume")
    parser.add_argument("--dry-run", action="store_true", help="print the resolved, validated config and exit")
    parser.add_argument("--help-config", action="store_true", help="list every config key with its default")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    return parser.parse_intermixed_args(argv)  # overrides may come before, between and after the options


def main(argv: list[str] | None = None) -> int:
    sleeping_openmp_threads()
    args = parse_args(argv)
    if args.help_config:
        for row in field_docs():
            print(f"{row.key} ({row.type}, default {row.default!r}, allowed: {row.allowed}): {row.help}")
        return 0
    try:
        config = resolve_config(args.config, args.overrides, args.run_dir, args.resume)
    except ConfigError as error:
        print(f"orsd-train: config error: {one_line(error)}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(to_yaml(config), end="")
        return 0
    try:
        summary = run(config, args.run_dir, resume=args.resume)
    except RunError as error:
        print(f"orsd-train: {one_line(error)}", file=sys.stderr)
        return 2
    except ConfigError as error:  # what only the loaded model can refuse (model.lora's target modules)
        print(f"orsd-train: config error: {one_line(error)}", file=sys.stderr)
        return 2
    if summary is not None:
        print(format_summary(summary))
    return 0


def sleeping_openmp_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE, unless already set).
    libgomp reads this once, when torch loads it, so it must run before torch is imported.

    torch's threads otherwise spin between parallel regions, and on cores another process also
    wants a spinning thread holds the core its partner needs, and a decode step's small matmuls
    then wait for it (docs/performance.md, a shared machine)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def one_line(error: Exception) -> str:
    return " ".join(str(error).splitlines())


def run_path(config, run_dir: str | Path | None = None) -> Path:
    return Path(run_dir) if run_dir else Path("runs") / config.train.run_name


def resolve_config(config_path: str | None, overrides: list[str], run_dir: str | None = None, resume: bool = False):
    """The config to run. On resume: the run's own config.yaml, with --config and the overrides layered
    on top (run() then refuses any change that would make the results differ from an unbroken run)."""
    if not resume:
        return load_config(config_path, overrides)
    path = Path(run_dir) if run_dir else run_path(load_config(config_path, overrides))
    saved = path / "config.yaml"
    return load_config(config_path, overrides, base=saved if saved.is_file() else None)


def run(config, run_dir: str | None = None, resume: bool = False, log=print) -> dict | None:
    """Train for `train.steps` steps (continuing from the last checkpoint when `resume`); returns the
    summary, also appended to summary.jsonl, or None when a resumed run was already complete (then
    nothing in its directory is touched)."""
    from orsd.report.cli import write_report
    from orsd.report.logger import Reporter
    from orsd.report.run_dir import RunDir
    from orsd.train import checkpoint
    from orsd.methods import make_method
    from orsd.train.build import build
    from orsd.train.distributed import launch_env

    started = time.perf_counter()
    main_rank = launch_env()[0] == 0  # only rank 0 writes the run directory and talks
    log = log if main_rank else (lambda *_: None)
    path = run_path(config, run_dir)
    if resume:
        resume_from = resumable_checkpoint(path, config, log)
        done = checkpoint.step_of(resume_from)
        if done >= config.train.steps:
            log(f"orsd-train: {path} is complete: {done} steps done (train.steps={config.train.steps}), "
                f"last checkpoint {resume_from}; nothing to do (to train longer: --resume train.steps=N)")
            return None
    else:
        refuse_existing_run(path)
        resume_from = None
    method = make_method(config)  # built once: the check, the warm start and the trainer share it
    check_verifier_reachable(config, method.calls_verifier)
    out = RunDir(path, writer=main_rank)
    out.write_config(to_dict(config))
    trainer, warm_losses = build(config, out.path, resume_from, log, method)
    out.write_environment(config.train.seed, trainer.environment)  # versions + what build decided
    if resume_from is not None:
        trainer.step_index = checkpoint.restore(train_state(trainer), resume_from)
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


def steps_recorded(path: Path) -> int:
    steps = path / "steps.jsonl"
    return steps.read_bytes().count(b"\n") if steps.is_file() else 0  # one line per step


def refuse_existing_run(path: Path) -> None:
    """A fresh run never writes into another run's directory (mixing two runs' records)."""
    from orsd.train import checkpoint

    last, recorded = checkpoint.latest(path), steps_recorded(path)
    if last is not None:
        raise RunError(f"{path} already holds a run (last checkpoint {last.name}): pass --resume to continue it, "
                       f"or --run-dir for a new one")
    if recorded:
        raise RunError(f"{path} already holds a run ({recorded} steps recorded) with no checkpoint to resume from: "
                       f"use a new --run-dir, or remove {path}")


def resumable_checkpoint(path: Path, config, log) -> Path:
    """The checkpoint --resume continues from, after checking that the config differs from the run's
    own config.yaml only in keys that do not change results; the changed keys are logged."""
    from orsd.train import checkpoint

    saved = path / "config.yaml"
    if not saved.is_file():
        raise RunError(f"--resume: {path} holds no run (no config.yaml): start one without --resume")
    last = checkpoint.latest(path)
    if last is None:
        raise RunError(f"--resume: {path} has no checkpoint to resume from ({steps_recorded(path)} steps recorded "
                       f"before it stopped; checkpoints are written every train.save_every steps and at the end). "
                       f"Start fresh with a new --run-dir, or remove {path} and run again without --resume")
    try:
        before = _flat(to_dict(load_config(base=saved)))
    except ConfigError as error:
        raise RunError(f"--resume: the run's own config cannot be read: {error}") from None
    after, allowed = _flat(to_dict(config)), resumable_keys()
    changed = [(key, before.get(key), after[key]) for key in after if before.get(key) != after[key]]
    refused = [change for change in changed if change[0] not in allowed]
    if refused:
        what = "; ".join(f"{key} was {old!r} in {saved}, now {new!r}" for key, old, new in refused)
        raise RunError(f"--resume: {what}. A resumed run gives an unbroken run's results only with its own config; "
                       f"keys that may change: {', '.join(sorted(allowed))}")
    for key, old, new in changed:
        log(f"resume: {key} changed from {old!r} to {new!r}")
    return last


def _flat(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and not prefix:  # sections; dict-valued keys (env.options) compare whole
            flat.update(_flat(value, f"{key}."))
        else:
            flat[prefix + key] = value
    return flat


def check_verifier_reachable(config, calls_verifier: bool, seconds: float = 2.0) -> None:
    """Before any rollout, can a TCP connection be made to the verifier endpoint? Otherwise a run
    would spend its first step's rollouts and then score nothing. Only for an openai verifier the
    method calls, skipped with verifier.check_reachable=false; no request is sent (no key travels), and
    the whole probe, name lookup included, is given `seconds`."""
    v = config.verifier
    openai = v.kind == "openai" or (v.kind == "auto" and bool(v.base_url))
    if not (v.check_reachable and openai and calls_verifier):
        return
    url = urllib.parse.urlsplit(v.base_url)
    address = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
    outcome: dict = {}

    def probe():
        try:
            socket.create_connection(address, timeout=seconds).close()
            outcome["ok"] = True
        except OSError as error:
            outcome["error"] = error

    thread = threading.Thread(target=probe, daemon=True)  # getaddrinfo ignores socket timeouts
    thread.start()
    thread.join(seconds)
    if not outcome.get("ok"):
        why = outcome.get("error") or f"no connection within {seconds:g} s"
        raise RunError(f"verifier.base_url={v.base_url!r} is unreachable ({why}): start the server or fix the URL, "
                       f"or set verifier.check_reachable=false if it comes up later")


def train_loop(config, trainer, out, reporter, log, started):
    from tqdm import tqdm

    from orsd.train import checkpoint
    from orsd.train.evaluate import HeldOut, format_eval

    t = config.train
    held_out = HeldOut(config, trainer.policy, trainer.engine, trainer.tokenizer)

    def evaluate_now():  # on rank 0 only: every rank holds (or generates from) the full policy
        if trainer.rank == 0:
            result = held_out(trainer.step_index)
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
            checkpoint.save(train_state(trainer), trainer.save_policy, trainer.tokenizer, out.path, t.keep_checkpoints)
    checkpoint.save(train_state(trainer), trainer.save_policy, trainer.tokenizer, out.path, t.keep_checkpoints)
    return steps, setup_seconds


def train_state(trainer):
    """The trainer's parts a checkpoint saves and restores (checkpoint.TrainState)."""
    from orsd.train.checkpoint import TrainState

    return TrainState(trainer.step_index, trainer.optimizer, trainer.scheduler, trainer.engine, trainer.task_rng,
                      trainer.method, trainer.ds_engine, trainer.rank, trainer.dist)


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
        f"peak RSS {s['peak_rss_mb']:.0f} MiB",
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
    sleeping_openmp_threads()  # as orsd-train: before evaluate imports torch
    from orsd.train.evaluate import main as evaluate_main

    return evaluate_main(argv)


def export_main(argv: list[str] | None = None) -> int:
    """`orsd-export CHECKPOINT OUT`: a LoRA checkpoint's base with its adapters merged (peft's
    merge_and_unload), written as a plain HF model directory with the tokenizer: what transformers
    or vLLM load without peft (docs/lora.md)."""
    import argparse

    from orsd.train import lora
    from orsd.train.model import load_policy, load_tokenizer

    parser = argparse.ArgumentParser(prog="orsd-export", description=export_main.__doc__)
    parser.add_argument("checkpoint", help="a LoRA checkpoint: runs/<run>/checkpoints/step_<k> of a model.lora run")
    parser.add_argument("out", help="the merged model's directory (must not exist)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype of the merged weights (default float32)")
    args = parser.parse_args(argv)
    if not lora.is_adapter_dir(args.checkpoint):
        parser.exit(2, f"orsd-export: CHECKPOINT={args.checkpoint}: no {lora.ADAPTER_CONFIG}; expected the checkpoint "
                       "of a model.lora run (a full-weight checkpoint is already an HF directory)\n")
    if Path(args.out).exists():
        parser.exit(2, f"orsd-export: OUT={args.out} exists; expected a new directory\n")
    base = lora.saved_settings(args.checkpoint)["base"]
    model = lora.merged(load_policy(base, args.dtype, "cpu"), args.checkpoint)
    model.save_pretrained(args.out)
    load_tokenizer(base).save_pretrained(args.out)
    print(f"orsd-export: {args.checkpoint} merged into {base}, written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
