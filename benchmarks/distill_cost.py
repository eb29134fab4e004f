"""What the OPSD family costs per step next to GRPO, on one shared batch (issue 11).

One rollout of the embedded default (SmolLM2-135M, V = 49,152, H = 576; warm start off), then each
method's step on it from the same initial weights. Counted, per stage: decoder forwards of the
policy and the reference and the (unpadded) tokens they saw, from forward hooks; the teacher's
stored bytes; the peak resident memory above the stage's start (Linux: malloc_trim and
/proc/self/clear_refs reset VmHWM to the live memory before the stage, VmHWM − VmRSS after; run
with MALLOC_MMAP_THRESHOLD_=65536 so that large tensors are mapped and unmapped, not kept by
malloc). Bundles and the verifier are fakes (a fixed 6-criterion bundle whose scores follow the
reward; its last criterion is met by no trajectory, so CriPO has one unexplored criterion), and
rewards are overwritten to alternate 0/1 within each group so that every group has a B*: this
measures the distillation stages, not rubric writing.

    MALLOC_MMAP_THRESHOLD_=65536 python benchmarks/distill_cost.py [section.key=value ...]
    (ORSD_BENCH_GROUPS=<file.pkl> keeps the rollout for the next run)
    writes benchmarks/results/distill_cost_<device>.json and prints a markdown table
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import torch

from default_run import script_parser
from orsd.methods import Candidates
from orsd.rubric import RubricBundle, VerifierResult
from orsd.train.config import load_config
from orsd.train.model import frozen_copy, load_policy, load_tokenizer
from orsd.train.build import make_env
from orsd.train.trainer import Trainer

RESULTS = Path(__file__).parent / "results"
LIBC = ctypes.CDLL("libc.so.6")
CRITERIA = ["The agent searches with words from the task.", "The agent opens a matching product.",
            "The agent selects the requested options.", "The agent checks the price against the budget.",
            "The agent never repeats an action without effect.", "The agent compares two products first."]
METHODS = [("grpo", []), ("opsd", []),  # grpo_opsd's forwards and memory are opsd's (it adds the PG term)
           ("grpo_opsd", ["method.distill_divergence=topk"]),
           ("grpo_opsd", ["method.distill_divergence=sampled"]),
           ("grpo_opsd", ["method.distill_teacher=reference"]),
           ("sdar", []), ("cripo", [])]


class RewardScores:
    """Fake verifier: every criterion follows the reward, the last one is never met."""

    def __init__(self, rewards: dict[str, list[float]]):
        self.rewards = rewards  # task description -> the group's rewards

    async def ascore_many_with_events(self, task, transcripts, bundles):
        rewards = np.asarray(self.rewards[task], dtype=float)
        out = []
        for bundle in bundles:
            scores = np.repeat(rewards[:, None], len(bundle.criteria), axis=1)
            scores[:, -1] = 0.0
            out.append(VerifierResult(scores))
        return out


class Counted(Trainer):
    """A trainer that measures forwards, tokens and peak memory per stage."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stages: dict[str, dict] = {}
        self.counts = {"policy": [0, 0], "reference": [0, 0]}
        for name, model in (("policy", self.policy), ("reference", self.reference)):
            model.get_decoder().register_forward_hook(self.counter(name), with_kwargs=True)

    def counter(self, name):
        def hook(module, args, kwargs, output):
            mask = kwargs.get("attention_mask")
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.counts[name][0] += 1
            self.counts[name][1] += int(mask.sum()) if mask is not None else ids.numel()
        return hook

    def write_bundles(self, request, engine=None):
        if request is None:
            return []
        return [Candidates(bundles=[RubricBundle(list(CRITERIA))] * request.count, texts=["fixed"] * request.count)
                for _ in request.groups]

    def measured(self, stage, call):
        before = {k: list(v) for k, v in self.counts.items()}
        LIBC.malloc_trim(0)  # hand freed heap back, so VmRSS is what is alive now
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        rss = _status("VmRSS")
        result = call()
        self.stages[stage] = {"peak_rss_mb": (_status("VmHWM") - rss) / 1024,
                              **{f"{k}_forwards": self.counts[k][0] - before[k][0] for k in self.counts},
                              **{f"{k}_tokens": self.counts[k][1] - before[k][1] for k in self.counts}}
        return result

    def paired_replay(self, *args):
        return self.measured("replay", lambda: super(Counted, self).paired_replay(*args))

    def teacher(self, *args):
        return self.measured("teacher", lambda: super(Counted, self).teacher(*args))

    def reference_logprobs(self, *args):
        return self.measured("reference", lambda: super(Counted, self).reference_logprobs(*args))

    def update(self, *args):
        return self.measured("update", lambda: super(Counted, self).update(*args))


