"""Keyed sampling (`Sampling.seed` with request keys, engines/base.py) in the hf engine: each request
draws from its own stream, so what it samples does not depend on the batch, and the global torch
generator is left alone. The vllm engine's side is in test_engine_vllm.py."""

import hashlib
import math

import pytest
import torch

from orsd.engines.base import Sampling, key_seed
from orsd.engines.decode import KeyedNoise, choose
from orsd.engines.hf import HfEngine


def prompts_of(tokenizer) -> list[list[int]]:
    texts = ["Task: put a clean apple in the fridge.", "Action 2: take apple 1 from countertop 1",
             "Buy a red cotton shirt under 30 dollars. search[red shirt] click[Buy Now]", "yes no"]
    ids = [tokenizer.encode(text) for text in texts]
    return ids + [ids[0]]  # a repeated prompt under another key, as in a group


def test_key_seed_is_blake2b_of_seed_and_key():
    """Pinned: the vllm engine's request seeds (and so its earlier runs) come from this formula."""
    digest = hashlib.blake2b(b"7:heldout:t-1:0:2", digest_size=8).digest()
    assert key_seed(7, "heldout:t-1:0:2") == int.from_bytes(digest, "little") >> 1


def test_keyed_noise_depends_on_seed_key_and_token_index_alone():
    first, second = KeyedNoise(7, ["x", "y"]).gumbel(50), KeyedNoise(7, ["x", "y"]).gumbel(50)
    assert first.shape == (2, 50) and torch.equal(first, second) and bool(first.isfinite().all())
    alone = KeyedNoise(7, ["y"])
    assert torch.equal(alone.gumbel(50)[0], first[1])  # the other row does not matter
    later = KeyedNoise(7, ["x", "y"])
    later.gumbel(50)
    assert not torch.equal(later.gumbel(50), first)  # token t + 1 meets the next block of the stream
    assert not torch.equal(KeyedNoise(8, ["x"]).gumbel(50)[0], first[0])
    assert not torch.equal(first[0], first[1])


def test_keyed_noise_is_standard_gumbel():
    """Mean γ (Euler–Mascheroni) and variance π²/6 over 200,000 draws (standard errors ~0.003, ~0.01)."""
    draws = KeyedNoise(0, ["a", "b"]).gumbel(100_000).double()
    assert abs(draws.mean().item() - 0.5772156649) < 0.015
    assert abs(draws.var().item() - math.pi ** 2 / 6) < 0.05


def test_choose_with_gumbel_noise_takes_the_argmax_of_the_noisy_scores():
    logits = torch.tensor([[0.2, 0.3, 0.5]]).log().expand(3, -1).contiguous()
    gumbel = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.6, 0.0], [0.0, 0.4, 0.0]])
    # log 0.2 + 2 > log 0.5; log 0.3 + 0.6 > log 0.5 > log 0.3 + 0.4
    choice, logprob = choose(logits, Sampling(temperature=1.0), 1.0, gumbel=gumbel)
    assert choice.tolist() == [0, 1, 2]
    torch.testing.assert_close(logprob, torch.tensor([0.2, 0.3, 0.5]).log())
    # top-k 2 removes token 0: no noise brings it back
    choice, _ = choose(logits, Sampling(temperature=1.0, top_k=2), 1.0, gumbel=torch.tensor([[50.0, 0.0, 0.0]] * 3))
    assert choice.tolist() == [2, 2, 2]


def test_keyed_choices_follow_the_temperature_scaled_policy():
    """20,000 keyed draws of p ∝ (0.2, 0.3, 0.5)^(1/0.5) = (0.105, 0.237, 0.658) (standard errors < 0.004)."""
    logits = torch.tensor([[0.2, 0.3, 0.5]]).log().expand(20_000, -1).contiguous()
    noise = KeyedNoise(5, [f"k{i}" for i in range(20_000)])
    choice, _ = choose(logits, Sampling(temperature=0.5), 0.5, gumbel=noise.gumbel(3))
    expected = torch.tensor([0.04, 0.09, 0.25]) / 0.38
    torch.testing.assert_close(torch.bincount(choice, minlength=3) / 20_000, expected, atol=0.015, rtol=0)


@pytest.fixture
def engine(tiny_model, tiny_tokenizer, one_torch_thread):
    return HfEngine(tiny_model.eval(), tiny_tokenizer, batch_size=0)


def test_a_keyed_request_samples_the_same_in_any_batch(engine, tiny_tokenizer):
    prompts = prompts_of(tiny_tokenizer)
    keys = [f"heldout:t{i}:0:0" for i in range(len(prompts))]
    sampling = Sampling(temperature=1.0, max_new_tokens=12, seed=3)
    together = engine.generate(prompts, sampling, keys)
    engine.batch_size = 1
    alone = engine.generate(prompts, sampling, keys)
    engine.batch_size = 0
    backwards = engine.generate(prompts[::-1], sampling, keys[::-1])[::-1]
    subset = engine.generate(prompts[1:3], sampling, keys[1:3])
    for other in (alone, backwards):
        assert [g.ids for g in other] == [g.ids for g in together]
        for a, b in zip(other, together):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    assert [g.ids for g in subset] == [g.ids for g in together[1:3]]
    assert together[0].ids != together[4].ids  # the same prompt under another key: another stream
    reseeded = engine.generate(prompts, Sampling(temperature=1.0, max_new_tokens=12, seed=4), keys)
    assert [g.ids for g in reseeded] != [g.ids for g in together]


def test_keyed_sampling_leaves_the_global_generator_alone(engine, tiny_tokenizer):
    prompts = prompts_of(tiny_tokenizer)
    keys = [f"k{i}" for i in range(len(prompts))]
    torch.manual_seed(11)
    state = torch.get_rng_state()
    engine.generate(prompts, Sampling(temperature=1.0, max_new_tokens=8, seed=3), keys)
    assert torch.equal(torch.get_rng_state(), state)
    engine.generate(prompts, Sampling(temperature=1.0, max_new_tokens=8), keys)  # unkeyed: the global generator
    assert not torch.equal(torch.get_rng_state(), state)


def test_keyed_sampling_refuses_what_it_cannot_key(engine, tiny_tokenizer):
    prompts = prompts_of(tiny_tokenizer)[:2]
    with pytest.raises(ValueError, match=r"sampling.seed=3 asks for keyed sampling: expected keys"):
        engine.generate(prompts, Sampling(max_new_tokens=4, seed=3))
    with pytest.raises(ValueError, match=r"keys: 1 keys for 2 prompts"):
        engine.generate(prompts, Sampling(max_new_tokens=4, seed=3), ["a"])
    with pytest.raises(ValueError, match=r"draft_tokens=4 with sampling.seed=3: speculative decoding"):
        engine.generate(prompts, Sampling(max_new_tokens=4, seed=3, draft_tokens=4), ["a", "b"])
