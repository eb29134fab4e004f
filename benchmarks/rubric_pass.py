"""Paired replay's rubric pass with and without `replay.reuse_plain`, on one rollout of the default
shape: seconds, tokens and forwards the decoder was given, alternating in one process.

    python benchmarks/rubric_pass.py [--rounds N] [section.key=value ...]   # defaults: the CPU default
    writes benchmarks/results/rubric_pass_history<env.max_history_turns>.json and prints each round

Each round runs the plain pass (keeping its keys/values where reuse is on) and then times only the
rubric pass, off then on. The rubric is a fixed 6-criterion message (its ids are spliced at every
record's slot as B*'s would be): what the pass costs depends on its length, not on its words, and
a fixed one leaves the verifier and the bundles' sampling out of the comparison. Δ of both is
compared with Δ of whole padded forwards (`replay.share_prefix=false`). The first rollout
of up to 6 seeded draws in which every group's rewards differ is used (step.differing_rollout).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from orsd.train.cli import sleeping_openmp_threads

sleeping_openmp_threads()  # as orsd-train runs: before torch is imported

import torch  # noqa: E402

from default_run import cpu_description, positive, script_parser  # noqa: E402
from orsd.train import bundles  # noqa: E402
from orsd.train.build import build  # noqa: E402
from orsd.train.config import load_config  # noqa: E402
from orsd.train.model import autocast  # noqa: E402
from orsd.train.replay import ReplaySpec, paired_replay, plain_replay  # noqa: E402
from step import differing_rollout  # noqa: E402

RESULTS = Path(__file__).parent / "results"
RUBRIC = "Rubric for this task:\n" + "\n".join(
    f"{i}. The agent {what} before it acts and checks the result of each step." for i, what in enumerate(
        ["reads the observation", "names the item", "compares prices", "searches with the task's words",
         "clicks the matching product", "chooses the options the task asks for"], 1))


def counted(decoder):
    """A forward pre-hook counting the decoder's forwards, their non-padding ids and padded positions."""
    count = {"forwards": 0, "tokens": 0, "padded": 0}

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids")
        count["forwards"] += 1
        count["tokens"] += int((ids != 0).sum())
        count["padded"] += ids.numel()

    return count, decoder.register_forward_pre_hook(hook, with_kwargs=True)


def main(argv: list[str]) -> dict:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive, default=3, help="measurements, reuse off then on")
    args = parser.parse_intermixed_args(argv)
    rounds = args.rounds
    config = load_config(None, ["method.name=orsd", "train.progress=false", *args.overrides])
    host = cpu_description()
    trainer, _ = build(config, None, None, log=lambda *_: None)
    groups, _, _ = differing_rollout(trainer)
    records = [r for g in groups for t in g.trajectories for r in t.records]
    rubric = bundles.rubric_ids(trainer.tokenizer, RUBRIC, config.rubric.context_role)
    rubrics = [rubric if r.rubric_slot >= 0 else None for r in records]
    budget = config.replay.token_budget
    runs: dict[str, list] = {"off": [], "on": []}
    count, hook = counted(trainer.policy.get_decoder())
    delta = {}
    with autocast(trainer.policy, config.model.autocast), torch.no_grad():
        for _ in range(rounds):
            for name, reuse in (("off", False), ("on", True)):
                plain = plain_replay(trainer.policy, records, ReplaySpec(config.rollout.temperature, budget),
                                     keep_prefixes=reuse)
                for key in count:
                    count[key] = 0
                start = time.perf_counter()
                result = paired_replay(trainer.policy, records, [0.0] * len(records), rubrics, 1.0,
                                       ReplaySpec(config.rollout.temperature, budget, reuse_plain=reuse), plain=plain)
                runs[name].append({"seconds": time.perf_counter() - start, **count,
                                   "scored": int(result.valid.sum())})
                delta[name] = result.delta
                print(name, json.dumps(runs[name][-1]), flush=True)
        # how far Δ moves from Δ of whole padded forwards (share_prefix off: nothing shared, nothing
        # kept), with and without reuse: under bf16 sharing alone moves it (other batch shapes)
        whole = paired_replay(trainer.policy, records, [0.0] * len(records), rubrics, 1.0,
                              ReplaySpec(config.rollout.temperature, budget, share_prefix=False))
    hook.remove()
    valid = whole.valid
    gap = {name: {"max": float((d - whole.delta)[valid].abs().max()), "mean": float((d - whole.delta)[valid].abs().mean())}
           for name, d in delta.items()}
    gap["whole_mean_abs_delta"] = float(whole.delta[valid].abs().mean())
    out = {"machine": host, "torch_threads": torch.get_num_threads(), "rounds": rounds,
           "max_history_turns": config.env.max_history_turns, "records": len(records),
           "rubric_tokens": len(rubric), "runs": runs, "delta_vs_whole_forwards": gap,
           "median_seconds": {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()},
           "load_average_after": list(cpu_description()["load_average_1_5_15"])}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"rubric_pass_history{config.env.max_history_turns}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["median_seconds"]), json.dumps(gap))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
