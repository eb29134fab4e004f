"""Does a restructuring change any output? Runs the same jobs from two source trees and compares
their records.

    python benchmarks/same_output.py --before /path/to/old/checkout --after . --out /tmp/same \
        [--jobs tiny policy default] [--methods orsd grpo ...] [--policy runs/x/checkpoints/reference] [--reuse]

Each tree runs `python -m orsd.train.cli` with PYTHONPATH set to it (its own orsd/, native
extension included: copy `orsd/_C*.so` into a worktree first), fp32, one thread, the same seed:
- `tiny`: every method given, 2 steps on the random tiny model of benchmarks/tiny_random_model.json
  (no warm start), each writing groups.jsonl and steps.jsonl;
- `policy`: every method given, `--policy-steps` steps of configs/cpu_study.yaml from the warm-started `--policy`
  (the tiny model's rewards never differ within a group, so only this job writes, scores and
  selects bundles and computes Δ);
- `default`: the embedded default job (warm start and 2 ORSD steps of SmolLM2-135M).
groups.jsonl must be identical line for line; steps.jsonl identical except wall times and the
verifier's latency counters. Prints one line per run and writes OUT/same_output.json; exits 1 on
any difference. A restructuring's commit message quotes its summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.path=random:benchmarks/tiny_random_model.json", "model.dtype=float32", "model.autocast=",
        "warm_start.enabled=false", "rollout.tasks_per_step=2", "rollout.group_size=4", "env.max_actions=2",
        "rollout.max_new_tokens=16", "rubric.max_new_tokens=48", "train.steps=2", "train.eval_every=0",
        "train.report=false", "train.tensorboard=false", "train.progress=false"]
POLICY = ["--config", "configs/cpu_study.yaml", "warm_start.enabled=false", "train.eval_before=false",
          "train.eval_every=0", "train.report=false", "train.progress=false"]
#: a label's overrides where it is more than `method.name=<label>`
ARMS = {"static_rubric": ["method.name=static_rubric", "method.rubric_file=configs/rubrics/cpu_study_oracle.yaml",
                          "env.train_tasks=8"],
        "control": ["method.name=orsd", "rubric.delta_baseline=content_free", "rubric.delta_mask=format"]}
#: what may differ between two runs of the same code: wall-clock times and latency counters
VOLATILE = ("seconds", "latency", "wall", "time", "elapsed", "rss", "memory")


def run(tree: Path, overrides: list[str], run_dir: Path, reuse: bool = False) -> float:
    """Seconds the run took. With `reuse`, a run an earlier invocation finished (its `done` marker,
    which keeps its seconds; a run cut off part-way has none) is not run again."""
    marker = run_dir / "done"
    if reuse and marker.is_file():
        return json.loads(marker.read_text())["seconds"]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(run_dir.with_suffix(".log"), "w") as log:
        subprocess.run([sys.executable, "-m", "orsd.train.cli", *overrides, "model.threads=1",
                        "--run-dir", str(run_dir)], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                       check=True)
    seconds = time.perf_counter() - start
    marker.write_text(json.dumps({"tree": str(tree), "overrides": overrides, "seconds": seconds}) + "\n")
    return seconds


def steady(value):
    """`value` without the keys whose values are wall times or latencies."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if not any(word in k.lower() for word in VOLATILE)}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


def records(run_dir: Path, name: str) -> list:
    path = run_dir / name
    return [steady(json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []


def compare(before: Path, after: Path) -> dict:
    out = {}
    for name in ("groups.jsonl", "steps.jsonl", "eval.jsonl"):
        a, b = records(before, name), records(after, name)
        differing = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        out[name] = {"lines": [len(a), len(b)], "differing_lines": differing,
                     "same": len(a) == len(b) and not differing}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the source tree before the change")
    parser.add_argument("--after", type=Path, default=ROOT, help="the source tree after it (default: this one)")
    parser.add_argument("--out", type=Path, required=True, help="where the runs and same_output.json go")
    parser.add_argument("--jobs", nargs="+", choices=["tiny", "policy", "default"], default=["tiny", "default"])
    parser.add_argument("--policy", type=Path, help="the warm-started policy of the policy job (a run's "
                        "checkpoints/reference)")
    parser.add_argument("--policy-steps", type=int, default=2, help="steps of each policy-job run (default 2)")
    parser.add_argument("--methods", nargs="+", default=["orsd", "grpo", "static_rubric", "opsd", "gigpo", "cripo"],
                        help="the methods of the tiny and policy jobs (also "
                        "`control`: ORSD with the content_free baseline and the format mask)")
    parser.add_argument("--reuse", action="store_true", help="keep a run OUT already holds from an earlier "
                        "invocation (e.g. the before side, run while the change was written) instead of rerunning it")
    parser.add_argument("--side", choices=["both", "before", "after"], default="both", help="run one side only "
                        "(two invocations side by side, or one while the change is written); a later --reuse "
                        "invocation with both sides compares what they wrote")
    args = parser.parse_args()
    jobs = [(f"tiny_{m}", [*TINY, *ARMS.get(m, [f"method.name={m}"])]) for m in args.methods
            if "tiny" in args.jobs]
    if "policy" in args.jobs:
        if args.policy is None or not (args.policy / "config.json").is_file():
            parser.error(f"--policy: the policy job needs a model directory with config.json, got {args.policy}")
        jobs += [(f"policy_{m}", [*POLICY, f"train.steps={args.policy_steps}", f"model.path={args.policy.resolve()}", 
                                  *ARMS.get(m, [f"method.name={m}"])]) for m in args.methods]
    jobs += [("default", [])] if "default" in args.jobs else []
    summary, same = {"before": str(args.before), "after": str(args.after), "runs": {}}, True
    for label, overrides in jobs:
        dirs, seconds = {}, {}
        for side, tree in (("before", args.before), ("after", args.after)):
            if args.side not in ("both", side):
                continue
            dirs[side] = args.out / side / label
            dirs[side].parent.mkdir(parents=True, exist_ok=True)
            seconds[side] = round(run(tree.resolve(), overrides, dirs[side], args.reuse), 1)
        if args.side != "both":
            print(f"{label}: {args.side} side done ({seconds[args.side]} s)", flush=True)
            continue
        result = {"overrides": overrides, "seconds": seconds, **compare(dirs["before"], dirs["after"])}
        ok = all(result[n]["same"] for n in ("groups.jsonl", "steps.jsonl", "eval.jsonl"))
        same &= ok
        summary["runs"][label] = result
        print(f"{label}: {'same' if ok else 'DIFFERENT'} (groups {result['groups.jsonl']['lines']}, "
              f"steps {result['steps.jsonl']['lines']}; {seconds['before']} s / {seconds['after']} s)", flush=True)
    if args.side != "both":
        return 0
    summary["same"] = same
    (args.out / "same_output.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
