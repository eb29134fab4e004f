"""shape_advantages: equals the reference bit for bit, handles NaN/inf in either context, and
rejects bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from orsd.ops import reference, shape_advantages


def make_inputs(L, S, device, *, seed=0, non_finite_p=0.0):
    g = torch.Generator().manual_seed(seed)
    L_rubric = L + 7
    lp_plain = -torch.rand(L, generator=g) * 5
    lp_rubric = -torch.rand(L_rubric, generator=g) * 5
    if non_finite_p > 0:
        poison = torch.tensor([float("nan"), float("inf"), float("-inf")])
        pick = torch.randint(0, 3, (L_rubric,), generator=g)
        lp_rubric = torch.where(torch.rand(L_rubric, generator=g) < non_finite_p, poison[pick], lp_rubric)
        pick = torch.randint(0, 3, (L,), generator=g)
        lp_plain = torch.where(torch.rand(L, generator=g) < non_finite_p, poison[pick], lp_plain)
    pos_map = torch.randint(0, L_rubric, (L,), generator=g)
    response_mask = torch.rand(L, generator=g) < 0.6
    seq_ids = torch.randint(0, max(S, 1), (L,), generator=g)
    seq_adv = torch.randn(S, generator=g)
    eligible = torch.rand(S, generator=g) < 0.7
    tensors = (lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv)
    return [t.to(device) for t in tensors] + [eligible.to(device)]


def run_both(args, alpha):
    lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, eligible = args
    got = shape_advantages(lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, alpha, eligible)
    want = reference.shape_advantages(
        lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, alpha, eligible
    )
    return got, want


@given(
    L=st.integers(0, 300),
    S=st.integers(1, 10),
    alpha=st.sampled_from([0.0, 0.01, 1.0, -0.5, 3.3]),
    non_finite_p=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_exactly(L, S, alpha, non_finite_p, seed):
    (adv, delta, valid), (ref_adv, ref_delta, ref_valid) = run_both(
        make_inputs(L, S, "cpu", seed=seed, non_finite_p=non_finite_p), alpha
    )
    assert torch.equal(valid, ref_valid)
    assert torch.equal(delta, ref_delta)
    assert torch.equal(adv, ref_adv)
    assert torch.isfinite(adv).all() and torch.isfinite(delta).all()


def test_semantics(device):
    lp_plain = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0], device=device)
    lp_rubric = torch.tensor([-0.5, float("nan"), -3.5, -1.0, -2.0, -9.0], device=device)
    pos_map = torch.tensor([0, 1, 2, 3, 5], device=device)
    response_mask = torch.tensor([True, True, True, False, True], device=device)
    seq_ids = torch.tensor([0, 0, 1, 1, 1], device=device)
    seq_adv = torch.tensor([2.0, -1.0], device=device)
    eligible = torch.tensor([True, True], device=device)
    adv, delta, valid = shape_advantages(
        lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, 0.5, eligible
    )
    assert valid.tolist() == [True, False, True, False, True]  # NaN in the rubric context -> not valid
    assert delta.tolist() == [0.5, 0.0, -0.5, 0.0, -4.0]
    assert adv.tolist() == [
        2.25,
        2.0,
        -1.25,
        0.0,
        -3.0,
    ]  # invalid response token keeps A_GRPO; off-response 0
    eligible = torch.tensor([True, False], device=device)  # a group without a selected rubric
    adv, delta, valid = shape_advantages(
        lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, 0.5, eligible
    )
    assert valid.tolist() == [True, False, False, False, False]
    assert adv.tolist() == [2.25, 2.0, -1.0, 0.0, -1.0]


def test_large_input_matches_reference(device):
    (adv, delta, valid), (ref_adv, ref_delta, ref_valid) = run_both(
        make_inputs(200_000, 64, device, non_finite_p=0.01), 0.01
    )
    assert torch.equal(valid, ref_valid) and torch.equal(delta, ref_delta) and torch.equal(adv, ref_adv)


def good_args():
    lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, eligible = make_inputs(6, 2, "cpu")
    return dict(
        lp_plain=lp_plain, lp_rubric=lp_rubric, pos_map=pos_map, response_mask=response_mask,
        seq_ids=seq_ids, seq_adv=seq_adv, alpha=0.01, eligible=eligible,
    )  # fmt: skip


@pytest.mark.parametrize(
    "name, bad",
    [
        ("lp_plain", torch.zeros(6, dtype=torch.float64)),
        ("lp_plain", torch.zeros(12)[::2]),
        ("lp_rubric", torch.zeros(13, dtype=torch.bfloat16)),
        ("pos_map", torch.tensor([0, 1, 2, 3, 4, 13])),
        ("pos_map", torch.tensor([0, 1, 2, 3, 4, -1])),
        ("pos_map", torch.tensor([0, 1, 2, 3, 4])),
        ("response_mask", torch.ones(6, dtype=torch.uint8)),
        ("response_mask", torch.ones(5, dtype=torch.bool)),
        ("seq_ids", torch.tensor([0, 0, 1, 1, 2, 1])),
        ("seq_ids", torch.tensor([0, 0, 1, 1, 1], dtype=torch.int64)),
        ("seq_adv", torch.zeros(2, dtype=torch.float64)),
        ("alpha", float("nan")),
        ("alpha", None),
        ("eligible", torch.ones(3, dtype=torch.bool)),
        ("eligible", torch.ones(2, dtype=torch.int32)),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        shape_advantages(**args)
