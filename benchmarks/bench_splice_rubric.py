"""splice_rubric vs the plain-torch way (a loop over sequences with torch.cat, i.e. the reference),
same run. S sequences of ~1,500 context tokens, a 300-token rubric spliced into each."""

from __future__ import annotations

import pytest
import torch

from orsd.ops import reference, splice_rubric

CASES = [64, 512]
QUICK_CASES = [64]
PROVIDERS = {"orsd": splice_rubric, "torch": reference.splice_rubric}


def make_batch(num_seqs, device):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1000, 2000, (num_seqs,), generator=g)
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    ids = torch.randint(0, 151_936, (int(cu_seqlens[-1]),), generator=g)
    slots = (lengths // 3).to(torch.int64)
    num_rubrics = max(1, num_seqs // 8)  # one bundle per group of 8 trajectories
    rubric_cu = torch.arange(num_rubrics + 1, dtype=torch.int64) * 300
    rubric_ids = torch.randint(0, 151_936, (num_rubrics * 300,), generator=g)
    rubric_index = torch.arange(num_seqs) // 8
    rubric_index[::5] = -1  # some groups without a selected rubric
    tensors = (ids, cu_seqlens, slots, rubric_ids, rubric_cu, rubric_index)
    return [t.to(device) for t in tensors]


def run_case(op_bench, quick, num_seqs, provider, device, threads=None):
    if quick and num_seqs not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    batch = make_batch(num_seqs, device)
    op_bench.run(
        lambda: PROVIDERS[provider](*batch),
        op="splice_rubric",
        case=f"S={num_seqs} L={batch[0].shape[0]}",
        provider=provider,
        device=device,
        threads=threads,
    )


@pytest.mark.parametrize(
    "num_seqs, provider, threads",
    [(num_seqs, p, t) for num_seqs in CASES for t in (None, 1) for p in PROVIDERS],
)
def test_splice_rubric_cpu(op_bench, quick, num_seqs, provider, threads):
    run_case(op_bench, quick, num_seqs, provider, torch.device("cpu"), threads)


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs, provider", [(n, p) for n in CASES for p in PROVIDERS])
def test_splice_rubric_cuda(op_bench, quick, num_seqs, provider):
    run_case(op_bench, quick, num_seqs, provider, torch.device("cuda"))
