"""Driver that runs lm_head_logprobs' CUDA kernels (forward, backward, every dtype, each CUDA GEMM:
cuBLAS and our own) on awkward shapes for compute-sanitizer (benchmarks/gpu_check.sh): a vocabulary
block edge (4,096), H not a multiple of 8 (the GEMM's element-wise loads), a misaligned hidden
(vector loads off), T = 1, V = 1, and several row segments per vocabulary block (V = 9,000).
Exits non-zero if a value or gradient disagrees with the f64 full-logits reference."""

from __future__ import annotations

import argparse
import importlib
import sys

import torch

import orsd.ops as ops

lm_head = importlib.import_module("orsd.ops.lm_head_logprobs")  # the module (the package exports the function)

TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


def reference(hidden, weight, targets, temperature, softcap):
    hidden64 = hidden.detach().double().requires_grad_()
    weight64 = weight.detach().double().requires_grad_()
    logits = hidden64 @ weight64.T
    if softcap > 0:
        logits = torch.tanh(logits / softcap) * softcap
    log_p = torch.log_softmax(logits / temperature, dim=-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), torch.special.entr(log_p.exp()).sum(-1), hidden64, weight64


def check(name, T, H, V, dtype, device, g, *, misaligned=False, temperature=0.9, softcap=0.0):
    storage = torch.randn(T * H + 1, generator=g, device=device).to(dtype)
    hidden = (storage[1:] if misaligned else storage[: T * H]).view(T, H).requires_grad_()
    weight = (torch.randn(V, H, generator=g, device=device) / H**0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (T,), generator=g, device=device)
    lp, entropy = ops.lm_head_logprobs(hidden, weight, targets, temperature=temperature, softcap=softcap,
                                       return_entropy=True)  # fmt: skip
    ref_lp, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets, temperature, softcap)
    torch.testing.assert_close(lp.double(), ref_lp.detach(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_entropy.detach(), atol=1e-4, rtol=1e-5)
    (lp.sum() + 0.5 * entropy.sum()).backward()
    (ref_lp.sum() + 0.5 * ref_entropy.sum()).backward()
    tol = TOLERANCE[dtype]
    for got, want in ((hidden.grad, hidden64.grad), (weight.grad, weight64.grad)):
        scale = max(want.abs().max().item(), 0.1)
        torch.testing.assert_close(got.double(), want, atol=tol * scale, rtol=tol)
    print(f"ok lm_head_logprobs {name} {dtype} T={T} H={H} V={V}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gemm", choices=(*lm_head.CUDA_GEMMS, "all"), default="all",
                        help="the CUDA GEMM(s) to run the shapes with (default: each in turn)")  # fmt: skip
    gemms = lm_head.CUDA_GEMMS if (gemm := parser.parse_args(argv).gemm) == "all" else (gemm,)
    assert ops.backend()["cuda"] == "native", ops.backend()
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    for gemm in gemms:
        lm_head.set_cuda_gemm(gemm)
        assert lm_head.cuda_gemm() == gemm, f"the {gemm} GEMM is not usable here"
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            check(f"{gemm} tiny", 1, 8, 1, dtype, device, g)
            check(f"{gemm} block edge", 33, 64, 4097, dtype, device, g)
            check(f"{gemm} odd H", 70, 33, 1031, dtype, device, g, softcap=5.0)
            check(f"{gemm} misaligned hidden", 9, 64, 300, dtype, device, g, misaligned=True)
            check(f"{gemm} row segments", 40, 64, 9000, dtype, device, g)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
