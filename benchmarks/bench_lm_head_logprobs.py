"""lm_head_logprobs (hidden, LM head -> log-probs and entropies, forward + backward, never T x V)
against the two torch ways in the same run, one training step each (forward, then lp.sum()
backward into hidden and the head; the entropy is a metric, as in orsd.train.replay):

  torch_chunked  what orsd.train.forward.train_logprobs does today: token chunks of 1,024 under
                 torch.utils.checkpoint, logits = hidden @ W.T (bf16) -> .float() -> log_softmax;
  torch_full     the plain way: all T x V logits at once, same math;
  orsd_own       the op with our own GEMM kernels forced, next to the `orsd` row's default choice:
                 on CPU (with AVX512-BF16) our bf16 kernel vs MKL's (the default with AMX); on
                 CUDA our WMMA kernel vs cuBLAS (the default, docs/ops.md);
  cce, cce_exact (CUDA, when the `cut-cross-entropy` package is importable) Apple's Cut
                 Cross-Entropy, linear_cross_entropy(reduction="none") = -lp, with its default
                 gradient filter (filter_eps="high": skips tiles of tiny probabilities) and
                 without it (exact); it computes no entropy.

V = 151,936 (Qwen3's vocabulary), bf16 (fp32 where model.autocast=auto would keep fp32: `bench_dtype`). Every
device also runs the quick case T = 512, H = 256 (the only one under --orsd-quick). GPU: H = 2,048
and T in {2,048, 16,384, 32,768}. CPU (2 cores): T in the same set, with H cut so that each case
is the same 5.1 TFLOP as T = 2,048 at H = 2,048 (H = 256 at T = 16,384, H = 128 at T = 32,768):
T x V, which sets the torch paths' memory, is kept; torch_full is left out where its logits alone would not fit in RAM.

Peak extra memory is benchmarks/conftest.py's (the rise of the process's peak RSS over the RSS
before the call, measured on its own call). A step first drops the previous step's gradients, as
zero_grad(set_to_none=True) does, so the rise is what the step needs beyond one set of gradients
(those every path must produce; on CPU the head's gradient is mmap'd, so freeing the old one and
allocating the new one cancel). It is also recorded as a fraction of one T x V f32 tensor. The orsd
row (run last in its case) records its time and memory relative to the two torch rows of the run.
"""

from __future__ import annotations

import functools
import importlib
import os

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from orsd import _C
from orsd.ops import lm_head_logprobs
from orsd.train.precision import choose_autocast

lm_head = importlib.import_module("orsd.ops.lm_head_logprobs")  # the module (the package exports the function)
try:
    from cut_cross_entropy import linear_cross_entropy
except ImportError:  # an optional anchor: its rows are left out
    linear_cross_entropy = None

V = 151_936
CHUNK_TOKENS = 1024  # orsd.train.forward.train_logprobs' default
QUICK_CASES = [(512, 256)]  # (T, H): --orsd-quick runs only this one
CPU_CASES = QUICK_CASES + [(2048, 2048), (16_384, 256), (32_768, 128)]
GPU_CASES = QUICK_CASES + [(2048, 2048), (16_384, 2048), (32_768, 2048)]
CPU_RAM_LIMIT_FRACTION = 0.6  # torch_full needs ~5 copies of T x V f32; skip it beyond this share
PROVIDERS = ("torch_chunked", "torch_full", "cce", "cce_exact", "orsd_own", "orsd")  # anchors first: orsd reads them


