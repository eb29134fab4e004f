"""shape_advantages vs the plain-torch reference (gathers + torch.where), same run. L positions of
a plain packing, 60% of them response tokens."""

from __future__ import annotations

import pytest
import torch

from orsd.ops import reference, shape_advantages

CASES = [262_144, 4_194_304]
QUICK_CASES = [262_144]
PROVIDERS = {"orsd": shape_advantages, "torch": reference.shape_advantages}


def make_inputs(length, device):
    g = torch.Generator().manual_seed(0)
    num_seqs = max(1, length // 2048)
    lp_plain = -torch.rand(length, generator=g) * 5
    lp_rubric = -torch.rand(length + 300 * num_seqs, generator=g) * 5
    pos_map = torch.sort(torch.randperm(lp_rubric.shape[0], generator=g)[:length]).values
    response_mask = torch.rand(length, generator=g) < 0.6
    seq_ids = torch.arange(length) // 2048
    seq_adv = torch.randn(num_seqs, generator=g)
    eligible = torch.rand(num_seqs, generator=g) < 0.8
    return [t.to(device) for t in (lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv)] + [
        0.01,
        eligible.to(device),
    ]


def run_case(op_bench, quick, length, provider, device, threads=None):
    if quick and length not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    args = make_inputs(length, device)
    op_bench.run(
        lambda: PROVIDERS[provider](*args),
        op="shape_advantages",
        case=f"L={length}",
        provider=provider,
        device=device,
        elements=length,
        threads=threads,
    )


@pytest.mark.parametrize(
    "length, provider, threads", [(length, p, t) for length in CASES for t in (None, 1) for p in PROVIDERS]
)
def test_shape_advantages_cpu(op_bench, quick, length, provider, threads):
    run_case(op_bench, quick, length, provider, torch.device("cpu"), threads)


@pytest.mark.gpu
@pytest.mark.parametrize("length, provider", [(n, p) for n in CASES for p in PROVIDERS])
def test_shape_advantages_cuda(op_bench, quick, length, provider):
    run_case(op_bench, quick, length, provider, torch.device("cuda"))
