"""The embedded default run (`orsd-train` with no arguments) measured as a user meets it: wall time
and peak RSS of the process, the load on the machine, stage seconds and the learning signal.

    python benchmarks/default_run.py [--run-dir /tmp/x] [section.key=value ...]
    writes benchmarks/results/default_run_cpu.json (and prints it)

The run goes to a scratch directory under /tmp, removed once its figures are read (the checkpoints
alone are ~1.4 GB), or to --run-dir, which is kept. Peak RSS is the largest of the run's processes
(ru_maxrss) and, since the warm start runs in a child process of its own (warm_start.process), also
the sum over the run's process tree sampled every 0.2 s; the load average is read before and after,
since on a shared machine the wall time says little without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def positive(text: str) -> int:
    """argparse type of --rounds: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def script_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring as --help, then the config overrides that orsd-train
    takes, so that `--help` or a bad option is answered before the model is built. Parse it with
    parse_intermixed_args, as orsd-train does: overrides may come before, between and after options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, as orsd-train takes them (default: the embedded CPU default)")
    return parser


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


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests (/proc/stat's steal column, all CPUs): a virtual
    machine's cores can be slower than idle for reasons no load average shows."""
    try:
        with open("/proc/stat") as stat:
            return int(stat.readline().split()[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def tree_rss_mib(pid: int) -> float:
    """Resident MiB of `pid` and all its descendants (0 for those gone meanwhile)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


class TreeSampler(threading.Thread):
    """The peak of `tree_rss_mib(pid)` and when it happened, sampled until `stop` is set."""

    def __init__(self, pid: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.every, self.stop = pid, every, threading.Event()
        self.peak, self.peak_at, self.start_time = 0.0, 0.0, time.perf_counter()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            rss = tree_rss_mib(self.pid)
            if rss > self.peak:
                self.peak, self.peak_at = rss, time.perf_counter() - self.start_time


def timed_train(arguments: list[str], env: dict | None = None) -> tuple[float, object, TreeSampler]:
    """`python -m orsd.train.cli ARGUMENTS` as a child: (wall seconds, its rusage, the RSS sampler
    of its process tree); a failed run stops the benchmark."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "orsd.train.cli", *arguments], env=env)
    sampler = TreeSampler(child.pid)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    sampler.stop.set()
    sampler.join()
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"orsd-train failed with status {os.waitstatus_to_exitcode(status)}")
    return wall, usage, sampler


def run(run_dir: Path, overrides: list[str]) -> dict:
    host = cpu_description()
    steal = steal_seconds()
    wall, usage, sampler = timed_train(["--run-dir", str(run_dir), "train.report=false", *overrides])
    summary = json.loads((run_dir / "summary.jsonl").read_text().splitlines()[-1])
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    environment = json.loads((run_dir / "environment.json").read_text())
    return {
        "command": "orsd-train " + " ".join(overrides),
        "machine": {**host, "load_average_after": list(os.getloadavg()),
                    "steal_seconds_during_run": steal_seconds() - steal},
        "precision": environment.get("precision"),
        "openmp": environment.get("openmp"),
        "wall_seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # the largest single process of the tree
        "peak_tree_rss_mib": sampler.peak,
        "peak_tree_rss_at_seconds": sampler.peak_at,
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
    parser = script_parser(__doc__)
    parser.add_argument("--run-dir", help="run directory to keep (default: a scratch one under /tmp, removed after)")
    args = parser.parse_intermixed_args(argv)
    if args.run_dir:
        result = run(Path(args.run_dir), args.overrides)
    else:
        with tempfile.TemporaryDirectory(prefix="orsd-default-") as scratch:
            result = run(Path(scratch), args.overrides)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "default_run_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
