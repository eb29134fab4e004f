"""Floating-point operations of a step's stages, counted as they run (benchmarks/step.py --flops).

torch's FlopCounterMode counts the matmuls (mm, addmm, bmm, ...) and the CUDA attention kernels;
this adds what it does not see on a CPU: the flash-attention kernel for CPUs (forward and
backward), oneDNN's matmul with packed weights (a bf16 decode step's), and the GEMMs that run
outside torch's dispatcher in orsd.ops (lm_head_logprobs's native kernels, fused_token_logprobs's
16-bit GEMM through MKL). What is counted is the work the code does, padding included, not the
least work the method needs; the elementwise ops (norms, rotary embedding, activations) are left
out, as FlopCounterMode leaves them.

A dispatch mode sees only its own thread's ops, and so do the native counts here: the verifier's
forwards (a worker thread) are not counted, as the step ratio leaves its time out too, and the
bundles are counted only where they run on the counting thread (`replay.overlap=false`).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
from collections import defaultdict

import torch
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def _attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Q·Kᵀ and P·V: 4 · batch · query heads · query length · key length · head dim (keys and values
    of fewer heads, grouped-query attention, are read once per query head all the same)."""
    b, heads, s_q, d = query
    return 4 * b * heads * s_q * key[2] * d


def _attention_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """Flash attention's backward: Q·Kᵀ again, then dV, dP, dQ and dK: 2.5× the forward."""
    return _attention(query, key, value) * 5 // 2


def _packed_linear(x, weight, *args, out_shape=None, **kwargs) -> int:
    """oneDNN's matmul with a packed weight (engines/packed.py: a bf16 decode step's few rows):
    2 · rows · in features · out features, read off the input and the output (the packed weight's
    shape is oneDNN's blocked layout)."""
    return 2 * math.prod(x) * out_shape[-1]


CPU_OPS = {aten._scaled_dot_product_flash_attention_for_cpu: _attention,
           aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward,
           torch.ops.mkldnn._linear_pointwise: _packed_linear}


class StageFlops:
    """flops[stage] for the stages timed through orsd.train.trainer.timed while `counting()` holds;
    a `bucket(name)` opened inside a stage counts its part apart too (the plain pass inside replay)."""

    def __init__(self) -> None:
        self.flops: dict[str, int] = defaultdict(int)
        self._open = threading.local()  # the buckets open on this thread, innermost last

    def _buckets(self) -> list[str]:
        if not hasattr(self._open, "names"):
            self._open.names = []
        return self._open.names

    @contextlib.contextmanager
    def bucket(self, name: str):
        """Counts what runs on this thread inside it into flops[name] (nested buckets count in each)."""
        self._buckets().append(name)
        counter = FlopCounterMode(display=False, custom_mapping=CPU_OPS)
        try:
            with counter:
                yield
        finally:
            self._buckets().pop()
            self.flops[name] += counter.get_total_flops()

    def native(self, flops: int) -> None:
        for name in self._buckets():
            self.flops[name] += flops

    @contextlib.contextmanager
    def counting(self):
        """Every stage the trainer times, and the native LM-head GEMMs, counted while it holds."""
        from orsd.train import replay, trainer

        blas = importlib.import_module("orsd.ops._blas")  # the modules, not the functions
        head = importlib.import_module("orsd.ops.lm_head_logprobs")  # orsd.ops exports under their names
        timed, call_mkl, launch, plain = trainer.timed, blas.call_mkl, head._launch, replay.plain_replay

        @contextlib.contextmanager
        def counted_timed(seconds, name):
            with timed(seconds, name), self.bucket(name):
                yield

        def counted_mkl(function, a, b, out):  # replay's 16-bit head GEMM through MKL (f32 goes through torch.mm)
            self.native(2 * a.shape[0] * a.shape[1] * b.shape[0])
            return call_mkl(function, a, b, out)

        def counted_launch(kind, direction, args, hidden, workspace):  # the GEMMs inside the native kernels
            tokens, vocab, width = args[2], args[3], args[4]
            gemms = 1 if direction == "forward" else 1 + bool(args[-2]) + bool(args[-1])  # logits again, dH, dW
            self.native(2 * tokens * vocab * width * gemms)
            return launch(kind, direction, args, hidden, workspace)

        def counted_plain(*args, **kwargs):  # paired_replay's plain pass, where the step did not run it beside
            with self.bucket("plain pass"):
                return plain(*args, **kwargs)

        trainer.timed, blas.call_mkl, head._launch = counted_timed, counted_mkl, counted_launch
        replay.plain_replay = counted_plain
        try:
            yield self
        finally:
            trainer.timed, blas.call_mkl, head._launch, replay.plain_replay = timed, call_mkl, launch, plain
