"""Every method of orsd.methods.METHODS for the same step(s) on the embedded default, then the
comparison table of the runs (orsd-compare): CI's proof that every method runs end to end, not
that one wins. A method added to the registry is picked up without editing this file.

Each method trains from the same embedded default shrunk to a smoke (its tokenizer, prompts and
shop, a tiny random model, no warm start, 1 step, 2 tasks x 2 rollouts, 2 actions, short budgets,
then a held-out evaluation of 2 tasks), in a run directory of its own. Per method it also
measures what docs/methods.md reports: model forwards per stage (calls and padded tokens, no-grad
and with grad) and the step's peak memory beyond what existed before it (CPU: the rise of the
peak RSS, as the op benchmarks measure it).

    python benchmarks/compare_methods.py [--runs-dir DIR] [--methods a,b] [section.key=value ...]
    writes benchmarks/results/compare_methods.{md,html,png} and compare_methods_cost.json
    (the real model: ... model.path=smollm2-135m, about a minute per method on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedModel

from conftest import peak_extra_bytes  # the op benchmarks' peak-memory measure (benchmarks/conftest.py)
from orsd.methods import METHODS
from orsd.report.compare import write_comparison
from orsd.train import cli, trainer as trainer_module
from orsd.train.config import load_config

ROOT = Path(__file__).parents[1]
RESULTS = Path(__file__).parent / "results"
#: the embedded default shrunk to a smoke: its tokenizer, prompts and env, but a tiny random model
#: (SmolLM2-135M without a warm start earns the same constant rewards and takes ~1 min per method;
#: `model.path=smollm2-135m` measures it), one step, 2 tasks x 2 rollouts, short budgets
SMOKE = ["model.path=random:benchmarks/tiny_random_model.json", "warm_start.enabled=false", "train.steps=1",
         "rollout.tasks_per_step=2", "rollout.group_size=2", "env.max_actions=2", "rollout.max_new_tokens=16",
         "rubric.num_bundles=2", "rubric.max_new_tokens=48", "train.eval_every=1", "train.eval_tasks=2",
         "train.eval_samples=1", "train.tensorboard=false", "train.report=false", "train.progress=false",
         "method.rubric_file=configs/rubrics/webshop_static.yaml"]  # paths relative to the repository root


class ForwardCounter:
    """Counts decoder forwards per step stage: calls and padded tokens (batch x length of the
    hidden states), split by whether autograd was recording. The stage is the name the trainer
    times (its `timed` contexts); forwards outside a step count as "outside" (evaluation)."""

    def __init__(self):
        self.stage = "outside"
        self.counts = defaultdict(lambda: {"no_grad_calls": 0, "no_grad_tokens": 0, "grad_calls": 0, "grad_tokens": 0})

    def hook(self, module, args, output):
        hidden = getattr(output, "last_hidden_state", None)
        if isinstance(module, PreTrainedModel) and hidden is not None:  # the decoder, once per model forward
            kind = "grad" if torch.is_grad_enabled() else "no_grad"
            self.counts[self.stage][f"{kind}_calls"] += 1
            self.counts[self.stage][f"{kind}_tokens"] += hidden.shape[0] * hidden.shape[1]

    def timed(self, original):
        @contextlib.contextmanager
        def timed(seconds, name):
            outer, self.stage = self.stage, name
            try:
                with original(seconds, name):
                    yield
            finally:
                self.stage = outer
        return timed


def run_method(name: str, run_dir: Path, overrides: list[str]) -> dict:
    """One run of `name`; returns its cost figures (forwards per stage, the step's peak memory)."""
    counter = ForwardCounter()
    peaks: list[int | None] = []
    step, timed = trainer_module.Trainer.step, trainer_module.timed

    def measured_step(self, groups=None):
        out = {}
        device = next(self.policy.parameters()).device
        peaks.append(peak_extra_bytes(lambda: out.update(result=step(self, groups)), device))
        return out["result"]

    shutil.rmtree(run_dir, ignore_errors=True)
    config = load_config(None, [*SMOKE, f"method.name={name}", f"train.run_name={name}", *overrides])
    handle = torch.nn.modules.module.register_module_forward_hook(counter.hook)
    trainer_module.Trainer.step, trainer_module.timed = measured_step, counter.timed(timed)
    start = time.perf_counter()
    try:
        summary = cli.run(config, str(run_dir), log=lambda *_: None)
    finally:
        trainer_module.Trainer.step, trainer_module.timed = step, timed
        handle.remove()
    stages = {k: v for k, v in counter.counts.items() if k != "outside"}
    return {"method": name, "wall_seconds": time.perf_counter() - start,
            "step_seconds": summary["stage_seconds_per_step"],
            "step_peak_extra_mb": [None if p is None else p / 2**20 for p in peaks],
            "forwards": stages, "evaluation_forwards": counter.counts.get("outside")}


def after_rollout(cost: dict) -> dict:
    """Forward calls and tokens of the step's stages after the rollout (what a method adds)."""
    stages = [counts for stage, counts in cost["forwards"].items() if stage != "rollout"]
    return {k: sum(c[k] for c in stages) for k in ("no_grad_calls", "no_grad_tokens", "grad_calls", "grad_tokens")}


def cost_table(costs: list[dict]) -> str:
    """Markdown: per method, the step's seconds, its forwards after the rollout against GRPO's (every
    method samples the same rollout: same seed, same initial weights), and its peak extra memory."""
    grpo = next((after_rollout(c) for c in costs if c["method"] == "grpo"), None)
    lines = ["## Cost of one step (this benchmark's setting)", "",
             "Decoder forwards after the rollout (bundle writing, verifier, replay, teacher, reference, update) "
             "as calls / padded tokens; the ratio is no-grad tokens against GRPO's on the same rollout. Peak "
             "memory: what the step allocates beyond what existed before it (first step: AdamW states "
             "included, the same for every method).", "",
             "| method | step s | no-grad forwards | no-grad tokens | vs GRPO | grad forwards | grad tokens "
             "| peak extra MB |", "|---|---|---|---|---|---|---|---|"]
    for cost in costs:
        t = after_rollout(cost)
        ratio = f"{t['no_grad_tokens'] / grpo['no_grad_tokens']:.2f}x" if grpo and grpo["no_grad_tokens"] else "–"
        peak = cost["step_peak_extra_mb"][0] if cost["step_peak_extra_mb"] else None
        lines.append(f"| {cost['method']} | {sum(cost['step_seconds'].values()):.1f} | {t['no_grad_calls']} | "
                     f"{t['no_grad_tokens']} | {ratio} | {t['grad_calls']} | {t['grad_tokens']} | "
                     f"{'–' if peak is None else f'{peak:.0f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", default="runs/compare_methods", help="where the run directories go")
    parser.add_argument("--methods", default="", help="comma-separated subset (default: every method)")
    parser.add_argument("--out", default=str(RESULTS / "compare_methods.md"), help="the markdown table")
    parser.add_argument("overrides", nargs="*", help="section.key=value applied to every run")
    args = parser.parse_intermixed_args(argv)
    runs_dir, out = Path(args.runs_dir).resolve(), Path(args.out).resolve()
    os.chdir(ROOT)  # SMOKE's paths; the tables then name runs relative to the root
    transformers.utils.logging.disable_progress_bar()  # one line per method, not per weight shard
    names = [n for n in args.methods.split(",") if n] or sorted(METHODS)
    unknown = sorted(set(names) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}: expected some of {sorted(METHODS)}")
    costs = []
    for name in names:
        cost = run_method(name, runs_dir / name, args.overrides)
        print(f"{name}: {cost['wall_seconds']:.0f} s", flush=True)
        costs.append(cost)
    md, html, png = write_comparison([(name, os.path.relpath(runs_dir / name)) for name in names], out)
    with md.open("a", encoding="utf-8") as out:
        out.write("\n" + cost_table(costs))
    md.with_name(md.stem + "_cost.json").write_text(json.dumps(costs, indent=2))
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
