"""Speculative bundle decoding against the plain loop, alternating in one process (a noisy host then
weighs on both): the default's policy after its warm start, one rollout whose groups all write
bundles, then for each `rubric.draft_tokens` value in turn, `--rounds` times:

- the bundle window as a step runs it (`Trainer.bundles_beside_plain`: bundles on one thread beside
  the plain pass on the other, where it serves);
- the bundles alone on all threads (`Trainer.write_bundles`), with what drafting bought.

    python benchmarks/bundle_window.py [--rounds N] [--drafts 0,8] [section.key=value ...]
    writes benchmarks/results/bundle_window_<device>.json and prints one line per measurement
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

from orsd.train.cli import sleeping_openmp_threads

sleeping_openmp_threads()  # as orsd-train runs: before torch is imported

import torch  # noqa: E402

from orsd.train.build import build  # noqa: E402
from orsd.train.config import load_config  # noqa: E402
from orsd.train.model import autocast  # noqa: E402
from default_run import positive, script_parser  # noqa: E402
from step import RESULTS, differing_rollout, machine  # noqa: E402


def drafts_list(text: str) -> list[int]:
    """argparse type of --drafts: comma-separated counts >= 0."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return counts


def main(argv: list[str]) -> dict:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive, default=3, help="measurements per draft count")
    parser.add_argument("--drafts", type=drafts_list, default=[0, 8], help="rubric.draft_tokens values, e.g. 0,8")
    args = parser.parse_intermixed_args(argv)
    rounds, drafts = args.rounds, args.drafts
    config = load_config(None, ["method.name=orsd", "train.progress=false", *args.overrides])
    host = machine()
    trainer, warm_losses = build(config, None, None, log=lambda *_: None)
    groups, rollout_seconds, _ = differing_rollout(trainer)
    runs = []
    for _ in range(rounds):
        for count in drafts:
            trainer.config.rubric.draft_tokens = count
            with autocast(trainer.policy, config.model.autocast):
                start = time.perf_counter()
                if trainer.overlaps():
                    drawn = copy.deepcopy(groups)
                    request = trainer.method.bundle_request(drawn)
                    candidates, _ = trainer.bundles_beside_plain(request, drawn)
                    window = time.perf_counter() - start
                else:
                    candidates, window = None, None
                trainer.engine.take_draft_stats()
                start = time.perf_counter()
                alone = trainer.write_bundles(trainer.method.bundle_request(copy.deepcopy(groups)))
                alone_seconds = time.perf_counter() - start
            stats = trainer.engine.take_draft_stats()
            run = {"draft_tokens": count, "window_seconds": window, "bundles_alone_seconds": alone_seconds,
                   "bundles_parsed": sum(len(c.bundles) for c in (candidates or alone)),
                   "bundle_tokens": stats.tokens, "decode_forwards": stats.forwards, "drafted": stats.drafted,
                   "drafts_kept": stats.accepted}
            runs.append(run)
            print(json.dumps(run), flush=True)
    result = {"device": "cuda" if torch.cuda.is_available() else "cpu", "machine": host,
              "precision": trainer.environment.get("precision"), "rounds": rounds, "drafts": drafts,
              "bundle_corpus_tokens": [len(c) for c in trainer.engine.draft_corpus],
              "warm_start_loss": [warm_losses[0], warm_losses[-1]] if warm_losses else None,
              "rollout_seconds": rollout_seconds, "runs": runs, "load_average_after": list(os.getloadavg()),
              "config": {"num_bundles": config.rubric.num_bundles, "max_new_tokens": config.rubric.max_new_tokens,
                         "temperature": config.rubric.temperature, "top_p": config.rubric.top_p,
                         "no_repeat_ngram_size": config.rubric.no_repeat_ngram_size, "tasks": len(groups)}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"bundle_window_{result['device']}.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
