"""lm_head_logprobs: values and gradients (w.r.t. hidden and weight, through lp and entropy) equal
torch autograd on the full-logits reference below, on awkward shapes, on every CPU instruction set
and with every bf16 GEMM the CPU offers (our kernel runs on the avx512 set when the CPU has
AVX512-BF16, MKL everywhere; the module runs once per GEMM), without a T x V allocation,
reproducibly; bad input raises ValueError naming the argument."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch
from _memory import peak_rss_growth_bytes
from hypothesis import given
from hypothesis import strategies as st

import orsd.ops
from orsd import _C
from orsd.ops import fused_token_logprobs, lm_head_logprobs

op_module = importlib.import_module("orsd.ops.lm_head_logprobs")
backend_module = importlib.import_module("orsd.ops._backend")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True, params=_C.lm_head_gemms_available())
def gemm(request):
    """Every test here runs once per bf16 GEMM this CPU offers (`own` only with AVX512-BF16)."""
    previous = _C.lm_head_gemm()
    _C.set_lm_head_gemm(request.param)
    yield request.param
    _C.set_lm_head_gemm(previous)


def reference(hidden, weight, targets, temperature=1.0, softcap=0.0, logit_scale=1.0):
    """The spec: full f64 logits of the given values, log_softmax, the target's entry, and the
    entropy -sum p log p (entr(0) = 0). Returns (lp, entropy, hidden_leaf, weight_leaf)."""
    hidden64 = hidden.detach().double().requires_grad_()
    weight64 = weight.detach().double().requires_grad_()
    logits = hidden64 @ weight64.T
    if softcap > 0:
        logits = torch.tanh(logits / softcap) * softcap
    log_p = torch.log_softmax(logits * logit_scale / temperature, dim=-1)
    lp = log_p.gather(-1, targets[:, None]).squeeze(-1)
    entropy = torch.special.entr(log_p.exp()).sum(-1)
    return lp, entropy, hidden64, weight64


def make_inputs(T, H, V, dtype, device, *, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * scale / max(H, 1) ** 0.5 * 3).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    return hidden.to(device).requires_grad_(), weight.to(device).requires_grad_(), targets.to(device)


# Gradient tolerance relative to the largest reference gradient: f32 is exact up to summation
# order; 16-bit inputs round dL/dz and the result to the input dtype (as torch autograd does).
GRAD_TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 3e-3}


def assert_close_scaled(got, want, dtype, what, floor=0.1):
    # The floor covers gradients that vanish exactly (e.g. V = 1: p = 1 at the target), where
    # rounding leaves ~1e-7 of |dL/dy| x |other operand| x logit_scale / T, the gradient's natural
    # scale: 0.1 of it (a constant 0.1 assumed unit inputs, and Hypothesis found T=12, H=1, V=1 at
    # temperature 0.7 on an Intel Xeon off by 2.8e-6 where 2e-6 was allowed, with |W| up to ~6).
    scale = max(want.abs().max().item() if want.numel() else 0.0, floor)
    tol = GRAD_TOLERANCE[dtype]
    torch.testing.assert_close(
        got.double().cpu(), want.cpu(), atol=tol * scale, rtol=tol, msg=lambda m: f"{what}: {m}"
    )


def check_against_reference(hidden, weight, targets, *, temperature=1.0, softcap=0.0, logit_scale=1.0, seed=1):
    """Forward values and both gradients through a random mix of lp and entropy."""
    lp, entropy = lm_head_logprobs(
        hidden, weight, targets, temperature=temperature, softcap=softcap, logit_scale=logit_scale,
        return_entropy=True,
    )  # fmt: skip
    ref_lp, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets, temperature, softcap, logit_scale)
    assert lp.dtype == entropy.dtype == torch.float32 and lp.shape == entropy.shape == (hidden.shape[0],)
    torch.testing.assert_close(lp.double().cpu(), ref_lp.detach().cpu(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(entropy.double().cpu(), ref_entropy.detach().cpu(), atol=1e-4, rtol=1e-5)

    g = torch.Generator().manual_seed(seed)
    grad_lp = torch.randn(lp.shape, generator=g).to(lp.device)
    grad_entropy = torch.randn(lp.shape, generator=g).to(lp.device)
    hidden.grad = weight.grad = None
    (lp * grad_lp + entropy * grad_entropy).sum().backward()
    (ref_lp * grad_lp.double() + ref_entropy * grad_entropy.double()).sum().backward()
    assert hidden.grad.dtype == hidden.dtype and weight.grad.dtype == weight.dtype
    rate = max(grad_lp.abs().max().item(), grad_entropy.abs().max().item(), 1.0) if lp.numel() else 1.0
    rate *= logit_scale / temperature
    assert_close_scaled(hidden.grad, hidden64.grad, hidden.dtype, "grad_hidden", 0.1 * rate * largest(weight))
    assert_close_scaled(weight.grad, weight64.grad, weight.dtype, "grad_weight", 0.1 * rate * largest(hidden))


def largest(x):
    return max(x.detach().abs().max().item() if x.numel() else 0.0, 1.0)


# ---- values and gradients ----------------------------------------------------------------------

SHAPES = [
    (1, 8, 5),  # one token, tiny vocabulary
    (37, 20, 3001),  # V not a multiple of the vocabulary block (1024)
    (97, 33, 2049),  # odd H (MKL path for bf16 too), T just past one token block (96)
    (200, 64, 1025),  # several token blocks, one vocabulary row past a block
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("T, H, V", SHAPES)
def test_values_and_gradients_match_reference(device, T, H, V, dtype):
    hidden, weight, targets = make_inputs(T, H, V, dtype, device)
    check_against_reference(hidden, weight, targets)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    "temperature, softcap, logit_scale", [(0.6, 0.0, 1.0), (1.3, 0.0, 1.0), (1.0, 5.0, 1.0), (0.8, 3.0, 0.25)]
)
def test_temperature_softcap_and_logit_scale(device, dtype, temperature, softcap, logit_scale):
    hidden, weight, targets = make_inputs(50, 32, 1500, dtype, device, scale=4.0)
    check_against_reference(hidden, weight, targets, temperature=temperature, softcap=softcap, logit_scale=logit_scale)


@given(
    T=st.integers(0, 40),
    H=st.integers(1, 40),
    V=st.integers(1, 1200),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.7, 1.6]),
    softcap=st.sampled_from([0.0, 2.0, 30.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_shapes_match_reference(T, H, V, dtype, temperature, softcap, seed):
    hidden, weight, targets = make_inputs(T, H, V, dtype, "cpu", seed=seed)
    check_against_reference(hidden, weight, targets, temperature=temperature, softcap=softcap, seed=seed)


def test_zero_tokens(device):
    hidden, weight, targets = make_inputs(0, 8, 50, torch.bfloat16, device)
    lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
    assert lp.shape == entropy.shape == (0,)
    (lp.sum() + entropy.sum()).backward()
    assert hidden.grad.shape == (0, 8)
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_equals_fused_token_logprobs_forward(device):
    hidden, weight, targets = make_inputs(45, 64, 3000, torch.bfloat16, device)
    with torch.no_grad():
        lp = lm_head_logprobs(hidden, weight, targets, temperature=0.9)
        expected = fused_token_logprobs(hidden, weight, targets, temperature=0.9)
    torch.testing.assert_close(lp, expected, atol=2e-5, rtol=1e-5)


def test_lp_only_and_entropy_only_gradients(device):
    hidden, weight, targets = make_inputs(30, 16, 700, torch.float32, device)
    lp = lm_head_logprobs(hidden, weight, targets, temperature=0.8)
    lp.sum().backward()
    ref_lp, _, hidden64, weight64 = reference(hidden, weight, targets, 0.8)
    ref_lp.sum().backward()
    assert_close_scaled(hidden.grad, hidden64.grad, torch.float32, "grad_hidden (lp only)")
    assert_close_scaled(weight.grad, weight64.grad, torch.float32, "grad_weight (lp only)")

    hidden.grad = weight.grad = None
    _, entropy = lm_head_logprobs(hidden, weight, targets, temperature=0.8, return_entropy=True)
    entropy.sum().backward()  # lp unused: its gradient is None, the kernel reads it as zeros
    _, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets, 0.8)
    ref_entropy.sum().backward()
    assert_close_scaled(hidden.grad, hidden64.grad, torch.float32, "grad_hidden (entropy only)")
    assert_close_scaled(weight.grad, weight64.grad, torch.float32, "grad_weight (entropy only)")


def test_frozen_head_or_frozen_hidden(device):
    hidden, weight, targets = make_inputs(20, 16, 300, torch.bfloat16, device)
    weight.requires_grad_(False)
    lm_head_logprobs(hidden, weight, targets).sum().backward()
    assert hidden.grad is not None and weight.grad is None
    ref_lp, _, hidden64, _ = reference(hidden, weight, targets)
    ref_lp.sum().backward()
    assert_close_scaled(hidden.grad, hidden64.grad, torch.bfloat16, "grad_hidden (frozen head)")

    hidden = hidden.detach()
    weight.requires_grad_(True)
    lm_head_logprobs(hidden, weight, targets).sum().backward()
    ref_lp, _, _, weight64 = reference(hidden, weight, targets)
    ref_lp.sum().backward()
    assert_close_scaled(weight.grad, weight64.grad, torch.bfloat16, "grad_weight (frozen hidden)")


def test_no_grad_forward_saves_nothing_and_matches(device):
    hidden, weight, targets = make_inputs(10, 16, 300, torch.float32, device)
    with torch.no_grad():
        lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
    assert not lp.requires_grad and not entropy.requires_grad
    ref_lp, ref_entropy, _, _ = reference(hidden, weight, targets)
    torch.testing.assert_close(lp.double().cpu(), ref_lp.detach().cpu(), atol=1e-4, rtol=1e-5)


def test_bf16_gradients_at_least_as_accurate_as_torch_autograd(device):
    # The plain way in a bf16 model: autograd through bf16 leaves with f32 logits.
    hidden, weight, targets = make_inputs(64, 48, 2000, torch.bfloat16, device, scale=3.0)
    lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
    (lp.sum() + 0.3 * entropy.sum()).backward()
    ref_lp, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets)
    (ref_lp.sum() + 0.3 * ref_entropy.sum()).backward()

    plain_hidden, plain_weight = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    log_p = torch.log_softmax((plain_hidden @ plain_weight.T).float(), dim=-1)
    plain_lp = log_p.gather(-1, targets[:, None]).squeeze(-1)
    (plain_lp.sum() + 0.3 * torch.special.entr(log_p.exp()).sum()).backward()

    for ours, plain, exact in ((hidden.grad, plain_hidden.grad, hidden64.grad), (weight.grad, plain_weight.grad, weight64.grad)):
        our_error = (ours.double() - exact).abs().max().item()
        plain_error = (plain.double() - exact).abs().max().item()
        assert our_error <= 1.25 * plain_error, (our_error, plain_error)


def test_all_negative_and_huge_logits(device):
    hidden, weight, targets = make_inputs(8, 4, 500, torch.float32, device)
    with torch.no_grad():
        hidden[:, 0] = 1.0
    for bias in (-300.0, 3000.0):
        with torch.no_grad():
            weight[:, 0] = bias  # every logit about `bias`: all negative, or huge
        lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
        ref_lp, ref_entropy, _, _ = reference(hidden, weight, targets)
        torch.testing.assert_close(lp.double().cpu(), ref_lp.detach().cpu(), atol=1e-3, rtol=1e-5)
        torch.testing.assert_close(entropy.double().cpu(), ref_entropy.detach().cpu(), atol=1e-3, rtol=1e-5)


def test_nan_row_gives_nan_only_there(device):
    hidden, weight, targets = make_inputs(5, 8, 100, torch.float32, device)
    with torch.no_grad():
        hidden[2, 3] = float("nan")
    lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
    assert torch.isnan(lp[2]) and torch.isnan(entropy[2])
    assert torch.isfinite(lp[[0, 1, 3, 4]]).all() and torch.isfinite(entropy[[0, 1, 3, 4]]).all()
    lp.sum().backward()
    assert torch.isnan(hidden.grad[2]).all() and torch.isfinite(hidden.grad[[0, 1, 3, 4]]).all()


# ---- CPU specifics -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_bitwise_reproducible_and_independent_of_thread_count(cpu_isa, dtype):
    hidden, weight, targets = make_inputs(150, 64, 2500, dtype, "cpu")

    def run(threads):
        saved = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            hidden.grad = weight.grad = None
            lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
            (lp.sum() - entropy.sum()).backward()
            return lp, entropy, hidden.grad.clone(), weight.grad.clone()
        finally:
            torch.set_num_threads(saved)

    first = run(2)
    for a, b in zip(first, run(2)):
        assert torch.equal(a, b)
    for a, b in zip(first, run(1)):
        if dtype == torch.float32:
            # f32 GEMMs are MKL's sgemm, whose optimized kernels on an Intel Xeon (AMX, 2026-12-01)
            # gave grad_hidden 1-ulp apart on 1 and 2 threads (equal under MKL_CBWR=COMPATIBLE; the
            # AMD EPYC box matched bitwise): our loops fix the order, MKL's inside a call may vary
            # (a summation order's rounding: a few ulps of the largest element, not of each)
            torch.testing.assert_close(a, b, atol=8 * torch.finfo(torch.float32).eps * a.abs().max().item(), rtol=0)
        else:
            assert torch.equal(a, b)


def test_forward_and_backward_allocate_nothing_of_size_t_by_v():
    hidden, weight, targets = make_inputs(2048, 16, 65_536, torch.bfloat16, "cpu")

    def step():
        lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
        (lp.sum() + entropy.sum()).backward()

    step()  # first-call setup (GEMM lookup, page-in) outside the measurement
    hidden.grad = weight.grad = None
    growth = peak_rss_growth_bytes(step)
    # T x V f32 would be 512 MiB. Ours: dL/dz for one vocabulary block (T x 1024 bf16, 4 MiB),
    # packed hidden and grad_hidden in f32 (well under 1 MiB each here) and the gradients (2 MiB).
    assert growth < 48 * 2**20, f"peak RSS grew by {growth / 2**20:.1f} MiB"


# ---- fallbacks ---------------------------------------------------------------------------------


@pytest.fixture
def without_native(monkeypatch):
    monkeypatch.setattr(backend_module, "_C", None)
    monkeypatch.setattr(backend_module, "_IMPORT_ERROR", ImportError("simulated"))
    monkeypatch.setattr(backend_module, "_warned_reference", False)


def test_missing_extension_falls_back_loudly_and_matches(without_native):
    hidden, weight, targets = make_inputs(1100, 8, 60, torch.float32, "cpu")  # two fallback chunks
    with pytest.warns(RuntimeWarning, match="pure-torch reference"):
        lp, entropy = orsd.ops.lm_head_logprobs(hidden, weight, targets, temperature=0.9, return_entropy=True)
    ref_lp, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets, 0.9)
    torch.testing.assert_close(lp.double(), ref_lp.detach(), atol=1e-4, rtol=1e-5)
    (lp.sum() + entropy.sum()).backward()
    (ref_lp.sum() + ref_entropy.sum()).backward()
    assert_close_scaled(hidden.grad, hidden64.grad, torch.float32, "grad_hidden (fallback)")
    assert_close_scaled(weight.grad, weight64.grad, torch.float32, "grad_weight (fallback)")


def test_extension_built_before_the_op_falls_back_loudly(monkeypatch):
    stale = types.SimpleNamespace(**{
        name: getattr(backend_module._C, name) for name in dir(backend_module._C) if not name.startswith("lm_head")
    })  # fmt: skip
    monkeypatch.setattr(backend_module, "_C", stale)
    monkeypatch.setattr(op_module, "_warned_fallback", False)
    hidden, weight, targets = make_inputs(6, 8, 40, torch.float32, "cpu")
    with pytest.warns(RuntimeWarning, match="rebuild"):
        lp = lm_head_logprobs(hidden, weight, targets)
    torch.testing.assert_close(lp.double(), reference(hidden, weight, targets)[0].detach(), atol=1e-4, rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        lm_head_logprobs(hidden, weight, targets)


def test_validation_still_runs_without_native(without_native):
    hidden, weight, _ = make_inputs(3, 8, 11, torch.float32, "cpu")
    with pytest.raises(ValueError, match="^targets"):
        lm_head_logprobs(hidden, weight, torch.tensor([1, 2, 11]))


# ---- bad input ---------------------------------------------------------------------------------


def good_args():
    hidden, weight, targets = make_inputs(4, 8, 10, torch.float32, "cpu")
    return {"hidden": hidden, "weight": weight, "targets": targets}


@pytest.mark.parametrize(
    "name, bad",
    [
        ("hidden", torch.zeros(4, 8, dtype=torch.float64)),
        ("hidden", torch.zeros(32)),
        ("hidden", torch.zeros(8, 4).T),
        ("hidden", torch.zeros(4, 0)),
        ("hidden", [[0.0] * 8] * 4),
        ("weight", torch.zeros(10, 8, dtype=torch.bfloat16)),  # dtype differs from hidden
        ("weight", torch.zeros(10, 7)),
        ("weight", torch.zeros(0, 8)),
        ("weight", torch.zeros(8, 10).T),
        ("targets", torch.zeros(3, dtype=torch.int64)),
        ("targets", torch.tensor([0, 1, 2, 10])),
        ("targets", torch.tensor([0, -1, 2, 3])),
        ("targets", torch.zeros(4, dtype=torch.int32)),
        ("targets", torch.zeros(4, 1, dtype=torch.int64)),
        ("temperature", 0),
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", True),
        ("softcap", -1.0),
        ("softcap", float("nan")),
        ("softcap", 1e-300),
        ("logit_scale", 0.0),
        ("logit_scale", float("inf")),
        ("logit_scale", 1e39),
        ("return_entropy", 1),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    kwargs = {}
    if name in args:
        args[name] = bad
    else:
        kwargs[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        lm_head_logprobs(**args, **kwargs)


@pytest.mark.gpu
def test_device_mismatch_raises_value_error():
    hidden, weight, targets = make_inputs(4, 8, 10, torch.float32, "cpu")
    with pytest.raises(ValueError, match="^weight"):
        lm_head_logprobs(hidden, weight.detach().cuda(), targets)
    with pytest.raises(ValueError, match="^targets"):
        lm_head_logprobs(hidden, weight, targets.cuda())


# ---- the CUDA GEMM choice (cuBLAS from torch's library, or the module's own kernels) -----------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T, H, V", [(1, 8, 1), (70, 33, 1031), (300, 64, 4097), (1100, 96, 9000)])
def test_both_cuda_gemms_match_the_reference(T, H, V, dtype):
    assert "cublas" in op_module.CUDA_GEMMS and op_module.cuda_gemm() == "cublas", "cuBLAS not found or failed its self-test"
    try:
        for name in op_module.CUDA_GEMMS:
            op_module.set_cuda_gemm(name)
            assert op_module.cuda_gemm() == name
            hidden, weight, targets = make_inputs(T, H, V, dtype, "cuda", scale=2.0)
            check_against_reference(hidden, weight, targets, temperature=0.9, softcap=4.0 if T == 70 else 0.0)
    finally:
        op_module.set_cuda_gemm("cublas")


def test_cuda_gemm_switch_refuses_unknown_names():
    before = op_module.cuda_gemm()
    with pytest.raises(ValueError, match=r"^cuda_gemm: 'mkl' is not one of cublas, own"):
        op_module.set_cuda_gemm("mkl")
    assert op_module.cuda_gemm() == before


def test_cuda_gemm_environment_variable_is_checked_at_import():
    env = {**os.environ, "ORSD_LM_HEAD_CUDA_GEMM": "cutlass"}
    result = subprocess.run([sys.executable, "-c", "import orsd.ops"], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "ValueError: ORSD_LM_HEAD_CUDA_GEMM: 'cutlass' is not one of cublas, own" in result.stderr
    env["ORSD_LM_HEAD_CUDA_GEMM"] = "own"
    code = "import importlib; print(importlib.import_module('orsd.ops.lm_head_logprobs')._cuda_gemm_choice)"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "own"  # fmt: skip


# ---- the bf16 GEMM choice ----------------------------------------------------------------------


def test_gemm_switch_refuses_unknown_names_and_keeps_its_choice():
    before = _C.lm_head_gemm()
    assert "mkl" in _C.lm_head_gemms_available() and before in _C.lm_head_gemms_available()
    with pytest.raises(ValueError, match=r"^lm_head_gemm: 'cublas' is not available .*expected one of: .*mkl"):
        _C.set_lm_head_gemm("cublas")
    assert _C.lm_head_gemm() == before


def test_first_choice_follows_the_cpu_and_the_environment_variable():
    # a fresh process each: the choice is made once, at the first call
    def first_choice(env_value):
        env = {k: v for k, v in os.environ.items() if k != "ORSD_LM_HEAD_GEMM"}
        if env_value is not None:
            env["ORSD_LM_HEAD_GEMM"] = env_value
        code = "from orsd import _C; print(_C.lm_head_gemm())"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    flags = open("/proc/cpuinfo").read().split() if os.path.exists("/proc/cpuinfo") else []
    own = "own" in _C.lm_head_gemms_available()
    assert first_choice(None) == ("own" if own and "amx_bf16" not in flags else "mkl")
    assert first_choice("mkl") == "mkl"
    assert first_choice("own") == ("own" if own else first_choice(None))


@pytest.mark.skipif(len(_C.lm_head_gemms_available()) < 2, reason="one bf16 GEMM on this CPU (no AVX512-BF16)")
def test_both_gemms_agree_to_rounding(cpu_isa, gemm):
    hidden, weight, targets = make_inputs(150, 64, 2500, torch.bfloat16, "cpu", scale=3.0)
    results = {}
    for name in ("own", "mkl"):
        _C.set_lm_head_gemm(name)
        hidden.grad = weight.grad = None
        lp, entropy = lm_head_logprobs(hidden, weight, targets, return_entropy=True)
        (lp.sum() - 0.5 * entropy.sum()).backward()
        results[name] = (lp, entropy, hidden.grad.clone(), weight.grad.clone())
    for a, b, what in zip(results["own"], results["mkl"], ("lp", "entropy", "grad_hidden", "grad_weight")):
        # f32 sums in another order; the gradients are rounded to bf16 once (1 ulp of the largest)
        tol = 1e-5 if a.dtype == torch.float32 else 2 * 2 ** -8
        torch.testing.assert_close(a.double(), b.double(), atol=tol * a.abs().max().item(), rtol=0, msg=what)
