"""grpo_advantages: equals the reference (f64 group statistics), zero for singleton and constant
groups, tolerant of empty groups, and rejects bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from orsd.ops import grpo_advantages, reference


@given(
    n=st.integers(1, 300),
    num_groups=st.integers(1, 40),
    reward_values=st.sampled_from(["binary", "continuous", "mixed"]),
    eps=st.sampled_from([0.0, 1e-6, 0.1]),
    norm_by_std=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_on_random_inputs(n, num_groups, reward_values, eps, norm_by_std, seed):
    g = torch.Generator().manual_seed(seed)
    group_ids = torch.randint(0, num_groups, (n,), generator=g)  # some ids never drawn: empty groups
    if reward_values == "binary":  # constant groups are common
        rewards = torch.randint(0, 2, (n,), generator=g).float()
    elif reward_values == "continuous":
        rewards = torch.randn(n, generator=g) * 3
    else:
        rewards = torch.where(torch.rand(n, generator=g) < 0.5, torch.randn(n, generator=g), 1.0)
    out = grpo_advantages(rewards, group_ids, eps, norm_by_std)
    torch.testing.assert_close(
        out, reference.grpo_advantages(rewards, group_ids, eps, norm_by_std), atol=1e-6, rtol=1e-6
    )


def test_known_values(device):
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 7.0, 0.5], device=device)
    group_ids = torch.tensor([0, 0, 0, 2, 2, 2, 2, 5, 3], device=device)
    out = grpo_advantages(rewards, group_ids, eps=0.0)
    # group 0: mean 2, sample std 1; group 2: mean 4.75, sample std 0.5; groups 5 and 3: singletons
    expected = torch.tensor([-1.0, 0.0, 1.0, -1.5, 0.5, 0.5, 0.5, 0.0, 0.0], device=device)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grpo_advantages(rewards, group_ids, norm_by_std=False)[:3], expected[:3])


def test_constant_and_singleton_groups_are_exactly_zero(device):
    rewards = torch.tensor([0.1, 0.1, 0.1, 3.0, 2.0, 2.0], device=device)
    group_ids = torch.tensor([4, 4, 4, 7, 1, 1], device=device)
    for eps in (0.0, 1e-6):
        for norm in (True, False):
            out = grpo_advantages(rewards, group_ids, eps, norm)
            assert torch.equal(out, torch.zeros_like(out))


def test_empty_input(device):
    out = grpo_advantages(torch.zeros(0, device=device), torch.zeros(0, dtype=torch.int64, device=device))
    assert out.shape == (0,) and out.dtype == torch.float32


def test_bitwise_reproducible(device):
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(5000, generator=g).to(device)
    group_ids = torch.randint(0, 64, (5000,), generator=g).to(device)
    assert torch.equal(grpo_advantages(rewards, group_ids), grpo_advantages(rewards, group_ids))


def good_args():
    return {
        "rewards": torch.tensor([1.0, 0.0, 1.0]),
        "group_ids": torch.tensor([0, 0, 1]),
        "eps": 1e-6,
        "norm_by_std": True,
    }


@pytest.mark.parametrize(
    "name, bad",
    [
        ("rewards", torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)),
        ("rewards", torch.tensor([[1.0, 0.0, 1.0]])),
        ("rewards", torch.tensor([1.0, float("nan"), 1.0])),
        ("rewards", torch.tensor([1.0, 0.0, float("inf")])),
        ("rewards", torch.zeros(6)[::2]),
        ("group_ids", torch.tensor([0, 0], dtype=torch.int64)),
        ("group_ids", torch.tensor([0, 0, 1], dtype=torch.int32)),
        ("group_ids", torch.tensor([0, -1, 1])),
        ("eps", -1e-6),
        ("eps", float("nan")),
        ("norm_by_std", 1),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(name, bad):
    args = good_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name}"):
        grpo_advantages(**args)
