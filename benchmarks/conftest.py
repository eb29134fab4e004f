"""Shared pieces of the op benchmarks (bench_<op>.py): quick mode, rounds, devices, peak extra
memory, and a markdown table of the run.

    pytest benchmarks/bench_token_logprobs.py                     # full CPU shapes
    pytest benchmarks --orsd-quick                                # CI: smallest shapes, 1 round
    pytest benchmarks -m gpu                                      # GPU shapes (T up to 32,768)
    pytest benchmarks --orsd-table benchmarks/results/cpu.md      # also write the table

Time: pytest-benchmark's pedantic mode, one call per round after one warm-up call (CUDA calls
end with torch.cuda.synchronize()). Peak extra memory, measured in a separate call: on CPU the
rise of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs) above the RSS before
the call (free heap released first with malloc_trim, so reused heap pages count too); on CUDA
max_memory_allocated() minus memory_allocated() before the call. Both count every byte the call
allocates beyond its inputs, outputs included.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import pytest
import torch

# the gpu marker and the peak-RSS measure are tests/helpers' (shared with the test suite); tests/ is on
# sys.path under pytest (pyproject's pythonpath) but not when a script here imports this file
_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
from helpers.gpu import GPU_MARKER, skip_gpu_items_without_cuda  # noqa: E402
from helpers.memory import peak_rss_growth_kib  # noqa: E402

_ROWS_KEY = pytest.StashKey[list]()


def pytest_addoption(parser):
    group = parser.getgroup("orsd benchmarks")
    group.addoption(
        "--orsd-quick",
        action="store_true",
        default=bool(os.environ.get("ORSD_BENCH_QUICK")),
        help="smallest shapes and one round (also ORSD_BENCH_QUICK=1); for CI",
    )
    group.addoption(
        "--orsd-rounds", type=int, default=None, help="timed rounds per case (default 3 CPU, 20 CUDA)"
    )
    group.addoption("--orsd-table", default=None, help="write a markdown table of this run to this path")


def pytest_configure(config):
    config.stash[_ROWS_KEY] = []
    config.addinivalue_line("markers", GPU_MARKER)


def pytest_collection_modifyitems(config, items):
    skip_gpu_items_without_cuda(items)


@pytest.fixture
def quick(request) -> bool:
    return request.config.getoption("--orsd-quick")


def peak_extra_bytes(fn, device: torch.device) -> int | None:
    """Peak memory fn() allocates beyond what existed before it (None where not measurable)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    growth = peak_rss_growth_kib(fn)  # malloc_trim first; None where /proc/self/clear_refs is not writable
    return None if growth is None else max(0, growth) * 1024


class OpBench:
    """Times one provider of one case and records it for the summary table."""

    def __init__(self, benchmark, request):
        self.benchmark = benchmark
        self.request = request

    def run(
        self,
        fn,
        *,
        op: str,
        case: str,
        provider: str,
        device: torch.device,
        elements: int | None = None,
        bytes_read: int | None = None,
        threads: int | None = None,
    ):
        config = self.request.config
        rounds = config.getoption("--orsd-rounds") or (
            1 if config.getoption("--orsd-quick") else 20 if device.type == "cuda" else 3
        )
        saved_threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            if device.type == "cuda":

                def call():
                    fn()
                    torch.cuda.synchronize(device)

            else:
                call = fn
            call()  # warm-up: first-touch of code and caches, lazy initialisation
            peak = peak_extra_bytes(call, device)
            self.benchmark.group = f"{op} {case}"
            self.benchmark.pedantic(call, rounds=rounds, iterations=1, warmup_rounds=0)
        finally:
            torch.set_num_threads(saved_threads)
        median = self.benchmark.stats.stats.median
        info = self.benchmark.extra_info
        info.update(provider=provider, device=str(device), threads=threads or saved_threads)
        info["peak_extra_mib"] = None if peak is None else peak / 2**20
        if elements:
            info["gelem_per_s"] = elements / median / 1e9
        if bytes_read:  # input bytes over time: the bandwidth an op that reads its input once achieves
            info["gb_per_s"] = bytes_read / median / 1e9
        config.stash[_ROWS_KEY].append(
            {"op": op, "case": case, "provider": provider, "median_ms": median * 1e3, **info}
        )


@pytest.fixture
def op_bench(benchmark, request) -> OpBench:
    return OpBench(benchmark, request)


def _machine() -> str:
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name()
    else:
        gpu = "no GPU"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} CPUs; {gpu}; torch {torch.__version__}"


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--orsd-table")
    rows = session.config.stash.get(_ROWS_KEY, [])
    if not path or not rows:
        return
    lines = [
        f"<!-- written by benchmarks/conftest.py on {time.strftime('%Y-%m-%d %H:%M')} -->",
        f"Machine: {_machine()}",
        "",
        "| op | case | provider | threads | median ms | time / orsd time (same threads) | peak extra MiB | Gelem/s | input GB/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ours = {(r["op"], r["case"], r["threads"]): r["median_ms"] for r in rows if r["provider"] == "orsd"}
    for r in rows:
        base = ours.get((r["op"], r["case"], r["threads"]))
        ratio = "" if base is None else f"{r['median_ms'] / base:.2f}"
        peak = "n/a" if r.get("peak_extra_mib") is None else f"{r['peak_extra_mib']:.1f}"
        rate = f"{r['gelem_per_s']:.2f}" if r.get("gelem_per_s") else ""
        bandwidth = f"{r['gb_per_s']:.1f}" if r.get("gb_per_s") else ""
        lines.append(
            f"| {r['op']} | {r['case']} | {r['provider']} | {r['threads']} | {r['median_ms']:.2f} | {ratio} | {peak} | {rate} | {bandwidth} |"
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")
