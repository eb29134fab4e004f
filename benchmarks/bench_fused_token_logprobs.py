"""fused_token_logprobs (hidden, LM head -> log-probs, never T x V) vs the torch way in the same run:
logits = hidden @ W.T, then torch.log_softmax(logits.float(), -1).gather(...). H = 2048,
V = 151,936 (Qwen3-1.7B's head). CPU: T in {512, 2048}; GPU: T up to 32,768.

Note the torch path rounds its logits to bf16 (|error| up to ~0.06 at |logit| ~ 20); ours keeps
f32 logits (its GEMM has an f32 output), which is the more accurate answer and the one the
reference defines.
"""

from __future__ import annotations

import pytest
import torch

from orsd.ops import fused_token_logprobs

H, V = 2048, 151_936
CPU_CASES = [(512, torch.bfloat16), (2048, torch.bfloat16), (512, torch.float32)]
GPU_CASES = [(4096, torch.bfloat16), (32_768, torch.bfloat16)]
QUICK_CASES = [(512, torch.bfloat16)]

PROVIDERS = {
    "orsd": lambda h, w, t: fused_token_logprobs(h, w, t),
    "torch": lambda h, w, t: torch.log_softmax((h @ w.T).float(), dim=-1).gather(-1, t[:, None]).squeeze(-1),
}

_inputs: dict = {}


def inputs(T, dtype, device):
    key = (T, dtype, str(device))
    if key not in _inputs:
        _inputs.clear()
        g = torch.Generator(device=device).manual_seed(0)
        weight = torch.empty(V, H, dtype=dtype, device=device)
        for start in range(0, V, 8192):  # built in blocks: no f32 copy of the whole head
            rows = min(V, start + 8192) - start
            weight[start : start + rows] = torch.randn(rows, H, generator=g, device=device) * (3 / H**0.5)
        hidden = torch.randn(T, H, generator=g, device=device).to(dtype)
        targets = torch.randint(0, V, (T,), generator=g, device=device)
        _inputs[key] = (hidden, weight, targets)
    return _inputs[key]


def cases(device_type):
    return [
        (T, dtype, p) for T, dtype in (GPU_CASES if device_type == "cuda" else CPU_CASES) for p in PROVIDERS
    ]


def run_case(op_bench, quick, T, dtype, provider, device):
    if quick and (T, dtype) not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    hidden, weight, targets = inputs(T, dtype, device)
    name = str(dtype).removeprefix("torch.")
    op_bench.run(
        lambda: PROVIDERS[provider](hidden, weight, targets),
        op="fused_token_logprobs", case=f"T={T} H={H} V={V} {name}", provider=provider, device=device, elements=T * V,
    )  # fmt: skip


@pytest.mark.parametrize("T, dtype, provider", cases("cpu"))
def test_fused_token_logprobs_cpu(op_bench, quick, T, dtype, provider):
    run_case(op_bench, quick, T, dtype, provider, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("T, dtype, provider", cases("cuda"))
def test_fused_token_logprobs_cuda(op_bench, quick, T, dtype, provider):
    run_case(op_bench, quick, T, dtype, provider, torch.device("cuda"))
