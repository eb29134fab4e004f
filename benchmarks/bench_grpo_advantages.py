"""grpo_advantages vs the plain-torch reference (index_add_ group statistics in f64), same run.
N trajectories in groups of 8 (the paper's group size)."""

from __future__ import annotations

import pytest
import torch

from orsd.ops import grpo_advantages, reference

CASES = [4096, 65_536]
QUICK_CASES = [4096]
PROVIDERS = {"orsd": grpo_advantages, "torch": reference.grpo_advantages}


def run_case(op_bench, quick, n, provider, device, threads=None):
    if quick and n not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (n,), generator=g).float().to(device)
    group_ids = (torch.arange(n) // 8).to(device)
    op_bench.run(
        lambda: PROVIDERS[provider](rewards, group_ids),
        op="grpo_advantages",
        case=f"N={n} groups of 8",
        provider=provider,
        device=device,
        threads=threads,
    )


@pytest.mark.parametrize(
    "n, provider, threads", [(n, p, t) for n in CASES for t in (None, 1) for p in PROVIDERS]
)
def test_grpo_advantages_cpu(op_bench, quick, n, provider, threads):
    run_case(op_bench, quick, n, provider, torch.device("cpu"), threads)


@pytest.mark.gpu
@pytest.mark.parametrize("n, provider", [(n, p) for n in CASES for p in PROVIDERS])
def test_grpo_advantages_cuda(op_bench, quick, n, provider):
    run_case(op_bench, quick, n, provider, torch.device("cuda"))
