"""Verifier accounting: counters, latency percentiles and the record of every unscored cell.

Shared by both verifiers so their metrics read the same. Thread-safe, because the blocking
`score()` may run a verifier's coroutines on a helper thread's event loop.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: the counters `stats()` always reports (0 when nothing happened)
COUNTERS = (
    "requests",                   # logical verifier requests (one prompt, re-ask included)
    "succeeded",                  # requests that ended with a readable answer
    "failed",                     # requests that ended without one (see failures_by_reason)
    "cache_hits",                 # requests answered from the on-disk cache (no network)
    "http_attempts",              # HTTP calls made (OpenAIVerifier)
    "retries",                    # HTTP calls beyond the first of a request
    "reasks",                     # corrective re-asks after a malformed answer
    "response_format_fallbacks",  # times the server rejected response_format
    "prompt_tokens",
    "completion_tokens",
    "cells_scored",               # (trajectory, criterion) cells with a finite score
    "cells_unscored",             # cells left NaN
    "scores_clamped",             # scores outside [0, 1] brought back into it
)
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class VerifierEvent:
    """One recorded failure: which cell(s) stayed unscored and why (None = every one of them).

    `bundle` is the bundle's position in `ascore_many` (None for a single `ascore`).
    """

    reason: str
    trajectory: int | None = None
    criterion: int | None = None
    bundle: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Accounting:
    """Counters and events of one verifier (see COUNTERS)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: Counter[str] = Counter()
        self._failures: Counter[str] = Counter()
        self._latencies_seconds: list[float] = []
        self._events: list[VerifierEvent] = []

    def add(self, name: str, amount: int = 1) -> None:
        if name not in COUNTERS:
            raise ValueError(f"name={name!r}: expected one of {COUNTERS}")
        with self._lock:
            self._counters[name] += amount

    def request_failed(self, reason: str) -> None:
        with self._lock:
            self._counters["failed"] += 1
            self._failures[reason] += 1

    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latencies_seconds.append(float(seconds))

    def record(self, events: list[VerifierEvent]) -> None:
        with self._lock:
            self._events.extend(events)

    def drain_events(self) -> list[VerifierEvent]:
        """Every event recorded since the last drain, oldest first (for groups.jsonl)."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """The counters, `failures_by_reason` and latency percentiles (None before any request)."""
        with self._lock:
            out: dict[str, Any] = {name: int(self._counters[name]) for name in COUNTERS}
            out["failures_by_reason"] = dict(sorted(self._failures.items()))
            latencies = np.asarray(self._latencies_seconds, dtype=np.float64)
            for q in PERCENTILES:
                out[f"latency_seconds_p{q}"] = float(np.percentile(latencies, q)) if latencies.size else None
            if reset:
                self._counters.clear()
                self._failures.clear()
                self._latencies_seconds.clear()
        return out
