"""Seconds per stage of a GRPO step and an ORSD step on the same batch (issue 5's benchmark).

One rollout is shared (the first, of up to 6 seeded draws, in which every group's rewards differ,
so every group writes bundles and the ratio does not depend on chance); then a GRPO step and an
ORSD step (Trainer.step with that rollout: advantages, bundles, verifier, alignment, paired replay,
reference, update) run on it, each on its own copy of the policy. The verifier's time is reported apart: the target is
ORSD/GRPO <= 1.25 excluding verifier calls, for the whole step (rollout included) and for the
stages after the rollout.

    python benchmarks/step.py [section.key=value ...]   # defaults: the embedded CPU default
    writes benchmarks/results/step_<device>.json and prints a table

Wall seconds hold only on idle cores; each step's process CPU seconds are recorded too (less
sensitive to other jobs on a shared machine), with the load average before the run.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

from orsd.train.cli import sleeping_openmp_threads

sleeping_openmp_threads()  # as orsd-train runs: before torch is imported

import torch  # noqa: E402

from default_run import cpu_description  # noqa: E402
from orsd.train.build import build  # noqa: E402
from orsd.train.config import load_config  # noqa: E402
from orsd.train.model import autocast  # noqa: E402
from orsd.train.trainer import Trainer, seed_everything  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    """The CPU (default_run.cpu_description), torch's threads, OpenMP's wait policy and any GPU."""
    return {**cpu_description(), "torch_threads": torch.get_num_threads(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", ""),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def timed_step(trainer: Trainer, groups) -> tuple:
    """trainer.step(groups) with the process's CPU seconds it took."""
    start = time.process_time()
    result = trainer.step(groups)
    return result, time.process_time() - start


def main(argv: list[str]) -> dict:
    config = load_config(None, ["method.name=orsd", "train.progress=false", *argv])
    host = machine()  # the load before this run adds its own
    orsd, warm_losses = build(config, None, None, log=lambda *_: None)
    grpo_config = copy.deepcopy(config)
    grpo_config.method.name = "grpo"
    grpo = Trainer(grpo_config, copy.deepcopy(orsd.policy), orsd.tokenizer, orsd.reference, None, orsd.env)
    # The ratio depends on how many groups write bundles (only groups whose rewards differ do), so
    # the benchmark takes the first rollout in which every group's rewards differ, up to 6 draws.
    for draw in range(1, 7):
        with autocast(orsd.policy, config.model.autocast):
            seed_everything(config.train.seed + draw - 1, 0)
            start = time.perf_counter()
            groups = orsd.rollout(orsd.sample_tasks())
            rollout_seconds = time.perf_counter() - start
        if all(g.rewards_differ for g in groups):
            break
    else:
        raise SystemExit("benchmarks/step.py: no rollout out of 6 had differing rewards in every group")
    # the same batch through both methods' whole step (each from the same initial weights)
    grpo_result, grpo_cpu = timed_step(grpo, copy.deepcopy(groups))
    grpo_seconds = grpo_result.seconds
    orsd_result, orsd_cpu = timed_step(orsd, groups)
    orsd_seconds = dict(orsd_result.seconds, _groups_with_bundle=orsd_result.metrics["groups_with_bundle"])
    for seconds in (grpo_seconds, orsd_seconds):
        seconds.pop("rollout", None)
        seconds.pop("sync", None)

    def total(seconds, skip=()):
        return sum(v for k, v in seconds.items() if not k.startswith("_") and k not in skip)

    grpo_after, orsd_after = total(grpo_seconds), total(orsd_seconds, ("verifier",))
    result = {
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "machine": host,
        "precision": orsd.environment.get("precision"),
        "config": {"model": config.model.path, "env": config.env.name, "tasks": config.rollout.tasks_per_step,
                   "group_size": config.rollout.group_size, "num_bundles": config.rubric.num_bundles,
                   "bundle_max_new_tokens": config.rubric.max_new_tokens, "autocast": config.model.autocast,
                   "verifier": config.verifier.kind, "micro_batch_tokens": config.optim.micro_batch_tokens,
                   "gradient_checkpointing": config.model.gradient_checkpointing},
        "warm_start_loss": [warm_losses[0], warm_losses[-1]] if warm_losses else None,
        "rollout_draws": draw,
        "records": sum(len(t.records) for g in groups for t in g.trajectories),
        "response_tokens": sum(len(r.response_ids) for g in groups for t in g.trajectories for r in t.records),
        "context_tokens": sum(len(r.context_ids) for g in groups for t in g.trajectories for r in t.records),
        "groups_with_bundle": orsd_seconds.pop("_groups_with_bundle"),
        "bundles_parsed": orsd_result.metrics["bundles_parsed"],
        "valid_action_rate": orsd_result.metrics["valid_action_rate"],
        "rollout_seconds": rollout_seconds,
        "grpo_seconds": {k: v for k, v in grpo_seconds.items() if not k.startswith("_")},
        "orsd_seconds": orsd_seconds,
        "verifier_seconds": orsd_seconds.get("verifier", 0.0),
        "ratio_after_rollout_excluding_verifier": orsd_after / grpo_after,
        "ratio_step_excluding_verifier": (rollout_seconds + orsd_after) / (rollout_seconds + grpo_after),
        # CPU seconds of each whole step after the rollout (verifier included: its forwards are in-process)
        "grpo_cpu_seconds": grpo_cpu,
        "orsd_cpu_seconds": orsd_cpu,
        "load_average_after": list(os.getloadavg()),
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
    m = r["machine"]
    rows.append(f"{m['cpu']} ({', '.join(m['isa'])}), {m['torch_threads']} threads, load before "
                f"{m['load_average_1_5_15'][0]:.2f}, after {r['load_average_after'][0]:.2f}; CPU seconds after the "
                f"rollout: GRPO {r['grpo_cpu_seconds']:.1f}, ORSD {r['orsd_cpu_seconds']:.1f}")
    return "\n".join(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
