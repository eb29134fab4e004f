"""What both verifiers share: the scoring protocol, its blocking twins, and input checks.

A verifier scores every criterion of a bundle on every trajectory of a group in [0, 1] (paper
§3.2, the input of Eq. 5). `ascore` returns an [N, K] array with NaN for cells it could not score;
why each NaN happened is recorded as a `VerifierEvent` (see `drain_events`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from orsd.rubric.accounting import Accounting, VerifierEvent
from orsd.rubric.answers import ParsedScores
from orsd.rubric.bundle import RubricBundle
from orsd.rubric.prompts import MODES

SCORINGS = ("json", "yes_prob")
T = TypeVar("T")


@dataclass
class VerifierResult:
    """Scores [N, K] of one bundle (NaN = unscored) and the events that explain every NaN."""

    scores: np.ndarray
    events: list[VerifierEvent] = field(default_factory=list)


def run_blocking(make_coroutine: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from synchronous code.

    Without a running event loop this is `asyncio.run`. Inside one (a notebook, an async trainer)
    the coroutine runs on a fresh loop in a helper thread and the caller's loop is blocked until it
    is done; async callers should `await` the `a*` method instead.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coroutine())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="orsd-verifier") as pool:
        return pool.submit(lambda: asyncio.run(make_coroutine())).result()  # type: ignore[arg-type]


def check_mode(mode: Any, scoring: Any) -> None:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring={scoring!r}: expected one of {SCORINGS}")
    if scoring == "yes_prob" and mode != "per_trajectory":
        raise ValueError(f"mode={mode!r} with scoring='yes_prob': a yes/no question concerns one "
                         "trajectory and one criterion; use mode='per_trajectory'")


def check_score_inputs(task: Any, transcripts: Any, bundles: Sequence[Any]) -> None:
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task={task!r}: expected the task description as a non-empty string")
    if isinstance(transcripts, str) or not isinstance(transcripts, Sequence) or not transcripts:
        raise TypeError(f"transcripts={transcripts!r}: expected a non-empty list of transcript strings")
    for i, text in enumerate(transcripts):
        if not isinstance(text, str):
            raise TypeError(f"transcripts[{i}]={text!r}: expected a string (see format_transcript)")
    for m, bundle in enumerate(bundles):
        if not isinstance(bundle, RubricBundle):
            raise TypeError(f"bundles[{m}]={bundle!r}: expected a RubricBundle")


def events_from(parsed: ParsedScores, bundle_index: int | None) -> list[VerifierEvent]:
    return [VerifierEvent(p.reason, p.trajectory, p.criterion, bundle_index, p.detail)
            for p in parsed.problems]


class VerifierBase:
    """The shared half of both verifiers; a subclass implements `ascore_with_events`."""

    accounting: Accounting

    async def ascore_with_events(self, task: str, transcripts: Sequence[str], bundle: RubricBundle,
                                 bundle_index: int | None = None) -> VerifierResult:
        raise NotImplementedError

    async def ascore(self, task: str, transcripts: Sequence[str], bundle: RubricBundle) -> np.ndarray:
        """Scores [N, K] of `bundle` on the N transcripts; NaN where a cell could not be scored."""
        return (await self.ascore_with_events(task, transcripts, bundle)).scores

    async def ascore_many_with_events(self, task: str, transcripts: Sequence[str],
                                      bundles: Sequence[RubricBundle]) -> list[VerifierResult]:
        """One result per bundle, all bundles scored concurrently; events carry the bundle index."""
        check_score_inputs(task, transcripts, bundles)
        return list(await asyncio.gather(*(self.ascore_with_events(task, transcripts, bundle, m)
                                           for m, bundle in enumerate(bundles))))

    async def ascore_many(self, task: str, transcripts: Sequence[str],
                          bundles: Sequence[RubricBundle]) -> list[np.ndarray]:
        """The M score matrices of one group's bundles (the input of `align`, Eq. 5–7)."""
        return [r.scores for r in await self.ascore_many_with_events(task, transcripts, bundles)]

    def score(self, task: str, transcripts: Sequence[str], bundle: RubricBundle) -> np.ndarray:
        """Blocking twin of `ascore` (see `run_blocking` for calls from inside an event loop)."""
        return run_blocking(lambda: self.ascore(task, transcripts, bundle))

    def score_many(self, task: str, transcripts: Sequence[str],
                   bundles: Sequence[RubricBundle]) -> list[np.ndarray]:
        """Blocking twin of `ascore_many`."""
        return run_blocking(lambda: self.ascore_many(task, transcripts, bundles))

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Accounting as a flat dict of metrics (see orsd.rubric.accounting.COUNTERS)."""
        return self.accounting.stats(reset=reset)

    def drain_events(self) -> list[VerifierEvent]:
        """Every failure recorded since the last drain (trajectory, criterion, bundle, reason)."""
        return self.accounting.drain_events()

    def _finish(self, scores: np.ndarray, events: list[VerifierEvent], clamped: int) -> VerifierResult:
        finite = int(np.isfinite(scores).sum())
        self.accounting.add("cells_scored", finite)
        self.accounting.add("cells_unscored", int(scores.size) - finite)
        self.accounting.add("scores_clamped", clamped)
        self.accounting.record(events)
        return VerifierResult(scores, events)
