"""Where each turn's context takes the rubric (`rubric.placement`): what paired replay's rubric pass
costs there and how far the rubric moves the response tokens' log-probs, on one rollout of the
default shape.

    python benchmarks/placement.py [--rounds N] [section.key=value ...]   # defaults: the CPU default
    writes benchmarks/results/placement_<device>.json and prints each measurement

The rollout is drawn once per placement from the same seeds and task sampler (step.differing_rollout):
the slot does not enter sampling, so the records and responses are the same and only their slots differ (checked).
The policy writes its M bundles per group once; each bundle, rendered as a step splices B*
(`rubric.rubric_context`), and a fixed generic rubric (rubric_pass.RUBRIC) go in at every record's
slot. Per placement and rubric, alternating `--rounds` times in one process: the plain pass (keeping
its keys/values, as a step runs it) and then the timed rubric pass. Per placement and bundle, over
the response tokens: mean |Δ|, Δ's standard deviation and mean, the correlation of the bundle's Δ
with the generic rubric's (the part of Δ that does not depend on what the rubric says) and
mean |Δ_bundle − Δ_generic| (the part that does).
"""

from __future__ import annotations

import copy
import json
import statistics
import sys

from orsd.train.cli import sleeping_openmp_threads

sleeping_openmp_threads()  # as orsd-train runs: before torch is imported

import time  # noqa: E402

import torch  # noqa: E402

from orsd import rubric  # noqa: E402
from orsd.methods import BundleRequest  # noqa: E402
from orsd.train import bundles  # noqa: E402
from orsd.train.build import build  # noqa: E402
from orsd.train.config import load_config  # noqa: E402
from orsd.train.model import autocast  # noqa: E402
from orsd.train.replay import paired_replay  # noqa: E402
from orsd.train.rollout import PLACEMENTS  # noqa: E402
from rubric_pass import RUBRIC  # noqa: E402
from default_run import positive, script_parser  # noqa: E402
from step import RESULTS, differing_rollout, machine  # noqa: E402


def records_of(groups) -> list:
    return [r for g in groups for t in g.trajectories for r in t.records]


def main(argv: list[str]) -> dict:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive, default=2, help="measurements per placement and rubric")
    args = parser.parse_intermixed_args(argv)
    rounds = args.rounds
    config = load_config(None, ["method.name=orsd", "train.progress=false", *args.overrides])
    host = machine()
    trainer, _ = build(config, None, None, log=lambda *_: None)
    tokenizer, r = trainer.tokenizer, config.rubric
    drawn, records = {}, {}
    tasks = copy.deepcopy(trainer.task_rng)  # each placement draws the same tasks
    for placement in PLACEMENTS:
        trainer.config.rubric.placement = placement
        trainer.task_rng = copy.deepcopy(tasks)
        drawn[placement], _, _ = differing_rollout(trainer)
        records[placement] = records_of(drawn[placement])
    groups = drawn[PLACEMENTS[0]]
    responses = [[x.response_ids for x in rs] for rs in records.values()]
    if any(other != responses[0] for other in responses[1:]):
        raise SystemExit("benchmarks/placement.py: the placements' rollouts differ; the comparison needs the same records")
    with autocast(trainer.policy, config.model.autocast):
        request = BundleRequest(copy.deepcopy(groups), r.num_bundles, trainer.method.bundle_writer)
        candidates = trainer.write_bundles(request)
    # rubric name -> per group its ids (None: the group wrote fewer bundles)
    rubrics = {"generic": [bundles.rubric_ids(tokenizer, RUBRIC, r.context_role)] * len(groups)}
    for k in range(r.num_bundles):
        rubrics[f"bundle{k}"] = [bundles.rubric_ids(tokenizer, rubric.rubric_context(c.bundles[k]), r.context_role)
                                 if len(c.bundles) > k else None for c in candidates]
    per_record = [i for i, g in enumerate(groups) for t in g.trajectories for _ in t.records]
    seconds: dict = {p: {name: [] for name in rubrics} for p in PLACEMENTS}
    delta: dict = {p: {} for p in PLACEMENTS}
    cfg = trainer.config
    with autocast(trainer.policy, config.model.autocast), torch.no_grad():
        for _ in range(rounds):
            for placement in PLACEMENTS:
                for name, ids in rubrics.items():
                    recs = records[placement]
                    spliced = [ids[g] if ids[g] is not None and x.rubric_slot >= 0  # as Trainer.paired_replay
                               and x.num_tokens + len(ids[g]) <= cfg.rollout.max_context_tokens else None
                               for g, x in zip(per_record, recs)]
                    plain = trainer.plain_pass(drawn[placement])  # as a step runs it: keys/values kept
                    start = time.perf_counter()
                    result = paired_replay(trainer.policy, recs, [0.0] * len(recs), spliced, 1.0,
                                           trainer.replay_spec, plain=plain)
                    seconds[placement][name].append(time.perf_counter() - start)
                    delta[placement][name] = (result.delta.float(), result.valid)
                    print(json.dumps({"placement": placement, "rubric": name,
                                      "seconds": round(seconds[placement][name][-1], 3)}), flush=True)
                    del plain, result
    signal = {}
    for placement in PLACEMENTS:
        generic, valid = delta[placement]["generic"]
        signal[placement] = {}
        for name, (d, ok) in delta[placement].items():
            both = ok & valid
            x, g = d[both], generic[both]
            row = {"tokens": int(both.sum()), "mean_abs": float(x.abs().mean()), "std": float(x.std()),
                   "mean": float(x.mean())}
            if name != "generic":
                row["corr_with_generic"] = float(torch.corrcoef(torch.stack([x, g]))[0, 1])
                row["mean_abs_minus_generic"] = float((x - g).abs().mean())
            signal[placement][name] = row
            print(placement, name, json.dumps(row), flush=True)
    rubric_tokens = {name: [len(i) if i is not None else None for i in ids] for name, ids in rubrics.items()}
    out = {"device": "cuda" if torch.cuda.is_available() else "cpu", "machine": host,
           "precision": trainer.environment.get("precision"), "rounds": rounds, "records": len(per_record),
           "response_tokens": sum(len(x.response_ids) for x in records["action"]),
           "tokens_after_slot": {p: sum(len(x.context_ids) - x.rubric_slot for x in rs if x.rubric_slot >= 0)
                                 for p, rs in records.items()},
           "rubric_tokens": rubric_tokens, "seconds": seconds,
           "median_seconds": {p: {n: statistics.median(v) for n, v in s.items()} for p, s in seconds.items()},
           "delta": signal, "load_average_after": list(machine()["load_average_1_5_15"])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"placement_{out['device']}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
