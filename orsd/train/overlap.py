"""Writing bundles beside the plain pass (`replay.overlap`).

On a CPU a decode step is no faster on two threads than on one, while a forward pass is. The
plain-context replay does not depend on the bundles, so while one core writes them the other runs
it; the verifier, the rubric pass, the reference pass and the update come after, on both cores.
The reference pass stays out of this window: with speculative bundle decoding the decode and the
plain pass on one thread end together, so a reference pass there would only lengthen the window,
and on both threads afterwards it is short. Whether side by side beats one after the other depends
on the CPU (docs/performance.md has the figures); `replay.overlap=false` turns this off.

The bundle writer decodes with a `twin` of its model: module objects of its own over the same
parameter and buffer tensors, because decoding sets state on modules (eval mode, the attention
implementation, packed forwards: engines/hf.py, engines/packed.py) that the plain pass, running on
the policy at the same time, must not see. Intra-op threads are per thread in torch's OpenMP
backend, so each side sets its own.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch


def serves(engine, policy, distributed: bool) -> bool:
    """One process on a CPU with at least two intra-op threads that can be set per thread and the
    hf engine. vLLM's in-process CPU worker replaces `torch.set_num_threads` with a no-op once it
    has bound its threads, for the whole process; the two sides would then each run on every core."""
    from orsd.engines.hf import HfEngine

    return (not distributed and isinstance(engine, HfEngine)
            and torch.set_num_threads is torch._C.set_num_threads and torch.get_num_threads() >= 2
            and next(policy.parameters()).device.type == "cpu")


class Later:
    """A stage's value made when first asked for (`value()`), unless a stage runner made it earlier
    beside another stage (write_beside): how the step schedules the plain pass, which does not
    depend on the bundles, without the bundle stage returning it."""

    def __init__(self, make: Callable[[], object]):
        self._make, self._made, self._value = make, False, None

    def value(self):
        if not self._made:
            self._value, self._made = self._make(), True
        return self._value


def write_beside(write: Callable, engine, later: Later, context: Callable[[], AbstractContextManager]):
    """`write(twin_engine)` (the bundles) on a thread of its own, through a twin of `engine`'s model,
    while this thread makes `later`'s value (the plain pass), each side on one intra-op thread, the
    writer under `context()` (the caller's autocast, which is per thread). Returns what write
    returned. The plain pass runs on one thread even when the bundles are written before it ends:
    the thread count is part of a bf16 result, so where a pass runs must not depend on timing. The
    reference pass is the step's own stage, on all threads, as GRPO runs it."""
    twin_engine = copy.copy(engine)
    twin_engine.model = twin(engine.model)  # made here, before the plain pass toggles the policy's modules
    threads = torch.get_num_threads()
    worker = Beside(lambda: write(twin_engine), context)
    try:
        torch.set_num_threads(1)
        later.value()
    finally:
        worker.join()
        torch.set_num_threads(threads)
    return worker.result()


def twin(model: torch.nn.Module) -> torch.nn.Module:
    """A module tree of its own over `model`'s parameter and buffer tensors (nothing is copied but
    the modules and their config): an update in place reaches both, while what a caller sets on a
    module (train/eval, the attention implementation, an instance `forward`) stays on one."""
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, shared)


class Beside:
    """`work()` on a thread of its own with one intra-op thread, under `context()`; `result()` joins
    and returns what it returned, raising what it raised."""

    def __init__(self, work: Callable[[], object], context: Callable[[], AbstractContextManager]):
        self._work, self._context = work, context
        self._value: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="orsd-bundles", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        torch.set_num_threads(1)
        try:
            with self._context():
                self._value = self._work()
        except BaseException as error:  # re-raised on the caller's thread by result()
            self._error = error

    def join(self) -> None:
        self._thread.join()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
