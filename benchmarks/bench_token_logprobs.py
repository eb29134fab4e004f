"""token_logprobs vs the ways people write it in torch today, in the same run:
torch.log_softmax(logits.float(), -1).gather(...) ("torch-float") and, for bf16 input, the same
without the upcast ("torch-bf16"). V = 151,936 (Qwen3). CPU: T in {512, 2048}; GPU: T up to 32,768.
"""

from __future__ import annotations

import pytest
import torch

from orsd.ops import token_logprobs

V = 151_936
CPU_CASES = [(512, torch.bfloat16), (2048, torch.bfloat16), (512, torch.float32), (2048, torch.float32)]
GPU_CASES = [(4096, torch.bfloat16), (32_768, torch.bfloat16), (32_768, torch.float32)]
QUICK_CASES = [(512, torch.bfloat16)]

PROVIDERS = {
    "orsd": lambda x, t: token_logprobs(x, t),
    "torch-float": lambda x, t: torch.log_softmax(x.float(), dim=-1).gather(-1, t[:, None]).squeeze(-1),
    "torch-bf16": lambda x, t: torch.log_softmax(x, dim=-1).gather(-1, t[:, None]).squeeze(-1),
}


def make_logits(
    T: int, V: int, dtype: torch.dtype, device: torch.device, *, seed: int = 0, scale: float = 2.0
) -> torch.Tensor:
    """Random [T, V] logits built in row blocks, so no f32 copy of the whole tensor ever exists
    (it would inflate the process's peak RSS before the measurement)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    out = torch.empty(T, V, dtype=dtype, device=device)
    for start in range(0, T, 256):
        stop = min(T, start + 256)
        out[start:stop] = torch.randn(stop - start, V, generator=generator, device=device) * scale
    return out


_inputs: dict = {}


def inputs(T, dtype, device):
    """One case's logits and targets, kept while its providers run (one case in memory at a time)."""
    key = (T, dtype, str(device))
    if key not in _inputs:
        _inputs.clear()
        logits = make_logits(T, V, dtype, device)
        targets = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(1)).to(device)
        _inputs[key] = (logits, targets)
    return _inputs[key]


def cases(device_type):
    """(T, dtype, provider, threads) in run order: every provider of a case back to back."""
    out = []
    for T, dtype in GPU_CASES if device_type == "cuda" else CPU_CASES:
        providers = [p for p in PROVIDERS if p != "torch-bf16" or dtype == torch.bfloat16]
        out += [(T, dtype, p, None) for p in providers]
        if device_type == "cpu" and T == 2048:  # single-thread rates: 2 vCPUs scale poorly
            out += [(T, dtype, p, 1) for p in providers]
    return out


def run_case(op_bench, quick, T, dtype, provider, threads, device):
    if quick and (T, dtype) not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    logits, targets = inputs(T, dtype, device)
    name = str(dtype).removeprefix("torch.")
    op_bench.run(
        lambda: PROVIDERS[provider](logits, targets),
        op="token_logprobs", case=f"T={T} V={V} {name}", provider=provider,
        device=device, elements=T * V, bytes_read=logits.numel() * logits.element_size(), threads=threads,
    )  # fmt: skip


@pytest.mark.parametrize("T, dtype, provider, threads", cases("cpu"))
def test_token_logprobs_cpu(op_bench, quick, T, dtype, provider, threads):
    run_case(op_bench, quick, T, dtype, provider, threads, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("T, dtype, provider, threads", cases("cuda"))
def test_token_logprobs_cuda(op_bench, quick, T, dtype, provider, threads):
    run_case(op_bench, quick, T, dtype, provider, threads, torch.device("cuda"))
