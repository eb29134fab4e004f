"""token_logprobs: the native kernels equal orsd.ops.reference on random inputs, on the edges the
issue lists, and reject bad input with a ValueError naming the argument."""

from __future__ import annotations

import pytest
import torch
from _memory import peak_rss_growth_bytes
from hypothesis import given
from hypothesis import strategies as st

from orsd.ops import reference, token_logprobs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_inputs(T, V, dtype, device, *, scale=3.0, offset=0.0, mask_p=0.8, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(T, V, generator=g) * scale + offset).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    mask = torch.rand(T, generator=g) < mask_p
    targets = torch.where(mask, targets, torch.full_like(targets, -100))  # masked rows: anything
    return logits.to(device), targets.to(device), mask.to(device)


def assert_matches_reference(logits, targets, mask, temperature, *, atol=1e-4, rtol=1e-5):
    lp, lse = token_logprobs(logits, targets, mask, temperature, return_lse=True)
    ref_lp, ref_lse = reference.token_logprobs(logits, targets, mask, temperature, return_lse=True)
    assert lp.dtype == torch.float32 and lp.shape == (logits.shape[0],)
    torch.testing.assert_close(lp, ref_lp, atol=atol, rtol=rtol, equal_nan=True)
    torch.testing.assert_close(lse, ref_lse, atol=atol, rtol=rtol, equal_nan=True)
    if mask is not None:  # masked rows are exactly 0.0, not merely close
        assert torch.equal(lp[~mask], torch.zeros_like(lp[~mask]))
    again = token_logprobs(logits, targets, mask, temperature)
    torch.testing.assert_close(again, lp, atol=0, rtol=0, equal_nan=True)


@given(
    T=st.integers(0, 24),
    V=st.integers(1, 2500),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.3, 0.7, 1.5, 2.0]),
    scale=st.sampled_from([0.1, 1.0, 5.0, 30.0]),
    use_mask=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_on_random_inputs(cpu_isa, T, V, dtype, temperature, scale, use_mask, seed):
    logits, targets, mask = make_inputs(T, V, dtype, "cpu", scale=scale, seed=seed)
    if not use_mask:
        mask = None
        targets = targets.clamp(min=0)
    assert_matches_reference(logits, targets, mask, temperature)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [1, 3, 15, 16, 17, 31, 33, 63, 65, 4095, 4096, 4097, 8193])
def test_vocab_sizes_not_a_multiple_of_any_tile(device, dtype, V):
    logits, targets, mask = make_inputs(5, V, dtype, device, seed=V)
    assert_matches_reference(logits, targets, mask, 1.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_negative_logits(device, dtype):
    # A max that starts at 0 instead of -inf would break shift invariance here.
    logits, targets, mask = make_inputs(6, 3001, dtype, device, scale=2.0, offset=-500.0)
    assert (logits < 0).all()
    assert_matches_reference(logits, targets, mask, 1.0)
    assert_matches_reference(logits, targets, mask, 0.6)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_huge_logits(device, temperature):
    logits, targets, mask = make_inputs(6, 2000, torch.float32, device, scale=1e4)
    # the 1e-3 bound, relative to values of size ~|logit| / temperature
    assert_matches_reference(logits, targets, mask, temperature, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_qwen3_vocabulary_row(device, dtype):
    logits, targets, mask = make_inputs(3, 151_936, dtype, device, mask_p=1.0)
    assert_matches_reference(logits, targets, mask, 1.0)
    assert_matches_reference(logits, targets, mask, 0.7)


@pytest.mark.parametrize("T", [0, 1])
def test_zero_and_one_token(device, T):
    logits, targets, mask = make_inputs(T, 50, torch.bfloat16, device, mask_p=1.0)
    assert_matches_reference(logits, targets, mask, 1.0)
    assert_matches_reference(logits, targets, None, 1.0)


def test_masked_rows_with_out_of_range_targets_are_zero(device):
    logits, targets, _ = make_inputs(4, 10, torch.float32, device)
    mask = torch.tensor([True, False, True, False], device=device)
    targets = torch.tensor([3, -100, 9, 10_000], device=device)
    lp = token_logprobs(logits, targets, mask)
    assert lp[1].item() == 0.0 and lp[3].item() == 0.0
    assert_matches_reference(logits, targets, mask, 1.0)


def test_non_finite_rows_give_nan(device):
    logits, _, _ = make_inputs(5, 40, torch.float32, device)
    targets = torch.zeros(5, dtype=torch.int64, device=device)
    logits[0, 7] = float("nan")
    logits[1, 3] = float("inf")
    logits[2] = float("-inf")
    logits[3, :20] = float("-inf")  # finite max: -inf entries simply contribute 0
    lp = token_logprobs(logits, targets)
    assert torch.isnan(lp[:3]).all()
    assert lp[3].item() == float("-inf") and torch.isfinite(lp[4])
    assert_matches_reference(logits, targets, None, 1.0)


def test_bitwise_reproducible_across_runs_and_threads(cpu_isa):
    logits, targets, mask = make_inputs(64, 5000, torch.bfloat16, "cpu")
    first = token_logprobs(logits, targets, mask)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = token_logprobs(logits, targets, mask)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, token_logprobs(logits, targets, mask))
    assert torch.equal(first, single)


def test_bitwise_reproducible_on_every_device(device):
    logits, targets, mask = make_inputs(300, 20_000, torch.bfloat16, device)
    first = token_logprobs(logits, targets, mask, 0.9)
    for _ in range(3):
        assert torch.equal(first, token_logprobs(logits, targets, mask, 0.9))


@pytest.mark.gpu
def test_runs_on_the_current_stream():
    logits, targets, mask = make_inputs(64, 5000, torch.bfloat16, "cuda")
    expected = token_logprobs(logits, targets, mask)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = token_logprobs(logits, targets, mask)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, expected)


