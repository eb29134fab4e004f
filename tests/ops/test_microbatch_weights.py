"""microbatch_weights: equals the reference, makes sum(w * f) the paper's Eq. 14 loss, and rejects
bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from orsd.ops import microbatch_weights, reference


def eq14_loss(f, mask, microbatch_ids, num_microbatches):
    """Paper Eq. 14 written out: mean over all D*G micro-batches of each one's masked token mean
    (a micro-batch without valid tokens contributes 0)."""
    total = 0.0
    for m in range(num_microbatches):
        selected = mask & (microbatch_ids == m)
        if selected.any():
            total += f[selected].double().mean().item()
    return total / num_microbatches


@given(
    L=st.integers(0, 400),
    num_microbatches=st.integers(1, 12),
    mask_p=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_and_eq14(L, num_microbatches, mask_p, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(L, generator=g) < mask_p
    microbatch_ids = torch.randint(0, num_microbatches, (L,), generator=g)
    w = microbatch_weights(mask, microbatch_ids, num_microbatches)
    assert torch.equal(w, reference.microbatch_weights(mask, microbatch_ids, num_microbatches))
    f = torch.randn(L, generator=g)
    assert (w.double() * f.double()).sum().item() == pytest.approx(
        eq14_loss(f, mask, microbatch_ids, num_microbatches), abs=1e-6
    )


def test_known_values_and_empty_microbatch(device):
    mask = torch.tensor([True, True, False, True, False, False], device=device)
    microbatch_ids = torch.tensor([0, 0, 0, 1, 2, 2], device=device)
    w = microbatch_weights(mask, microbatch_ids, 4)  # micro-batch 2 has no valid token, 3 is absent
    expected = torch.tensor([1 / 8, 1 / 8, 0.0, 1 / 4, 0.0, 0.0], device=device)
    assert torch.equal(w, expected)


def test_empty_input(device):
    w = microbatch_weights(
        torch.zeros(0, dtype=torch.bool, device=device), torch.zeros(0, dtype=torch.int64, device=device), 2
    )
    assert w.shape == (0,) and w.dtype == torch.float32


def good_args():
    return {
        "mask": torch.tensor([True, False, True]),
        "microbatch_ids": torch.tensor([0, 1, 1]),
        "num_microbatches": 2,
    }


@pytest.mark.parametrize(
    "name, bad",
    [
        ("mask", torch.tensor([1, 0, 1])),
        ("mask", torch.ones(6, dtype=torch.bool)[::2]),
        ("microbatch_ids", torch.tensor([0, 1])),
        ("microbatch_ids", torch.tensor([0, 2, 1])),
        ("microbatch_ids", torch.tensor([0, -1, 1])),
        ("microbatch_ids", torch.tensor([0.0, 1.0, 1.0])),
        ("num_microbatches", 0),
        ("num_microbatches", 2.0),
        ("num_microbatches", True),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        microbatch_weights(**args)
