"""microbatch_weights vs the plain-torch reference (index_add_ counts, gather, divide), same run.
L positions split into 16 micro-batches (D*G = 16)."""

from __future__ import annotations

import pytest
import torch

from orsd.ops import microbatch_weights, reference

CASES = [262_144, 4_194_304]
QUICK_CASES = [262_144]
PROVIDERS = {"orsd": microbatch_weights, "torch": reference.microbatch_weights}


def run_case(op_bench, quick, length, provider, device, threads=None):
    if quick and length not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(length, generator=g) < 0.6).to(device)
    microbatch_ids = (torch.arange(length) * 16 // length).to(device)
    op_bench.run(
        lambda: PROVIDERS[provider](mask, microbatch_ids, 16),
        op="microbatch_weights", case=f"L={length} 16 micro-batches", provider=provider, device=device, elements=length, threads=threads,
    )  # fmt: skip


@pytest.mark.parametrize(
    "length, provider, threads", [(length, p, t) for length in CASES for t in (None, 1) for p in PROVIDERS]
)
def test_microbatch_weights_cpu(op_bench, quick, length, provider, threads):
    run_case(op_bench, quick, length, provider, torch.device("cpu"), threads)


@pytest.mark.gpu
@pytest.mark.parametrize("length, provider", [(n, p) for n in CASES for p in PROVIDERS])
def test_microbatch_weights_cuda(op_bench, quick, length, provider):
    run_case(op_bench, quick, length, provider, torch.device("cuda"))