def test_allocates_nothing_of_size_t_by_v():
    logits, targets, mask = make_inputs(1024, 65_536, torch.bfloat16, "cpu")  # 128 MiB of logits
    growth = peak_rss_growth_bytes(lambda: token_logprobs(logits, targets, mask))
    assert growth < 16 * 2**20, f"peak RSS grew by {growth / 2**20:.1f} MiB; T x V f32 is 256 MiB"


def test_accepts_logits_that_require_grad():
    logits, targets, mask = make_inputs(3, 20, torch.float32, "cpu")
    logits.requires_grad_(True)
    lp = token_logprobs(logits, targets, mask)
    assert not lp.requires_grad
    torch.testing.assert_close(lp, reference.token_logprobs(logits, targets, mask))


# ---- bad input -----------------------------------------------------------------------------


def good_args():
    logits, targets, mask = make_inputs(4, 10, torch.float32, "cpu", mask_p=1.0)
    return {"logits": logits, "targets": targets, "mask": mask, "temperature": 1.0}


@pytest.mark.parametrize(
    "name, bad",
    [
        ("logits", torch.zeros(4, 10, dtype=torch.float64)),
        ("logits", torch.zeros(4, 10, dtype=torch.int64)),
        ("logits", torch.zeros(40)),
        ("logits", torch.zeros(10, 4).T),
        ("logits", torch.zeros(4, 0)),
        ("logits", torch.zeros(4, 10, device="meta")),
        ("logits", [[0.0] * 10] * 4),
        ("targets", torch.zeros(4, dtype=torch.int32)),
        ("targets", torch.zeros(5, dtype=torch.int64)),
        ("targets", torch.zeros(8, dtype=torch.int64)[::2]),
        ("targets", torch.tensor([0, 1, 10, 2])),
        ("targets", torch.tensor([0, -1, 3, 2])),
        ("mask", torch.ones(4, dtype=torch.uint8)),
        ("mask", torch.ones(3, dtype=torch.bool)),
        ("temperature", 0.0),
        ("temperature", -1.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", "1.0"),
        ("temperature", torch.tensor(1.0)),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        token_logprobs(**args)


def test_out_of_range_target_message_names_row_and_value():
    args = good_args()
    args["targets"] = torch.tensor([0, 1, 2, 12])
    with pytest.raises(ValueError, match=r"targets: value 12 at index 3 .*\[0, 10\)"):
        token_logprobs(**args)


@pytest.mark.gpu
def test_device_mismatch_raises():
    args = good_args()
    args["logits"] = args["logits"].cuda()
    with pytest.raises(ValueError, match=r"^targets: is on cpu, expected cuda"):
        token_logprobs(**args)
