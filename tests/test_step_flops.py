"""benchmarks/flops.py, the FLOP counter behind `benchmarks/step.py --flops`: it must see what
torch's own counter misses on a CPU (the flash-attention kernel forward and backward, oneDNN's
packed decode matmul, the native LM-head ops), count per stage, and leave other threads' work and
the patched functions as they were."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from flops import StageFlops  # noqa: E402
from orsd import ops  # noqa: E402
from orsd.engines import packed  # noqa: E402
from orsd.train import replay, trainer  # noqa: E402

blas_module = importlib.import_module("orsd.ops._blas")
head_module = importlib.import_module("orsd.ops.lm_head_logprobs")


def test_cpu_flash_attention_forward_and_backward_are_counted():
    b, heads, s_q, s_k, d = 2, 3, 5, 7, 8
    query = torch.randn(b, heads, s_q, d, requires_grad=True)
    key, value = torch.randn(b, heads, s_k, d), torch.randn(b, heads, s_k, d)
    mask = torch.ones(b, 1, s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
    forward = 4 * b * heads * s_q * s_k * d
    counter = StageFlops()
    with counter.bucket("forward"):
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    with counter.bucket("backward"):
        out.sum().backward()
    assert counter.flops["forward"] == forward
    assert counter.flops["backward"] == forward * 5 // 2


def test_a_nested_bucket_counts_in_both():
    counter = StageFlops()
    with counter.bucket("replay"):
        torch.randn(2, 3) @ torch.randn(3, 4)  # 48
        with counter.bucket("plain pass"):
            torch.randn(5, 6) @ torch.randn(6, 7)  # 420
    assert dict(counter.flops) == {"replay": 468, "plain pass": 420}


@pytest.mark.skipif(not packed.packs_bf16(), reason="oneDNN does not pack bf16 weights on this CPU (no AVX-512)")
def test_packed_decode_linear_is_counted():
    layer = torch.nn.Linear(8, 5, bias=False)
    x = torch.randn(3, 8)
    counter = StageFlops()
    with torch.autocast("cpu", dtype=torch.bfloat16), packed.packed_linears(layer), torch.no_grad():
        assert packed.is_packed(layer)
        with counter.bucket("decode"):
            layer(x)
    assert counter.flops["decode"] == 2 * 3 * 8 * 5


def test_stages_native_heads_and_threads():
    counter = StageFlops()
    n, vocab, width = 6, 11, 4
    gemm = 2 * n * vocab * width
    hidden, weight = torch.randn(n, width), torch.randn(vocab, width)
    targets = torch.randint(0, vocab, (n,))
    def patched():
        return trainer.timed, blas_module.call_mkl, head_module._launch, replay.plain_replay

    originals = patched()
    for dtype in (torch.float32, torch.bfloat16):  # each GEMM's one-time self-test, before counting
        ops.fused_token_logprobs(hidden.to(dtype), weight.to(dtype), targets)
        ops.lm_head_logprobs(hidden.to(dtype), weight.to(dtype), targets)
    elsewhere = threading.Thread(target=lambda: torch.randn(64, 64) @ torch.randn(64, 64))
    with counter.counting():
        assert all(now is not before for now, before in zip(patched(), originals))
        seconds: dict = {}
        with trainer.timed(seconds, "replay"):
            torch.randn(3, 5) @ torch.randn(5, 2)  # 2 · 3 · 5 · 2
            ops.fused_token_logprobs(hidden, weight, targets)  # f32: torch.mm, seen by the dispatch mode
            ops.fused_token_logprobs(hidden.bfloat16(), weight.bfloat16(), targets)  # 16-bit: MKL where present
            elsewhere.start()
            elsewhere.join()  # another thread's matmul: not this stage's
        with trainer.timed(seconds, "update"):
            lp = ops.lm_head_logprobs(hidden.clone().requires_grad_(), weight.clone().requires_grad_(), targets)
            lp.sum().backward()  # logits again, grad_hidden, grad_weight
        with trainer.timed(seconds, "teacher"):
            lp = ops.lm_head_logprobs(hidden.clone().requires_grad_(), weight, targets)
            lp.sum().backward()  # logits again, grad_hidden
    assert counter.flops["replay"] == 60 + 2 * gemm
    assert counter.flops["update"] == 4 * gemm
    assert counter.flops["teacher"] == 3 * gemm
    assert seconds.keys() == {"replay", "update", "teacher"}
    assert patched() == originals
