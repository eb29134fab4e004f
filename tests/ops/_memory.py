"""Peak resident-memory growth of a call (Linux), used to show an op allocates no T x V tensor."""

from __future__ import annotations

import pytest
from helpers.memory import peak_rss_growth_kib


def peak_rss_growth_bytes(fn) -> int:
    """Run fn() and return how far the peak RSS rose above the RSS just before it (freed heap is
    returned to the OS first, so reusing it counts as growth too)."""
    growth = peak_rss_growth_kib(fn)
    if growth is None:
        pytest.skip("needs a writable /proc/self/clear_refs (Linux) to measure peak memory")
    return growth * 1024
