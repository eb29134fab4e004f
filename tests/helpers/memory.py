"""Peak resident-memory growth of a call (Linux), shared by the op tests (tests/ops/_memory.py: an op
allocates no T x V tensor) and the op benchmarks (benchmarks/conftest.py: peak extra memory)."""

from __future__ import annotations

import ctypes


def status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM, ...)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def release_free_heap() -> None:
    """Give freed malloc memory back to the OS (glibc malloc_trim), so an allocation that reuses
    it page-faults again and shows in the peak RSS instead of hiding in already-resident heap."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_growth_kib(fn) -> int | None:
    """Run fn() and return how far the peak RSS (VmHWM) rose above the RSS just before it, in KiB;
    None, without calling fn, where /proc/self/clear_refs is not writable (it resets the peak)."""
    release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM (the peak) to the current RSS
    except OSError:
        return None
    before = status_kib("VmRSS")
    fn()
    return status_kib("VmHWM") - before
