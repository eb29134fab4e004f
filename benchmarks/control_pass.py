"""What rubric.delta_baseline's control adds to paired replay's rubric pass, on one rollout of the
default shape: seconds, tokens and forwards the decoder was given, the paper's pass and the joined
B* + control pass alternating in one process.

    python benchmarks/control_pass.py [--rounds N] [section.key=value ...]   # defaults: the CPU default
    writes benchmarks/results/control_pass_<kind>.json and prints each round

Each round runs the plain pass (keeping its keys/values, replay.reuse_plain) and then times only
the privileged pass: B* alone (the paper's Δ), then B* with its control (train/delta.py: one pass
over both, the control's rows continuing from the same kept keys/values). B* is a fixed 6-criterion
bundle spliced at every record's slot, as benchmarks/rubric_pass.py does (the cost depends on the
message's length, not its words); the control is `--kind`'s bundle made exactly as long. The first
rollout of up to 6 seeded draws in which every group's rewards differ is used (step.differing_rollout).
Pass `model.path=<a warm-started policy> warm_start.enabled=false` to skip the warm start.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

from orsd.train.cli import sleeping_openmp_threads

sleeping_openmp_threads()  # as orsd-train runs: before torch is imported

import torch  # noqa: E402

from default_run import cpu_description, positive, script_parser  # noqa: E402
from orsd import rubric  # noqa: E402
from orsd.rubric import controls  # noqa: E402
from orsd.train import bundles, delta  # noqa: E402
from orsd.train.build import build  # noqa: E402
from orsd.train.config import load_config  # noqa: E402
from orsd.train.model import autocast  # noqa: E402
from orsd.train.replay import ReplaySpec, paired_replay, plain_replay  # noqa: E402
from rubric_pass import counted  # noqa: E402
from step import differing_rollout  # noqa: E402

RESULTS = Path(__file__).parent / "results"
B_STAR = rubric.RubricBundle([f"The agent {what} before it acts and checks the result of each step." for what in
                              ["reads the observation", "names the item", "compares prices",
                               "searches with the task's words", "clicks the matching product",
                               "chooses the options the task asks for"]])


def main(argv: list[str]) -> dict:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive, default=3, help="measurements, paper then control")
    parser.add_argument("--kind", default="content_free", choices=("content_free", "shuffled"),
                        help="the control (shuffled draws from a second fixed bundle)")
    args = parser.parse_intermixed_args(argv)
    config = load_config(None, ["method.name=orsd", "train.progress=false", *args.overrides])
    host = cpu_description()
    trainer, _ = build(config, None, None, log=lambda *_: None)
    groups, _, _ = differing_rollout(trainer)
    records = [r for g in groups for t in g.trajectories for r in t.records]
    r = config.rubric
    ids = bundles.rubric_ids(trainer.tokenizer, rubric.rubric_context(B_STAR), r.context_role)
    other = rubric.RubricBundle([f"The agent finds the {x} the task names." for x in ("colour", "size", "price")])
    control = (controls.content_free_bundle(B_STAR) if args.kind == "content_free"
               else controls.shuffled_bundle(B_STAR, [other], random.Random(0)))
    control_ids = delta.control_ids(trainer.tokenizer, control, len(ids), None, r.context_role)
    rubrics = [ids if rec.rubric_slot >= 0 else None for rec in records]
    record_controls = [control_ids if x is not None else None for x in rubrics]
    budget, temperature = config.replay.token_budget, config.rollout.temperature
    runs: dict[str, list] = {"paper": [], "control": []}
    count, hook = counted(trainer.policy.get_decoder())
    with autocast(trainer.policy, config.model.autocast), torch.no_grad():
        for _ in range(args.rounds):
            for name, with_control in (("paper", None), ("control", record_controls)):
                plain = plain_replay(trainer.policy, records, ReplaySpec(temperature, budget), keep_prefixes=True)
                for key in count:
                    count[key] = 0
                start = time.perf_counter()
                result = paired_replay(trainer.policy, records, [0.0] * len(records), rubrics, 1.0,
                                       ReplaySpec(temperature, budget), plain=plain, record_controls=with_control)
                runs[name].append({"seconds": time.perf_counter() - start, **count,
                                   "scored": int(result.valid.sum()),
                                   "delta_abs_mean": float(result.delta[result.valid].abs().mean())})
                print(name, json.dumps(runs[name][-1]), flush=True)
    hook.remove()
    median = {k: {key: statistics.median(run[key] for run in v) for key in ("seconds", "tokens", "forwards")}
              for k, v in runs.items()}
    out = {"machine": host, "torch_threads": torch.get_num_threads(), "rounds": args.rounds, "kind": args.kind,
           "records": len(records), "response_tokens": sum(len(x.response_ids) for x in records),
           "rubric_tokens": len(ids), "runs": runs, "median": median,
           "control_over_paper_seconds": median["control"]["seconds"] / median["paper"]["seconds"],
           "load_average_after": list(cpu_description()["load_average_1_5_15"])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"control_pass_{args.kind}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(median), out["control_over_paper_seconds"])
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