def _status(key: str) -> int:
    """A /proc/self/status field in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def main(argv: list[str]) -> dict:
    args = script_parser(__doc__).parse_intermixed_args(argv)
    base = ["warm_start.enabled=false", "train.progress=false", *args.overrides]
    config = load_config(None, ["method.name=grpo", *base])
    configs = [load_config(None, [f"method.name={name}", *base, *overrides]) for name, overrides in METHODS]
    tokenizer = load_tokenizer(config.model.path)
    initial = load_policy(config.model.path, config.model.dtype, config.model.device)
    env = make_env(config)
    cache = os.environ.get("ORSD_BENCH_GROUPS")  # a pickle of the rollout, reused when it exists
    if cache and Path(cache).exists():
        groups = pickle.loads(Path(cache).read_bytes())
    else:
        rollout = Trainer(config, copy.deepcopy(initial), tokenizer, frozen_copy(initial), None, env)
        groups = rollout.rollout(rollout.sample_tasks())
        if cache:
            Path(cache).write_bytes(pickle.dumps(groups))
    for group in groups:  # alternate rewards: every group has a B* (see the module docstring)
        for i, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(i % 2)
    rewards = {g.task.description: g.rewards for g in groups}
    rows = []
    result = {"device": "cuda" if torch.cuda.is_available() else "cpu", "model": config.model.path,
              "vocab": initial.config.vocab_size, "hidden": initial.config.hidden_size,
              "records": sum(len(t.records) for g in groups for t in g.trajectories),
              "context_tokens": sum(len(r.context_ids) for g in groups for t in g.trajectories for r in t.records),
              "rows": rows}
    for (name, overrides), method_config in zip(METHODS, configs):
        trainer = Counted(method_config, copy.deepcopy(initial), tokenizer, frozen_copy(initial),
                          RewardScores(rewards), env)
        step = trainer.step(copy.deepcopy(groups))
        teacher = step.outputs.teacher
        rows.append({"method": name, "overrides": overrides, "stages": trainer.stages,
                     "seconds": {k: round(v, 2) for k, v in step.seconds.items()},
                     "teacher_stored_bytes": teacher.stored_bytes if teacher is not None else 0,
                     "distill_tokens": step.metrics.get("distill_tokens", 0),
                     "response_tokens": step.metrics["response_tokens"]})
        print(name, overrides, json.dumps(rows[-1]["stages"]), flush=True)
        RESULTS.mkdir(exist_ok=True)  # written after every method: a long run keeps what it measured
        (RESULTS / f"distill_cost_{result['device']}.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    return result


def table(result: dict) -> str:
    lines = [f"{result['model']}: {result['records']} turn records, {result['context_tokens']} context tokens, "
             f"{result['rows'][0]['response_tokens']} response tokens",
             "", "| method | no-grad forwards (tokens) | of which teacher | teacher stored | peak RSS teacher pass | "
             "peak RSS update | update s |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        stages = row["stages"]
        no_grad = [s for k, s in stages.items() if k != "update"]
        forwards = sum(s["policy_forwards"] + s["reference_forwards"] for s in no_grad)
        tokens = sum(s["policy_tokens"] + s["reference_tokens"] for s in no_grad)
        label = row["method"] + (" " + " ".join(o.split(".")[-1] for o in row["overrides"]) if row["overrides"] else "")
        teacher = stages.get("teacher", {})
        taught = teacher.get("policy_tokens", 0) + teacher.get("reference_tokens", 0)
        teacher_forwards = teacher.get("policy_forwards", 0) + teacher.get("reference_forwards", 0)
        lines.append(f"| {label} | {forwards} ({tokens}) | {teacher_forwards} ({taught}) | "
                     f"{row['teacher_stored_bytes'] / 1e6:.2f} MB | "
                     f"{teacher.get('peak_rss_mb', 0):.0f} MB | {stages['update']['peak_rss_mb']:.0f} MB | "
                     f"{row['seconds'].get('update', 0):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
