"""One run of the CPU study (`configs/cpu_study.yaml`) as `orsd-study` launches it: from a shared
initial policy (no warm start of its own), 12 steps, the end evaluation on 128 held-out episodes,
its start evaluation left to the study. Wall time, the time before the first step (loading),
seconds per stage and step, the evaluation's seconds, peak RSS, the load on the machine, and the
sha256 of groups.jsonl (a speed-up that keeps the numerics keeps it).

    python benchmarks/study_run.py INITIAL_POLICY --label after [--seed 0] [--code DIR] [key=value ...]
    python benchmarks/study_run.py --from-run RUN_DIR --wall-seconds S --label before

writes benchmarks/results/study_run/<label>.json. INITIAL_POLICY is a study's
OUT/initial/checkpoints/reference (or any warm-started policy). `--code DIR` runs the orsd of
another checkout (its PYTHONPATH), so that one machine times two commits. `--from-run` reads a run
already made with the same overrides (timed from outside), e.g. `/usr/bin/time orsd-train ...`.
The run is fp32 (model.autocast off), the issue's measure; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from default_run import cpu_description, steal_seconds, timed_train

RESULTS = Path(__file__).parent / "results" / "study_run"
CONFIG = Path(__file__).parent.parent / "configs" / "cpu_study.yaml"


def run_overrides(initial: str, seed: int) -> list[str]:
    """What orsd-study gives every run of a warm-started config (study/plan.py), fp32."""
    return [f"model.path={initial}", "warm_start.enabled=false", "train.eval_before=false", f"train.seed={seed}",
            "model.autocast=", "train.report=false"]


def summarize(run_dir: Path, wall: float | None) -> dict:
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    evals_file = run_dir / "eval.jsonl"  # absent when the run evaluated nothing (train.eval_every=0)
    evals = [json.loads(line) for line in evals_file.read_text().splitlines()] if evals_file.exists() else []
    environment = json.loads((run_dir / "environment.json").read_text())
    stages = sorted({k for s in steps for k in s["seconds"]})
    step_seconds = [sum(s["seconds"].values()) for s in steps]
    eval_seconds = sum(e.get("seconds", 0.0) for e in evals)
    return {
        "git_sha": environment.get("git_sha"),
        "parameters": environment.get("parameters"),  # trainable (the adapters with model.lora) and total
        "precision": environment.get("precision"),
        "wall_seconds": wall,
        "steps": len(steps),
        "step_seconds_total": sum(step_seconds),
        "step_seconds": step_seconds,
        "stage_seconds_mean": {k: sum(s["seconds"].get(k, 0.0) for s in steps) / len(steps) for k in stages},
        "eval_seconds": eval_seconds,
        "eval_episodes": [e["num_episodes"] for e in evals],
        "eval_score_mean": [e["score_mean"] for e in evals],
        # loading, checkpoints, records and (in a training run, which does not time it) the evaluation
        "other_seconds": None if wall is None else wall - sum(step_seconds) - eval_seconds,
        "micro_batches": [s.get("micro_batches") for s in steps],
        "reward_mean": [s["reward_mean"] for s in steps],
        "groups_jsonl_sha256": hashlib.sha256((run_dir / "groups.jsonl").read_bytes()).hexdigest(),
    }


def launch(run_dir: Path, overrides: list[str], code: str | None) -> dict:
    host, steal = cpu_description(), steal_seconds()
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = str(Path(code).resolve())
    wall, usage, sampler = timed_train(["--config", str(CONFIG), "--run-dir", str(run_dir), *overrides], env)
    return {"machine": {**host, "load_average_after": list(os.getloadavg()),
                        "steal_seconds_during_run": steal_seconds() - steal},
            "code": code or "this checkout", "peak_rss_mib": usage.ru_maxrss / 1024,
            "peak_tree_rss_mib": sampler.peak, **summarize(run_dir, wall)}


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("initial", nargs="?", help="the shared initial policy (a study's OUT/initial/checkpoints/reference)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="more config overrides")
    parser.add_argument("--label", required=True, help="the result's name: benchmarks/results/study_run/LABEL.json")
    parser.add_argument("--seed", type=int, default=0, help="train.seed (default 0)")
    parser.add_argument("--code", help="a checkout whose orsd runs (PYTHONPATH); default this one")
    parser.add_argument("--run-dir", default="runs/study_run", help="where the run goes (default runs/study_run)")
    parser.add_argument("--from-run", help="summarize this finished run instead of launching one")
    parser.add_argument("--wall-seconds", type=float,
                        help="with --from-run: the run's wall time, measured outside (omitted: not known)")
    args = parser.parse_intermixed_args(argv)
    if args.from_run:
        result = {"machine": cpu_description(), "from_run": args.from_run,
                  **summarize(Path(args.from_run), args.wall_seconds)}
    else:
        if not args.initial or not Path(args.initial).is_dir():
            parser.error(f"INITIAL_POLICY={args.initial}: expected a policy directory")
        run_dir = Path(args.run_dir) / args.label
        if run_dir.exists():
            parser.error(f"--run-dir: {run_dir} exists; remove it or pick another --label")
        overrides = [*run_overrides(args.initial, args.seed), *args.overrides]
        result = {"command": "orsd-train --config configs/cpu_study.yaml " + " ".join(overrides),
                  **launch(run_dir, overrides, args.code)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("step_seconds", "reward_mean")}, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
