"""lm_head_logprobs: values and gradients (w.r.t. hidden and weight, through lp and entropy) equal
torch autograd on the full-logits reference (_lm_head_reference.py), on awkward shapes, on every CPU
instruction set and with every bf16 GEMM the CPU offers (our kernel runs on the avx512 set when the
CPU has AVX512-BF16, MKL everywhere; the module runs once per GEMM), without a T x V allocation,
reproducibly. The fallbacks, bad input and the GEMM switches are in test_lm_head_choices.py."""

from __future__ import annotations

import pytest
import torch
from _lm_head_reference import DTYPES, assert_close_scaled, check_against_reference, make_inputs, reference
from _memory import peak_rss_growth_bytes
from hypothesis import given
from hypothesis import strategies as st

from orsd import _C
from orsd.ops import fused_token_logprobs, lm_head_logprobs


@pytest.fixture(autouse=True, params=_C.lm_head_gemms_available())
def gemm(request):
    """Every test here runs once per bf16 GEMM this CPU offers (`own` only with AVX512-BF16)."""
    previous = _C.lm_head_gemm()
    _C.set_lm_head_gemm(request.param)
    yield request.param
    _C.set_lm_head_gemm(previous)


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
