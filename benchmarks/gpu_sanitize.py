"""Small driver that runs every CUDA kernel of orsd.ops on awkward shapes, for compute-sanitizer
(benchmarks/gpu_check.sh). Exits non-zero if a result disagrees with the torch reference."""

from __future__ import annotations

import sys

import torch

import orsd.ops as ops
from orsd.ops import reference


def check(name, got, want, atol=1e-3):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        if g.is_floating_point():
            torch.testing.assert_close(g, w, atol=atol, rtol=1e-5, equal_nan=True)
        else:
            assert torch.equal(g, w), name
    print(f"ok {name}")


def main() -> int:
    assert ops.backend()["cuda"] == "native", ops.backend()
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for T, V in ((1, 1), (3, 7), (5, 1031), (4, 70_001)):
            # One extra row and a one-element offset: row starts are not 16-byte aligned.
            storage = torch.randn(T * V + 1, generator=g, device=device).to(dtype) * 4
            logits = storage[1:].view(T, V)
            targets = torch.randint(0, V, (T,), generator=g, device=device)
            mask = torch.rand(T, generator=g, device=device) < 0.7
            targets = torch.where(mask, targets, -100)
            check(
                f"token_logprobs {dtype} T={T} V={V}",
                ops.token_logprobs(logits, targets, mask, 0.8, return_lse=True),
                reference.token_logprobs(logits, targets, mask, 0.8, return_lse=True),
            )
        hidden = torch.randn(9, 24, generator=g, device=device).to(dtype)
        weight = (torch.randn(1001, 24, generator=g, device=device) / 5).to(dtype)
        targets = torch.randint(0, 1001, (9,), generator=g, device=device)
        for chunk_size in (7, 1000, None):
            check(
                f"fused_token_logprobs {dtype} chunk={chunk_size}",
                ops.fused_token_logprobs(hidden, weight, targets, None, 1.1, chunk_size),
                reference.fused_token_logprobs(hidden, weight, targets, None, 1.1),
            )
    rewards = torch.randint(0, 3, (1000,), generator=g, device=device).float()
    group_ids = torch.randint(0, 70, (1000,), generator=g, device=device)
    check(
        "grpo_advantages",
        ops.grpo_advantages(rewards, group_ids),
        reference.grpo_advantages(rewards, group_ids),
        atol=1e-6,
    )
    ids = torch.randint(0, 100, (40,), device=device, dtype=torch.int32)
    cu = torch.tensor([0, 0, 13, 13, 40], device=device)
    args = (ids, cu, torch.tensor([0, 13, 0, 27], device=device), torch.arange(5, device=device, dtype=torch.int32),
            torch.tensor([0, 2, 5], device=device), torch.tensor([1, 0, -1, 1], device=device))  # fmt: skip
    check("splice_rubric", ops.splice_rubric(*args), reference.splice_rubric(*args))
    L = 3001
    lp_plain = torch.randn(L, generator=g, device=device)
    lp_rubric = torch.randn(L + 5, generator=g, device=device)
    lp_rubric[::97] = float("nan")
    shape_args = (lp_plain, lp_rubric, torch.randint(0, L + 5, (L,), generator=g, device=device),
                  torch.rand(L, generator=g, device=device) < 0.5, torch.randint(0, 11, (L,), generator=g, device=device),
                  torch.randn(11, generator=g, device=device), 0.01, torch.rand(11, generator=g, device=device) < 0.5)  # fmt: skip
    check(
        "shape_advantages", ops.shape_advantages(*shape_args), reference.shape_advantages(*shape_args), atol=0
    )
    mask = torch.rand(L, generator=g, device=device) < 0.5
    mb = torch.randint(0, 6, (L,), generator=g, device=device)
    check(
        "microbatch_weights",
        ops.microbatch_weights(mask, mb, 8),
        reference.microbatch_weights(mask, mb, 8),
        atol=0,
    )
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
