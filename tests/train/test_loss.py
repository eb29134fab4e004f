"""Eq. 11 per token, by hand: PPO-clip, dual-clip, log-ratio clamp, k3 KL and its clamps; and the
update's prefix-packed micro-batches."""

import math

import pytest
import torch

from orsd.train.loss import per_token_loss, shared_batches


def terms(lp, old, ref, adv, **kw):
    t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    return per_token_loss(t(lp), t(old), t(ref), t(adv), **kw)


def test_on_policy_token_is_minus_advantage():
    out = terms(-1.0, -1.0, -1.0, 2.0)
    assert out.pg.item() == pytest.approx(-2.0)
    assert out.kl.item() == 0.0
    assert not out.clipped.item()


def test_positive_advantage_is_clipped_above():
    out = terms(-0.5, -1.0, -0.5, 1.0)  # ratio e^0.5 = 1.6487 > 1.2
    assert out.pg.item() == pytest.approx(-1.2)
    assert out.clipped.item()


def test_negative_advantage_takes_the_unclipped_larger_loss():
    out = terms(-0.5, -1.0, -0.5, -1.0)
    assert out.pg.item() == pytest.approx(math.exp(0.5))
    assert not out.clipped.item()


def test_dual_clip_caps_negative_advantage_loss():
    assert terms(1.0, -1.0, 1.0, -1.0).pg.item() == pytest.approx(math.exp(2.0))
    assert terms(1.0, -1.0, 1.0, -1.0, dual_clip=3.0).pg.item() == pytest.approx(3.0)
    # dual-clip never touches positive advantages
    assert terms(1.0, -1.0, 1.0, 1.0, dual_clip=3.0).pg.item() == pytest.approx(-1.2)


def test_log_ratio_is_clamped_before_exp():
    out = terms(50.0, 0.0, 50.0, -1.0, log_ratio_clamp=20.0)
    assert out.ratio.item() == pytest.approx(math.exp(20.0))


def test_k3_kl_and_its_clamps():
    out = terms(-1.0, -1.0, -0.7, 0.0, kl_coef=0.5)
    expected = math.exp(0.3) - 0.3 - 1.0
    assert out.kl.item() == pytest.approx(expected)
    assert out.loss.item() == pytest.approx(0.5 * expected)
    assert terms(-40.0, -40.0, 0.0, 0.0).kl.item() == 10.0  # exp(20) - 21, clamped to 10


def test_gradient_of_unclipped_token_is_minus_advantage_times_ratio():
    lp = torch.tensor([-1.0], requires_grad=True)
    out = per_token_loss(lp, torch.tensor([-1.1]), torch.tensor([-1.0]), torch.tensor([0.5]), kl_coef=0.0)
    out.loss.sum().backward()
    assert lp.grad.item() == pytest.approx(-0.5 * math.exp(0.1))


def test_shared_batches_count_a_shared_prefix_once():
    """The update's prefix packing: sequences sorted by tokens, a batch closes when the tokens its
    tree would forward (each sequence beyond what it shares with the one before) pass the budget."""
    import random

    system, rng = [1, 1, 1, 1, 1, 1], random.Random(0)
    tasks = [system + [2, 2, 2, 2], system + [3, 3, 3, 3]]
    sequences = [tasks[i % 2] + [rng.randrange(4, 50) for _ in range(3)] for i in range(8)]
    batches = shared_batches(sequences, token_budget=25)
    assert sorted(i for b in batches for i in b) == list(range(8))
    # each task's four sequences share 10 tokens: 10 + 4 × 3 = 22 tokens forwarded, one batch per task
    assert sorted(map(sorted, batches)) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # by padded length they would need 4 × 13 = 52 tokens. Sharing 19 tokens, two sequences of 20
    # cost 21; one over the budget is a batch alone
    assert shared_batches([[7], [5] * 19 + [6], [5] * 20], token_budget=21) == [[2, 1], [0]]
    assert shared_batches([[7], [5] * 19 + [6], [5] * 20], token_budget=20) == [[2], [1], [0]]
    assert shared_batches([[5] * 30, [7]], token_budget=20) == [[0], [1]]
