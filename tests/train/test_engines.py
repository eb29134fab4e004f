"""The hf engine's bundle-generation option: an n-gram ban that vLLM cannot honour."""

import pytest
import torch

from orsd.train.config import ConfigError, load_config
from orsd.engines.hf import HfEngine, Sampling


def ngrams(ids, n):
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def test_no_repeat_ngram_size_bans_repeats_that_greedy_decoding_makes(tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    prompt = tiny_tokenizer.encode("the agent clicks", add_special_tokens=False)
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    plain = engine.generate([prompt], Sampling(max_new_tokens=40, greedy=True))[0].ids
    banned = engine.generate([prompt], Sampling(max_new_tokens=40, greedy=True, no_repeat_ngram_size=3))[0].ids
    grams = ngrams(plain, 3)
    assert len(set(grams)) < len(grams), "the tiny model must loop without the ban for this test to mean anything"
    grams = ngrams(prompt + banned, 3)  # transformers counts the prompt's n-grams too
    assert len(set(grams)) == len(grams)


def test_vllm_engine_refuses_the_ban_in_config():
    with pytest.raises(ConfigError, match="rubric.no_repeat_ngram_size"):
        load_config(None, ["rollout.engine=vllm", "rubric.no_repeat_ngram_size=4"])
    assert load_config(None, ["rubric.no_repeat_ngram_size=4"]).rubric.no_repeat_ngram_size == 4


class GroupedAttention(torch.nn.Module):
    """What transformers' attention functions read from the attention module."""

    num_key_value_groups = 3
    is_causal = True


def test_decode_attention_equals_transformers_sdpa():
    """One query token, a left-padding mask: the query heads sharing a key/value head as rows of it
    give transformers' repeat-the-cache result."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from orsd.engines.hf import gqa_decode_attention

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(shape, generator=generator) for shape in
                         [(3, 6, 1, 16), (3, 2, 11, 16), (3, 2, 11, 16)])
    mask = torch.ones(3, 1, 1, 11, dtype=torch.bool)
    mask[0, ..., :4] = mask[2, ..., :1] = False  # rows 0 and 2 were left-padded
    module = GroupedAttention()
    for attention_mask in (mask, None):
        expected, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=0.25)
        got, _ = gqa_decode_attention(module, query, key, value, attention_mask, scaling=0.25)
        assert got.shape == expected.shape == (3, 1, 6, 16)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # under bf16 autocast the cache holds fp32 keys (after the rotary embedding) and bf16 values
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, _ = sdpa_attention_forward(module, query, key, value.bfloat16(), mask, scaling=0.25)
        got, _ = gqa_decode_attention(module, query, key, value.bfloat16(), mask, scaling=0.25)
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=2e-2)
    prefill = torch.randn(3, 6, 11, 16, generator=generator)  # more than one query token: transformers' own path
    expected, _ = sdpa_attention_forward(module, prefill, key, value, None, scaling=0.25)
    assert torch.equal(gqa_decode_attention(module, prefill, key, value, None, scaling=0.25)[0], expected)


def test_generation_with_decode_attention_equals_plain_sdpa(tiny_model, tiny_tokenizer, monkeypatch):
    """Padded prompts of different lengths, greedy: the same ids and log-probs (fp32), and the model
    is back on sdpa afterwards."""
    import contextlib

    from orsd.engines import hf

    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False)
               for text in ("the agent clicks", "Task: put a clean apple in the fridge.", "yes no")]
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    sampling = Sampling(max_new_tokens=12, greedy=True)
    fast = engine.generate(prompts, sampling)
    assert tiny_model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(hf, "decode_attention", lambda model: contextlib.nullcontext())
    plain = engine.generate(prompts, sampling)
    for a, b in zip(fast, plain):
        assert a.ids == b.ids and len(a.ids) > 1
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_reserved_cache_generates_what_the_dynamic_cache_does(tiny_model, tiny_tokenizer, monkeypatch):
    """Greedy decoding with room reserved ahead (engines/kv_cache.py) gives the ids and log-probs of
    transformers' concatenating DynamicCache (fp32), here with too little room so the buffers grow."""
    from transformers.cache_utils import DynamicCache

    from orsd.engines import kv_cache

    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False)
               for text in ("the agent clicks", "Task: put a clean apple in the fridge.", "yes no")]
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    sampling = Sampling(max_new_tokens=12, greedy=True)
    made = []
    original = kv_cache.reserved_cache

    def small_room(model, capacity):
        made.append(original(model, 4))  # less than one prompt: the first update already grows it
        return made[-1]

    monkeypatch.setattr(kv_cache, "reserved_cache", small_room)
    reserved = engine.generate(prompts, sampling)
    assert made and all(isinstance(layer, kv_cache.ReservedLayer) for layer in made[0].layers)
    monkeypatch.setattr(kv_cache, "reserved_cache", lambda model, capacity: DynamicCache(config=model.config))
    dynamic = engine.generate(prompts, sampling)
    for a, b in zip(reserved, dynamic):
        assert a.ids == b.ids and len(a.ids) > 1
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_reserved_layer_writes_in_place_and_adopts_outside_changes():
    from orsd.engines.kv_cache import ReservedLayer

    layer = ReservedLayer(capacity=8)
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    keys, _ = layer.update(k, v)
    buffer = layer._room[0]
    step = torch.randn(2, 3, 1, 4)
    keys, values = layer.update(step, step)
    assert layer._room[0] is buffer and keys.data_ptr() == buffer.data_ptr()  # no copy of the cache
    assert torch.equal(keys, torch.cat([k, step], dim=2)) and torch.equal(values, torch.cat([v, step], dim=2))
    layer.batch_repeat_interleave(2)  # replaced from outside (as generate does for several samples per prompt)
    keys, _ = layer.update(step.repeat_interleave(2, dim=0), step.repeat_interleave(2, dim=0))
    assert keys.shape == (4, 3, 7, 4) and torch.equal(keys[1, :, :5], k[0]) and torch.equal(keys[3, :, 6], step[1, :, 0])
    for _ in range(5):  # past the reserved room: grows, keeps everything
        keys, _ = layer.update(step.repeat_interleave(2, dim=0), step.repeat_interleave(2, dim=0))
    assert keys.shape[2] == 12 and torch.equal(keys[0, :, :5], k[0])
