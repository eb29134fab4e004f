"""Peak resident-memory growth of a call (Linux), used to show an op allocates no T x V tensor."""

from __future__ import annotations

import ctypes

import pytest


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_rss_growth_bytes(fn) -> int:
    """Run fn() and return how far the peak RSS rose above the RSS just before it (freed heap is
    returned to the OS first, so reusing it counts as growth too)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets VmHWM (the peak) to the current RSS
    except OSError:
        pytest.skip("needs a writable /proc/self/clear_refs (Linux) to measure peak memory")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024
