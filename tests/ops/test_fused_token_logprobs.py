"""fused_token_logprobs: equals token_logprobs of the f32 logits hidden @ weight.T (the reference)
for every chunking, never holds T x V, and rejects bad input."""

from __future__ import annotations

import importlib

import pytest
import torch
from _memory import peak_rss_growth_bytes
from hypothesis import given
from hypothesis import strategies as st

from orsd.ops import fused_token_logprobs, reference, token_logprobs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_inputs(T, H, V, dtype, device, *, scale=1.0, mask_p=0.8, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * scale / H**0.5).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    mask = torch.rand(T, generator=g) < mask_p
    targets = torch.where(mask, targets, torch.full_like(targets, -100))
    return hidden.to(device), weight.to(device), targets.to(device), mask.to(device)


def assert_matches_reference(hidden, weight, targets, mask, temperature, chunk_size):
    lp, lse = fused_token_logprobs(hidden, weight, targets, mask, temperature, chunk_size, return_lse=True)
    ref_lp, ref_lse = reference.fused_token_logprobs(
        hidden, weight, targets, mask, temperature, return_lse=True
    )
    assert lp.dtype == torch.float32 and lp.shape == (hidden.shape[0],)
    # The bound for the fused path: 1e-3 absolute against f32 logits of the same values.
    torch.testing.assert_close(lp, ref_lp, atol=1e-3, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-5, equal_nan=True)
    if mask is not None:
        assert torch.equal(lp[~mask], torch.zeros_like(lp[~mask]))


@given(
    T=st.integers(0, 20),
    H=st.integers(1, 48),
    V=st.integers(1, 700),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.6, 1.3]),
    chunk_size=st.one_of(st.none(), st.integers(16, 800)),
    scale=st.sampled_from([1.0, 10.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_on_random_inputs(T, H, V, dtype, temperature, chunk_size, scale, seed):
    hidden, weight, targets, mask = make_inputs(T, H, V, dtype, "cpu", scale=scale, seed=seed)
    assert_matches_reference(hidden, weight, targets, mask, temperature, chunk_size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [None, 96, 1000, 1001, 10**9])
def test_every_chunking_agrees(device, dtype, chunk_size):
    hidden, weight, targets, mask = make_inputs(33, 64, 1001, dtype, device, scale=8.0)
    assert_matches_reference(hidden, weight, targets, mask, 0.8, chunk_size)


@pytest.mark.parametrize("chunk_size", [1, 2, 7])
def test_tiny_chunks_agree(device, chunk_size):
    hidden, weight, targets, mask = make_inputs(5, 8, 23, torch.bfloat16, device, scale=8.0)
    assert_matches_reference(hidden, weight, targets, mask, 1.0, chunk_size)


def test_token_chunks_agree_with_a_single_chunk(monkeypatch):
    # Force several token chunks per vocabulary chunk (normally only long inputs get them).
    module = importlib.import_module("orsd.ops.fused_token_logprobs")  # the name is also the function

    hidden, weight, targets, mask = make_inputs(50, 16, 300, torch.bfloat16, "cpu")
    whole = fused_token_logprobs(hidden, weight, targets, mask, chunk_size=100)
    monkeypatch.setitem(module.CHUNK_ELEMENTS, "cpu", 700)  # 7 rows per chunk
    torch.testing.assert_close(fused_token_logprobs(hidden, weight, targets, mask, chunk_size=100), whole)


def test_equals_token_logprobs_on_f32_logits(device):
    hidden, weight, targets, mask = make_inputs(9, 32, 777, torch.float32, device)
    expected = token_logprobs(hidden @ weight.T, targets, mask, 1.0)
    torch.testing.assert_close(
        fused_token_logprobs(hidden, weight, targets, mask, 1.0, 100), expected, atol=1e-4, rtol=1e-5
    )


@pytest.mark.parametrize("T", [0, 1])
def test_zero_and_one_token(device, T):
    hidden, weight, targets, mask = make_inputs(T, 8, 50, torch.bfloat16, device, mask_p=1.0)
    assert_matches_reference(hidden, weight, targets, mask, 1.0, None)
    assert_matches_reference(hidden, weight, targets, None, 1.0, 16)


def test_all_negative_and_huge_logits(device):
    hidden, weight, targets, mask = make_inputs(8, 4, 500, torch.float32, device, mask_p=1.0)
    # A bias column makes every logit about -300 (all negative) in one case, about 3e3 in another.
    hidden[:, 0] = 1.0
    for bias in (-300.0, 3000.0):
        weight[:, 0] = bias
        assert_matches_reference(hidden, weight, targets, mask, 1.0, 64)


def test_non_finite_logits_give_nan(device):
    hidden, weight, targets, _ = make_inputs(3, 4, 100, torch.float32, device)
    targets = targets.clamp(min=0)
    hidden[1, 2] = float("nan")
    lp = fused_token_logprobs(hidden, weight, targets, None, 1.0, 30)
    assert torch.isnan(lp[1]) and torch.isfinite(lp[[0, 2]]).all()
    assert_matches_reference(hidden, weight, targets, None, 1.0, 30)


def test_bitwise_reproducible(device):
    hidden, weight, targets, mask = make_inputs(40, 64, 3000, torch.bfloat16, device)
    first = fused_token_logprobs(hidden, weight, targets, mask, 1.0, 256)
    assert torch.equal(first, fused_token_logprobs(hidden, weight, targets, mask, 1.0, 256))


def test_allocates_nothing_of_size_t_by_v():
    hidden, weight, targets, mask = make_inputs(2048, 16, 65_536, torch.bfloat16, "cpu")
    growth = peak_rss_growth_bytes(lambda: fused_token_logprobs(hidden, weight, targets, mask))
    # T x V f32 would be 512 MiB; one chunk is at most 32 MiB.
    assert growth < 64 * 2**20, f"peak RSS grew by {growth / 2**20:.1f} MiB"


# ---- bad input -----------------------------------------------------------------------------


def good_args():
    hidden, weight, targets, mask = make_inputs(4, 8, 10, torch.float32, "cpu", mask_p=1.0)
    return {
        "hidden": hidden,
        "weight": weight,
        "targets": targets,
        "mask": mask,
        "temperature": 1.0,
        "chunk_size": None,
    }


@pytest.mark.parametrize(
    "name, bad",
    [
        ("hidden", torch.zeros(4, 8, dtype=torch.float64)),
        ("hidden", torch.zeros(32)),
        ("hidden", torch.zeros(8, 4).T),
        ("weight", torch.zeros(10, 8, dtype=torch.bfloat16)),  # dtype differs from hidden
        ("weight", torch.zeros(10, 7)),
        ("weight", torch.zeros(0, 8)),
        ("weight", torch.zeros(8, 10).T),
        ("targets", torch.zeros(3, dtype=torch.int64)),
        ("targets", torch.tensor([0, 1, 2, 10])),
        ("targets", torch.zeros(4, dtype=torch.int32)),
        ("mask", torch.ones(4, dtype=torch.int64)),
        ("mask", torch.ones(5, dtype=torch.bool)),
        ("temperature", 0),
        ("temperature", float("-inf")),
        ("chunk_size", 0),
        ("chunk_size", -5),
        ("chunk_size", 2.5),
        ("chunk_size", True),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        fused_token_logprobs(**args)
