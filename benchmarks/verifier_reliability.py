"""Verifier reliability under injected faults (issue 4's acceptance figure).

Scores G groups × M bundles × N trajectories (one HTTP request each, per-trajectory mode) through
`OpenAIVerifier` against the loopback `FakeChatServer`, once with 30% of all server answers
(retries and re-asks included) replaced by a fault of a random kind, once fault-free, and reports
how many requests were scored, retried and failed, whether any went unaccounted, and the wall time
of both runs.

    python benchmarks/verifier_reliability.py [--fault-rate 0.3] [--groups 7] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import re
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

from orsd.rubric import OpenAIVerifier, RubricBundle
from helpers.fake_server import FakeChatServer, Reply, num_criteria_asked, scores_answer

FAULTS = ("http_429", "http_500", "http_503", "timeout", "dropped_connection", "garbage_body",
          "prose_answer", "missing_scores", "extra_scores", "out_of_range_scores")
CLIENT_TIMEOUT_SECONDS = 1.0
HANG_SECONDS = 1.5


def make_responder(fault_rate: float, seed: int):
    rng = random.Random(seed)
    lock = threading.Lock()
    injected: Counter[str] = Counter()

    def responder(request):
        k = num_criteria_asked(request)
        marker = re.search(r"trajectory (\d+) of group (\d+)", request.prompt)
        i = int(marker.group(1)) if marker else 0
        good = [round(((i * 7 + c * 3) % 11) / 10, 1) for c in range(k)]
        with lock:
            fault = rng.choice(FAULTS) if rng.random() < fault_rate else None
            latency = rng.uniform(0.01, 0.03)
            if fault:
                injected[fault] += 1
        if fault is None:
            return Reply.ok(scores_answer(good), delay_seconds=latency)
        if fault == "http_429":
            return Reply.error(429, retry_after="0.1")
        if fault in ("http_500", "http_503"):
            return Reply.error(int(fault[-3:]), delay_seconds=latency)
        if fault == "timeout":
            return Reply.hang(HANG_SECONDS)
        if fault == "dropped_connection":
            return Reply.drop(delay_seconds=latency)
        if fault == "garbage_body":
            return Reply.garbage()
        if fault == "prose_answer":
            return Reply.ok("The agent followed most of the rubric; I would rate it fairly well.")
        if fault == "missing_scores":
            return Reply.ok(scores_answer(good[: k - 2]))
        if fault == "extra_scores":
            return Reply.ok(scores_answer(good + [0.5, 0.5]))
        return Reply.ok(scores_answer([g * 3 - 1 for g in good]))  # out of range: clamped

    return responder, injected


def workload(groups: int, trajectories: int, bundles: int, criteria: int):
    for g in range(groups):
        transcripts = [f"Observation 0: trajectory {i} of group {g} begins in the kitchen.\n"
                       f"Action 1: go to countertop {i + 1}\nObservation 1: You see an apple {g}."
                       for i in range(trajectories)]
        bundle_list = [RubricBundle([f"Bundle {m} criterion {c}: the agent checks step {c} of group {g}"
                                     for c in range(criteria)]) for m in range(bundles)]
        yield f"Task {g}: put a clean apple in the fridge.", transcripts, bundle_list


def run(fault_rate: float, seed: int, groups: int, trajectories: int, bundles: int, criteria: int) -> dict:
    responder, injected = make_responder(fault_rate, seed)
    rows_total = rows_full = rows_partial = rows_empty = unexplained = 0
    with FakeChatServer(responder) as server:
        verifier = OpenAIVerifier(server.url, "judge", concurrency=8, max_retries=4,
                                  timeout=CLIENT_TIMEOUT_SECONDS, backoff_base_seconds=0.05,
                                  backoff_max_seconds=1.0, seed=seed)
        started = time.perf_counter()

        async def score_all():
            results = []
            for task, transcripts, bundle_list in workload(groups, trajectories, bundles, criteria):
                results.append(await verifier.ascore_many_with_events(task, transcripts, bundle_list))
            return results

        all_results = asyncio.run(score_all())
        wall_seconds = time.perf_counter() - started
        max_in_flight = server.max_in_flight
        abandoned = server.abandoned
        http_seen = len(server.requests)
    for group in all_results:
        for result in group:
            explained = {(e.trajectory, e.criterion) for e in result.events}
            for i, row in enumerate(result.scores):
                rows_total += 1
                finite = np.isfinite(row)
                rows_full += bool(finite.all())
                rows_partial += bool(finite.any() and not finite.all())
                rows_empty += bool(not finite.any())
                for k in np.flatnonzero(~finite):
                    if (i, int(k)) not in explained and (i, None) not in explained:
                        unexplained += 1
    stats = verifier.stats()
    return {
        "fault_rate": fault_rate,
        "verifier_requests": stats["requests"],
        "rows_fully_scored": rows_full,
        "rows_partly_scored": rows_partial,
        "rows_unscored": rows_empty,
        "requests_succeeded": stats["succeeded"],
        "requests_failed": stats["failed"],
        "failures_by_reason": stats["failures_by_reason"],
        "requests_unaccounted": stats["requests"] - stats["succeeded"] - stats["failed"],
        "nan_cells_without_recorded_reason": unexplained,
        "retries": stats["retries"],
        "reasks": stats["reasks"],
        "http_attempts_client": stats["http_attempts"],
        "http_requests_seen_by_server": http_seen,
        "faults_injected": dict(sorted(injected.items())),
        "faults_injected_total": sum(injected.values()),
        "cells_scored": stats["cells_scored"],
        "cells_unscored": stats["cells_unscored"],
        "scores_clamped": stats["scores_clamped"],
        "max_in_flight_seen_by_server": max_in_flight,
        "requests_abandoned_by_client": abandoned,
        "latency_seconds_p50": stats["latency_seconds_p50"],
        "latency_seconds_p90": stats["latency_seconds_p90"],
        "latency_seconds_p99": stats["latency_seconds_p99"],
        "wall_seconds": round(wall_seconds, 3),
        "rows_total": rows_total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--groups", type=int, default=7)
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--bundles", type=int, default=4)
    parser.add_argument("--criteria", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "verifier_reliability.json")
    args = parser.parse_args()
    shape = (args.groups, args.trajectories, args.bundles, args.criteria)
    faulty = run(args.fault_rate, args.seed, *shape)
    clean = run(0.0, args.seed, *shape)
    report = {
        "description": "OpenAIVerifier vs loopback FakeChatServer; per-trajectory JSON scoring; "
                       "concurrency 8, max_retries 4, timeout 1 s, backoff base 0.05 s (cap 1 s), "
                       "429 Retry-After 0.1 s, hang 1.5 s; every server answer (retries and re-asks "
                       "included) is a fault with probability fault_rate, kinds drawn uniformly",
        "workload": {"groups": args.groups, "trajectories": args.trajectories, "bundles": args.bundles,
                     "criteria": args.criteria, "seed": args.seed},
        "fault_kinds": list(FAULTS),
        "with_faults": faulty,
        "fault_free": clean,
        "wall_time_ratio": round(faulty["wall_seconds"] / clean["wall_seconds"], 2),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name in ("with_faults", "fault_free"):
        r = report[name]
        print(f"{name:12s} requests={r['verifier_requests']} fully_scored={r['rows_fully_scored']} "
              f"partly={r['rows_partly_scored']} unscored={r['rows_unscored']} retries={r['retries']} "
              f"reasks={r['reasks']} failed={r['requests_failed']} unaccounted={r['requests_unaccounted']} "
              f"faults={r['faults_injected_total']} wall={r['wall_seconds']} s")
    print(f"wall time ratio {report['wall_time_ratio']}; written to {args.out}")


if __name__ == "__main__":
    main()
