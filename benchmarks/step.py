"""Seconds per stage of a GRPO step and an ORSD step on the same batch (issue 5's benchmark).

One rollout is shared; then a GRPO step and an ORSD step (Trainer.step with that rollout: advantages,
bundles, verifier, alignment, paired replay, reference, update) run on it, each on its own copy of
the policy. The verifier's time is reported apart: the target is
ORSD/GRPO <= 1.25 excluding verifier calls, for the whole step (rollout included) and for the
stages after the rollout.

    python benchmarks/step.py [section.key=value ...]   # defaults: the embedded CPU default
    writes benchmarks/results/step_<device>.json and prints a table
"""

from __future__ import annotations

import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

from orsd.train.build import build
from orsd.train.config import load_config
from orsd.train.model import autocast
from orsd.train.trainer import Trainer, seed_everything

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str]) -> dict:
    config = load_config(None, ["method.name=orsd", "train.progress=false", *argv])
    orsd, _ = build(config, None, None, log=lambda *_: None)
    grpo_config = copy.deepcopy(config)
    grpo_config.method.name = "grpo"
    grpo = Trainer(grpo_config, copy.deepcopy(orsd.policy), orsd.tokenizer, orsd.reference, None, orsd.env)
    with autocast(orsd.policy, config.model.autocast):
        seed_everything(config.train.seed, 0)
        start = time.perf_counter()
        groups = orsd.rollout(orsd.sample_tasks())
        rollout_seconds = time.perf_counter() - start
    # the same batch through both methods' whole step (each from the same initial weights)
    grpo_seconds = grpo.step(copy.deepcopy(groups)).seconds
    orsd_result = orsd.step(groups)
    orsd_seconds = dict(orsd_result.seconds, _groups_with_bundle=orsd_result.metrics["groups_with_bundle"])
    for seconds in (grpo_seconds, orsd_seconds):
        seconds.pop("rollout", None)
        seconds.pop("sync", None)

    def total(seconds, skip=()):
        return sum(v for k, v in seconds.items() if not k.startswith("_") and k not in skip)

    grpo_after, orsd_after = total(grpo_seconds), total(orsd_seconds, ("verifier",))
    result = {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "machine": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "config": {"model": config.model.path, "env": config.env.name, "tasks": config.rollout.tasks_per_step,
                   "group_size": config.rollout.group_size, "num_bundles": config.rubric.num_bundles,
                   "autocast": config.model.autocast, "verifier": config.verifier.kind},
        "records": sum(len(t.records) for g in groups for t in g.trajectories),
        "response_tokens": sum(len(r.response_ids) for g in groups for t in g.trajectories for r in t.records),
        "context_tokens": sum(len(r.context_ids) for g in groups for t in g.trajectories for r in t.records),
        "groups_with_bundle": orsd_seconds.pop("_groups_with_bundle"),
        "rollout_seconds": rollout_seconds,
        "grpo_seconds": {k: v for k, v in grpo_seconds.items() if not k.startswith("_")},
        "orsd_seconds": orsd_seconds,
        "verifier_seconds": orsd_seconds.get("verifier", 0.0),
        "ratio_after_rollout_excluding_verifier": orsd_after / grpo_after,
        "ratio_step_excluding_verifier": (rollout_seconds + orsd_after) / (rollout_seconds + grpo_after),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"step_{result['device']}.json").write_text(json.dumps(result, indent=2))
    print(format_table(result))
    return result


def format_table(r: dict) -> str:
    names = ["rollout", "advantages", "bundles", "verifier", "align", "replay", "reference", "update"]
    rows = [f"{'stage':<11} {'GRPO s':>8} {'ORSD s':>8}"]
    for name in names:
        g = r["rollout_seconds"] if name == "rollout" else r["grpo_seconds"].get(name)
        o = r["rollout_seconds"] if name == "rollout" else r["orsd_seconds"].get(name)
        rows.append(f"{name:<11} {'' if g is None else f'{g:8.2f}':>8} {'' if o is None else f'{o:8.2f}':>8}")
    rows.append(f"records {r['records']}, response tokens {r['response_tokens']}, context tokens "
                f"{r['context_tokens']}, groups with a bundle {r['groups_with_bundle']:.0%}")
    rows.append(f"ORSD/GRPO excluding verifier: whole step {r['ratio_step_excluding_verifier']:.2f}, "
                f"after the rollout {r['ratio_after_rollout_excluding_verifier']:.2f} (target <= 1.25)")
    return "\n".join(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