def _chunk_logprobs(hidden, weight, targets):
    logits = (hidden @ weight.T).float()
    log_p = torch.log_softmax(logits, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return log_p.gather(-1, targets[:, None]).squeeze(-1), entropy


def torch_chunked(hidden, weight, targets):
    lps, entropies = [], []
    for start in range(0, hidden.shape[0], CHUNK_TOKENS):
        end = start + CHUNK_TOKENS
        lp, entropy = checkpoint(_chunk_logprobs, hidden[start:end], weight, targets[start:end], use_reentrant=False)
        lps.append(lp)
        entropies.append(entropy.detach())
    return torch.cat(lps), torch.cat(entropies)


def torch_full(hidden, weight, targets):
    lp, entropy = _chunk_logprobs(hidden, weight, targets)
    return lp, entropy.detach()


def orsd(hidden, weight, targets):
    lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
    return lp, entropy.detach()


def orsd_own(hidden, weight, targets):
    get, choose = ((lm_head.cuda_gemm, lm_head.set_cuda_gemm) if hidden.is_cuda
                   else (_C.lm_head_gemm, _C.set_lm_head_gemm))  # fmt: skip
    previous = get()
    choose("own")
    try:
        return orsd(hidden, weight, targets)
    finally:
        choose(previous)


def cce(hidden, weight, targets):
    return -linear_cross_entropy(hidden, weight, targets, reduction="none"), None


def cce_exact(hidden, weight, targets):
    return -linear_cross_entropy(hidden, weight, targets, reduction="none", filter_eps=None), None


STEPS = {"torch_chunked": torch_chunked, "torch_full": torch_full, "cce": cce, "cce_exact": cce_exact,
         "orsd_own": orsd_own, "orsd": orsd}  # fmt: skip

_inputs: dict = {}
_anchors: dict = {}


@functools.lru_cache(maxsize=None)
def bench_dtype(device) -> torch.dtype:
    """The dtype a run on `device` computes in: bf16 where model.autocast=auto chooses it (CUDA with
    bf16; a CPU that runs it natively with oneDNN uncapped, or where the probe measures it faster),
    fp32 elsewhere. Emulated bf16 matmuls made the quick case alone take over 10 minutes on the
    AVX2-only EPYC of 2026-12-04; a Xeon with AMX but ONEDNN_MAX_CPU_ISA=AVX2 emulates them too.
    The probe runs at SmolLM2-135M's MLP shape, as the default run's does."""
    chosen = choose_autocast("auto", device, torch.float32, hidden_size=576, intermediate_size=1536)
    return torch.bfloat16 if chosen.autocast == "bfloat16" else torch.float32


def inputs(T, H, dtype, device):
    key = (T, H, dtype, str(device))
    if key not in _inputs:
        _inputs.clear()
        g = torch.Generator(device=device).manual_seed(0)
        weight = torch.empty(V, H, dtype=dtype, device=device)
        for start in range(0, V, 8192):  # built in blocks: no f32 copy of the whole head
            rows = min(V, start + 8192) - start
            weight[start : start + rows] = torch.randn(rows, H, generator=g, device=device) * (3 / H**0.5)
        hidden = torch.randn(T, H, generator=g, device=device).to(dtype)
        targets = torch.randint(0, V, (T,), generator=g, device=device)
        _inputs[key] = (hidden.requires_grad_(), weight.requires_grad_(), targets)
    return _inputs[key]


def fits_in_ram(T) -> bool:
    """Whether torch_full's ~5 T x V f32 tensors fit in a safe share of MemAvailable (free plus
    reclaimable cache; other jobs share the machine, and an OOM kill could hit one of them)."""
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return True
    return 5 * T * V * 4 < CPU_RAM_LIMIT_FRACTION * available


def cases(device_type):
    """orsd_own only where our kernel can run (on CPU, AVX512-BF16), cce only on CUDA with the
    package: a provider that does not exist here is left out rather than reported as skipped."""
    shapes = GPU_CASES if device_type == "cuda" else CPU_CASES
    own = device_type == "cuda" or "own" in _C.lm_head_gemms_available()
    have_cce = device_type == "cuda" and linear_cross_entropy is not None
    providers = [p for p in PROVIDERS if (p != "orsd_own" or own) and (not p.startswith("cce") or have_cce)]
    return [(T, H, p) for T, H in shapes for p in providers]


def run_case(op_bench, quick, T, H, provider, device):
    if quick and (T, H) not in QUICK_CASES:
        pytest.skip("--orsd-quick runs only the smallest case")
    if provider == "torch_full" and device.type == "cpu" and not fits_in_ram(T):
        pytest.skip(f"torch_full at T={T} needs ~{5 * T * V * 4 / 2**30:.0f} GiB of T x V tensors")
    dtype = bench_dtype(device)
    hidden, weight, targets = inputs(T, H, dtype, device)
    step_fn = STEPS[provider]

    def step():
        hidden.grad = weight.grad = None
        lp, _ = step_fn(hidden, weight, targets)
        lp.sum().backward()

    case = f"T={T} H={H} V={V} {'bf16' if dtype == torch.bfloat16 else 'f32'} fwd+bwd"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    try:
        op_bench.run(step, op="lm_head_logprobs", case=case, provider=provider, device=device, elements=T * V)
    except torch.cuda.OutOfMemoryError:
        hidden.grad = weight.grad = None
        torch.cuda.empty_cache()
        pytest.skip(f"{provider} ran out of GPU memory at T={T}")
    finally:
        hidden.grad = weight.grad = None

    info = op_bench.benchmark.extra_info
    peak = info.get("peak_extra_mib")
    info.update(T=T, H=H, V=V, load_average_1min=load, gradient_mib=(T * H + V * H) * dtype.itemsize / 2**20)
    if peak is not None:
        info["peak_extra_fraction_of_TxV_f32"] = peak * 2**20 / (T * V * 4)
    median_ms = op_bench.benchmark.stats.stats.median * 1e3
    _anchors[(case, provider)] = (median_ms, peak)
    if provider == "orsd":
        info["gemm"] = _C.lm_head_gemm() if device.type == "cpu" else lm_head.cuda_gemm()
        if device.type == "cuda":  # 8 T H V flops: forward, the backward's recompute and two GEMMs
            info["tflops"] = 8 * T * H * V / (median_ms * 1e-3) / 1e12
        for anchor in ("torch_chunked", "torch_full", "cce", "cce_exact", "orsd_own"):
            if (case, anchor) in _anchors:
                anchor_ms, anchor_peak = _anchors[(case, anchor)]
                info[f"time_vs_{anchor}"] = median_ms / anchor_ms
                if anchor_peak and peak is not None:
                    info[f"peak_extra_vs_{anchor}"] = peak / anchor_peak


@pytest.mark.parametrize("T, H, provider", cases("cpu"))
def test_lm_head_logprobs_cpu(op_bench, quick, T, H, provider):
    run_case(op_bench, quick, T, H, provider, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("T, H, provider", cases("cuda"))
def test_lm_head_logprobs_cuda(op_bench, quick, T, H, provider):
    run_case(op_bench, quick, T, H, provider, torch.device("cuda"))
