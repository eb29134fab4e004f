"""Seconds per stage of a GRPO step and an ORSD step on the same batch (issue 5's benchmark).

One rollout is shared (the first, of up to 6 seeded draws, in which every group's rewards differ,
so every group writes bundles and the ratio does not depend on chance); then GRPO steps and ORSD
steps (Trainer.step with that rollout: advantages, bundles, verifier, alignment, paired replay,
reference, update) run on it, each method on its own copy of the policy, in the order GRPO, ORSD,
ORSD, GRPO (`--rounds 2`, the default): a host whose speed drifts during the run (a shared VM's
steal) then weighs on both methods alike, where one GRPO step before one ORSD step charged all of
the drift to one of them. Stage seconds are the mean over each method's steps (every step is in
`grpo_runs` / `orsd_runs`). The verifier's time is reported apart: the target is ORSD/GRPO <= 1.25
excluding verifier calls, for the whole step (rollout included) and for the stages after it. The
ratio is ORSD's whole cost only where every group of every ORSD step had a bundle selected: a group
whose bundles all fail to parse skips the verifier and the rubric pass, so such a run is marked
`"complete": false` and its table says NOT COMPARABLE (on the AVX2-only EPYC of 2026-12-04, in fp32,
the first ORSD step parsed none of its 4 bundles).

    python benchmarks/step.py [--rounds N] [--flops] [section.key=value ...]   # defaults: the CPU default
    writes benchmarks/results/step_<device>.json and prints a table

`--flops`: after the timing, one more step per method under a FLOP counter (benchmarks/flops.py),
from the same weights and seed as each method's first timed step: GFLOP per stage, GFLOP/s as
timed, and the ORSD/GRPO ratio of the work itself, which no scheduling of it changes.

The stages both methods run (advantages, reference pass, update: the same work on the same batch)
take different times in the two methods' steps on a shared 2-core VM; `ratio_step_shared_as_grpo`
(and after the rollout) puts GRPO's times for them in ORSD's step too, so only ORSD's own stages
differ.

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

from default_run import cpu_description, positive, script_parser  # noqa: E402
from flops import StageFlops  # noqa: E402
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


def mean_seconds(runs: list[dict]) -> dict[str, float]:
    """Each stage's mean seconds over a method's steps."""
    return {k: sum(r["seconds"][k] for r in runs) / len(runs) for k in runs[0]["seconds"]}


def _order(rounds: int) -> list[str]:
    """The methods in the order the steps run: GRPO ORSD, then ORSD GRPO, and so on."""
    return [n for r in range(rounds) for n in (("grpo", "orsd") if r % 2 == 0 else ("orsd", "grpo"))]


def differing_rollout(trainer: Trainer) -> tuple[list, float, int]:
    """(groups, seconds of its rollout, draws taken): the first of up to 6 seeded rollouts in which
    every group's rewards differ. A step's cost depends on how many groups write bundles (only
    groups whose rewards differ do), so a benchmark must not leave that to chance."""
    config = trainer.config
    for draw in range(1, 7):
        with autocast(trainer.policy, config.model.autocast):
            seed_everything(config.train.seed + draw - 1, 0)
            start = time.perf_counter()
            groups = trainer.rollout(trainer.sample_tasks())
            seconds = time.perf_counter() - start
        if all(g.rewards_differ for g in groups):
            return groups, seconds, draw
    raise SystemExit("benchmarks: no rollout out of 6 had differing rewards in every group")


def counted_flops(orsd: Trainer, config, initial, groups, draw: int, texts: list, overlapped: bool) -> dict:
    """FLOPs per stage (benchmarks/flops.py) of one GRPO and one ORSD step on the timed batch, each
    on a copy of the initial weights with its first step's seed, as each method's first timed step;
    the bundles on the counting thread (`replay.overlap=false`: the work is the same wherever it
    runs); the rollout's by the timed draw again, on a fresh trainer. `rollout_matches` and
    `bundles_match` say whether the counted rollout sampled the same ids and the counted ORSD step
    wrote the same bundle texts (`texts`, per group) as the timed first ones. `as_timed`: regrouped
    as the timed ORSD stages ran; where they `overlapped`, the plain pass inside the bundle window
    and the replay stage the rubric pass alone."""
    counts, matches = {}, None
    for name in ("grpo", "orsd"):
        cfg = copy.deepcopy(config)
        cfg.method.name, cfg.replay.overlap = name, False
        trainer = Trainer(cfg, copy.deepcopy(initial), orsd.tokenizer, orsd.reference,
                          orsd.verifier if name == "orsd" else None, orsd.env)
        stages = StageFlops()
        with stages.counting():
            if name == "grpo":
                for d in range(1, draw + 1):  # the tasks of draws 1..draw, as differing_rollout drew them
                    seed_everything(config.train.seed + d - 1, 0)
                    tasks = trainer.sample_tasks()
                with autocast(trainer.policy, config.model.autocast), stages.bucket("rollout"):
                    again = trainer.rollout(tasks)
                matches = ([r.response_ids for g in again for t in g.trajectories for r in t.records]
                           == [r.response_ids for g in groups for t in g.trajectories for r in t.records])
            outputs = trainer.step(copy.deepcopy(groups)).outputs
        counts[name] = {k: v for k, v in stages.flops.items() if v}  # stages without a matmul left out
    rollout = counts["grpo"].pop("rollout")
    orsd_counts, moved = counts["orsd"], counts["orsd"].get("plain pass", 0) if overlapped else 0
    as_timed = {"grpo": {k: v for k, v in counts["grpo"].items() if k != "plain pass"},
                "orsd": {**{k: v for k, v in orsd_counts.items() if k != "plain pass"},
                         "bundles": orsd_counts.get("bundles", 0) + moved,
                         "replay": orsd_counts.get("replay", 0) - moved}}

    def after(c):
        return sum(v for k, v in c.items() if k != "verifier")

    return {"rollout": rollout, "rollout_matches": matches,
            "bundles_match": [c.texts for c in outputs.candidates] == texts, "counted": counts, "as_timed": as_timed,
            "ratio_after_rollout": after(as_timed["orsd"]) / after(as_timed["grpo"]),
            "ratio_step": (rollout + after(as_timed["orsd"])) / (rollout + after(as_timed["grpo"]))}


#: the stages both methods run, the same work on the same batch
SHARED = ("advantages", "reference", "update")


def ratios(grpo_seconds: dict, orsd_seconds: dict, rollout_seconds: float) -> dict:
    """ORSD/GRPO excluding the verifier, for the whole step and after the rollout; and the same
    with ORSD's SHARED stages at GRPO's times (`..._shared_as_grpo`), so that only ORSD's own stages
    (bundles with the plain pass beside them, alignment, the rubric pass) tell the methods apart. A
    shared stage's time varies between two steps on a 2-core VM (the update by ±1 s) and that spread
    otherwise lands in the ratio, in either direction."""
    grpo = sum(grpo_seconds.values())
    orsd = sum(v for k, v in orsd_seconds.items() if k != "verifier")
    as_grpo = orsd + sum(grpo_seconds.get(k, 0.0) - orsd_seconds.get(k, 0.0) for k in SHARED)
    return {"ratio_after_rollout_excluding_verifier": orsd / grpo,
            "ratio_step_excluding_verifier": (rollout_seconds + orsd) / (rollout_seconds + grpo),
            "ratio_after_rollout_shared_as_grpo": as_grpo / grpo,
            "ratio_step_shared_as_grpo": (rollout_seconds + as_grpo) / (rollout_seconds + grpo)}


def main(argv: list[str]) -> dict:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive, default=2, help="steps per method, in the order GRPO ORSD ORSD GRPO ...")
    parser.add_argument("--flops", action="store_true", help="count each stage's FLOPs after the timing")
    args = parser.parse_intermixed_args(argv)
    rounds, flops = args.rounds, args.flops
    config = load_config(None, ["method.name=orsd", "train.progress=false", *args.overrides])
    host = machine()  # the load before this run adds its own
    orsd, warm_losses = build(config, None, None, log=lambda *_: None)
    initial = copy.deepcopy(orsd.policy) if flops else None  # the weights both methods' first steps start from
    grpo_config = copy.deepcopy(config)
    grpo_config.method.name = "grpo"
    grpo = Trainer(grpo_config, copy.deepcopy(orsd.policy), orsd.tokenizer, orsd.reference, None, orsd.env)
    groups, rollout_seconds, draw = differing_rollout(orsd)
    # the same batch through both methods' whole step, each method on its own policy (its first
    # step from the initial weights, a later one from its own update), GRPO ORSD ORSD GRPO ...
    runs: dict[str, list] = {"grpo": [], "orsd": []}
    texts = None  # the bundles of ORSD's first step (--flops checks its counted step wrote the same)
    for name in _order(rounds):
        step_result, cpu = timed_step(grpo if name == "grpo" else orsd, copy.deepcopy(groups))
        if name == "orsd" and texts is None:
            texts = [c.texts for c in step_result.outputs.candidates]
        seconds = {k: v for k, v in step_result.seconds.items() if k not in ("rollout", "sync")}
        runs[name].append({"seconds": seconds, "cpu_seconds": cpu, "metrics": step_result.metrics})
    grpo_seconds, orsd_seconds = mean_seconds(runs["grpo"]), mean_seconds(runs["orsd"])
    orsd_result = runs["orsd"][0]["metrics"]
    grpo_cpu = sum(r["cpu_seconds"] for r in runs["grpo"]) / len(runs["grpo"])
    orsd_cpu = sum(r["cpu_seconds"] for r in runs["orsd"]) / len(runs["orsd"])

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
        "groups_with_bundle": orsd_result["groups_with_bundle"],
        "bundles_parsed": orsd_result["bundles_parsed"],
        # per ORSD step; the ratio is ORSD's whole cost only where every group of every ORSD step
        # had a bundle selected (a group without one skips its verifier calls and rubric pass)
        "orsd_groups_with_bundle": [r["metrics"]["groups_with_bundle"] for r in runs["orsd"]],
        "orsd_bundles_parsed": [r["metrics"]["bundles_parsed"] for r in runs["orsd"]],
        "complete": all(r["metrics"]["groups_with_bundle"] == 1.0 for r in runs["orsd"]),
        "valid_action_rate": orsd_result["valid_action_rate"],
        "rollout_seconds": rollout_seconds,
        "order": " ".join(_order(rounds)),
        "grpo_seconds": grpo_seconds,
        "orsd_seconds": orsd_seconds,
        "grpo_runs": [r["seconds"] for r in runs["grpo"]],
        "orsd_runs": [r["seconds"] for r in runs["orsd"]],
        "verifier_seconds": orsd_seconds.get("verifier", 0.0),
        **ratios(grpo_seconds, orsd_seconds, rollout_seconds),
        # CPU seconds of a whole step after the rollout, mean per method (verifier included: its
        # forwards are in-process)
        "grpo_cpu_seconds": grpo_cpu,
        "orsd_cpu_seconds": orsd_cpu,
        "load_average_after": list(os.getloadavg()),
    }
    if flops:  # after the timing, which the counting would slow
        result["flops"] = counted_flops(orsd, config, initial, groups, draw, texts, orsd.overlaps())
        for name, seconds in (("grpo", grpo_seconds), ("orsd", orsd_seconds)):
            result["flops"][f"{name}_gflops_per_second"] = {
                k: v / 1e9 / seconds[k] for k, v in result["flops"]["as_timed"][name].items() if seconds.get(k)}
            result["flops"][f"{name}_gflops_per_second"]["rollout"] = result["flops"]["rollout"] / 1e9 / rollout_seconds
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
    rows.append(f"steps in the order {r['order']} (stage seconds: the mean per method)")
    rows.append(f"ORSD/GRPO excluding verifier: whole step {r['ratio_step_excluding_verifier']:.2f}, "
                f"after the rollout {r['ratio_after_rollout_excluding_verifier']:.2f} (target <= 1.25); with the "
                f"stages both run ({', '.join(SHARED)}) at GRPO's times: {r['ratio_step_shared_as_grpo']:.2f}, "
                f"{r['ratio_after_rollout_shared_as_grpo']:.2f}")
    if not r["complete"]:
        rows.append(f"NOT COMPARABLE: groups with a bundle per ORSD step {r['orsd_groups_with_bundle']} (bundles "
                    f"parsed {r['orsd_bundles_parsed']}): those groups skipped the verifier and the rubric pass")
    if "flops" in r:
        f = r["flops"]
        rows.append(f"{'GFLOP':<11} {'GRPO':>8} {'ORSD':>8}   (GFLOP/s as timed: GRPO, ORSD)")
        for name in names:
            g, o = (f["rollout"], f["rollout"]) if name == "rollout" else (
                f["as_timed"]["grpo"].get(name), f["as_timed"]["orsd"].get(name))
            if not (g or o):
                continue
            rate = [f[f"{method}_gflops_per_second"].get(name) for method in ("grpo", "orsd")]
            rows.append(f"{name:<11} {'' if g is None else f'{g / 1e9:8.0f}':>8} {'' if o is None else f'{o / 1e9:8.0f}':>8}"
                        f"   {', '.join('' if x is None else f'{x:.0f}' for x in rate)}")
        rows.append(f"ORSD/GRPO FLOPs excluding verifier: whole step {f['ratio_step']:.2f}, after the rollout "
                    f"{f['ratio_after_rollout']:.2f}; counted again: the same rollout {f['rollout_matches']}, the same "
                    f"bundles {f['bundles_match']}")
    m = r["machine"]
    rows.append(f"{m['cpu']} ({', '.join(m['isa'])}), {m['torch_threads']} threads, load before "
                f"{m['load_average_1_5_15'][0]:.2f}, after {r['load_average_after'][0]:.2f}; CPU seconds after the "
                f"rollout: GRPO {r['grpo_cpu_seconds']:.1f}, ORSD {r['orsd_cpu_seconds']:.1f}")
    return "\n".join(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
