"""The embedded default run (`orsd-train` with no arguments) measured as a user meets it: wall time
and peak RSS of the process, the load on the machine, stage seconds and the learning signal.

    python benchmarks/default_run.py [--run-dir /tmp/x] [section.key=value ...]
    writes benchmarks/results/default_run_cpu.json (and prints it)

The run goes to a scratch directory (a new one under /tmp unless --run-dir is given). Peak RSS is
the child's ru_maxrss; the load average is read before and after, since on a shared machine the
wall time says little without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def cpu_description() -> dict:
    """The CPU's model name and the ISA flags that decide precision (model.autocast=auto), cores,
    load average; no torch import."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16") if f in flags]
    return {"cpu": name, "isa": isa, "cores": os.cpu_count(), "load_average_1_5_15": list(os.getloadavg())}


def run(run_dir: Path, overrides: list[str]) -> dict:
    host = cpu_description()
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "orsd.train.cli", "--run-dir", str(run_dir),
                              "train.report=false", *overrides])
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"orsd-train failed with status {os.waitstatus_to_exitcode(status)}")
    summary = json.loads((run_dir / "summary.jsonl").read_text().splitlines()[-1])
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    environment = json.loads((run_dir / "environment.json").read_text())
    return {
        "command": "orsd-train " + " ".join(overrides),
        "machine": {**host, "load_average_after": list(os.getloadavg())},
        "precision": environment.get("precision"),
        "openmp": environment.get("openmp"),
        "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "setup_seconds": summary["setup_seconds"],
        "stage_seconds_per_step": summary["stage_seconds_per_step"],
        "learning_signal": {
            "warm_start_loss_first_last": summary["warm_start_loss"],
            "valid_action_rate_per_step": [s["valid_action_rate"] for s in steps],
            "bundles_parsed_per_step": [s["bundles_parsed"] for s in steps],
            "bundles_discarded_per_step": [s["bundles_discarded"] for s in steps],
            "groups_rewards_differ": summary["fraction_groups_rewards_differ"],
            "groups_with_bundle": summary["fraction_groups_with_bundle"],
            "reward_per_step": [s["reward_mean"] for s in steps],
        },
    }


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="scratch run directory (default: a new one under /tmp)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="orsd-default-"))
    result = run(run_dir, args.overrides)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "default_run_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
