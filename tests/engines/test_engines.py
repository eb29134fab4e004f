"""The hf engine's decode loop (engines/decode.py): the same ids and log-probs as transformers'
`generate` (greedy, temperature, top-k, top-p, the n-gram ban that vLLM cannot honour), its decode
attention and reserved KV cache, and a frozen head cast once per call. Prefill (repeated and shared
prompts, the prefix tree) is in test_prefill.py."""

import pytest
import torch
from helpers.transformers_reference import transformers_generate

from orsd.engines.base import Sampling
from orsd.engines.hf import HfEngine
from orsd.train.config import ConfigError, load_config


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
    # under bf16 autocast keys leave the rotary embedding in fp32, values in bf16 (the reserved cache
    # stores both in bf16; a plain DynamicCache does not): both meet in bf16, as in autocast's sdpa
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, _ = sdpa_attention_forward(module, query, key, value.bfloat16(), mask, scaling=0.25)
        got, _ = gqa_decode_attention(module, query, key, value.bfloat16(), mask, scaling=0.25)
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=2e-2)
    # a few query tokens after a cache (a speculative step's drafts), each under its own mask row:
    # causal over the last 4 positions, left padding, and a hole a refused draft left
    few = torch.randn(3, 6, 4, 16, generator=generator)
    causal = torch.ones(3, 1, 4, 11, dtype=torch.bool).tril(diagonal=7)
    causal[0, ..., :4] = causal[2, ..., 5] = False
    expected, _ = sdpa_attention_forward(module, few, key, value, causal, scaling=0.25)
    got, _ = gqa_decode_attention(module, few, key, value, causal, scaling=0.25)
    assert got.shape == expected.shape == (3, 4, 6, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    prefill = torch.randn(3, 6, 11, 16, generator=generator)  # a prefill (no cache before it): transformers' own path
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


def test_reserved_layer_keeps_keys_in_the_values_dtype():
    """Under bf16 autocast keys leave the rotary embedding in fp32 and values in bf16: the cache keeps
    both in bf16 (what sdpa would cast them to), and same-dtype keys are stored as given."""
    from orsd.engines.kv_cache import ReservedLayer

    layer = ReservedLayer(capacity=8)
    k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4).bfloat16()
    keys, values = layer.update(k, v)
    assert keys.dtype == values.dtype == torch.bfloat16 and torch.equal(keys, k.bfloat16())
    keys, _ = layer.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4).bfloat16())
    assert keys.dtype == torch.bfloat16 and keys.shape[2] == 6 and layer._room[0].dtype == torch.bfloat16
    same = ReservedLayer(capacity=8)
    assert same.update(k, k)[0].dtype == torch.float32


def test_generation_under_bf16_autocast_follows_transformers_sdpa(tiny_model, tiny_tokenizer, monkeypatch):
    """bf16 autocast, as a CPU run generates: the reserved cache (bf16 keys) with the grouped-query
    decode attention gives the ids and log-probs of transformers' DynamicCache (fp32 keys) with its
    own sdpa, which casts the keys to bf16 at every step."""
    import contextlib

    from transformers.cache_utils import DynamicCache

    from orsd.engines import hf, kv_cache

    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False)
               for text in ("the agent clicks", "Task: put a clean apple in the fridge.", "yes no")]
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    sampling = Sampling(max_new_tokens=12, greedy=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = engine.generate(prompts, sampling)
        monkeypatch.setattr(hf, "decode_attention", lambda model: contextlib.nullcontext())
        monkeypatch.setattr(kv_cache, "reserved_cache", lambda model, capacity: DynamicCache(config=model.config))
        plain = engine.generate(prompts, sampling)
    for a, b in zip(fast, plain):
        assert a.ids == b.ids and len(a.ids) > 1
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)  # equal on the dev box; SDPA kernels may round differently elsewhere


@pytest.mark.parametrize("sampling", [
    Sampling(max_new_tokens=16, greedy=True),
    Sampling(temperature=0.7, top_p=0.8, max_new_tokens=16),
    Sampling(temperature=1.3, max_new_tokens=16),
    Sampling(temperature=0.5, top_p=0.9, max_new_tokens=24, no_repeat_ngram_size=2),
    Sampling(temperature=1.1, top_p=0.95, max_new_tokens=16, top_k=7),
], ids=["greedy", "temperature-top-p", "temperature", "ngram-ban", "top-k"])
def test_decode_samples_what_transformers_generate_samples(tiny_model, tiny_tokenizer, sampling):
    """The same seed, the same ids (stop ids and padding after them included) and log-probs as
    transformers' generate, on prompts of one length (transformers' n-gram ban counts left padding,
    ours does not) and, without the ban, on left-padded prompts of different lengths."""
    model = tiny_model.eval()
    engine = HfEngine(model, tiny_tokenizer)
    texts = ["the agent clicks", "Task: put a clean apple in the fridge.", "yes no"]
    if sampling.no_repeat_ngram_size:
        texts = ["the agent clicks the", "the agent clicks a"]
    prompts = [tiny_tokenizer.encode(text, add_special_tokens=False) for text in texts]
    torch.manual_seed(3)  # row 0's fourth token becomes a stop id, so rows stop at different steps
    stop_ids = engine.stop_ids = [engine._generate_batch(prompts, sampling)[0].ids[3], *engine.stop_ids]
    torch.manual_seed(3)
    expected_ids, expected_logprobs = transformers_generate(model, prompts, engine.pad_id, stop_ids, sampling)
    torch.manual_seed(3)
    got = engine._generate_batch(prompts, sampling)
    for row, generation in enumerate(got):
        reference = expected_ids[row].tolist()
        stop = next((k for k, token in enumerate(reference) if token in stop_ids), None)
        assert generation.ids == reference[:len(reference) if stop is None else stop + 1]
        assert generation.finished == (stop is not None)
        assert generation.logprobs == pytest.approx(expected_logprobs[row, :len(generation.ids)].tolist(), abs=1e-5)
    assert got[0].finished and len(got[0].ids) <= 4
    assert any(len(g.ids) > 4 for g in got)


def test_ngram_ban_forbids_exactly_the_tokens_that_would_repeat():
    from orsd.engines.decode import NGramBan

    ban = NGramBan(3, [[5, 6, 7, 5, 6]])  # 5 6 was followed by 7
    scores = torch.zeros(1, 10)
    ban.apply(scores)
    assert torch.isinf(scores[0]).nonzero().flatten().tolist() == [7]
    ban.extend([8])  # ... 6 8: no n-gram ends in "6 8 ?" yet
    scores = torch.zeros(1, 10)
    ban.apply(scores)
    assert not torch.isinf(scores).any()
    ban.extend([5]), ban.extend([6])  # 8 5 6 -> "5 6" now followed by 7 and 8
    scores = torch.zeros(1, 10)
    ban.apply(scores)
    assert sorted(torch.isinf(scores[0]).nonzero().flatten().tolist()) == [7, 8]


def test_a_frozen_head_is_cast_once_per_decode_call(tiny_model, tiny_tokenizer):
    """Under bf16 autocast a frozen fp32 head's weight is cast once per call, not at every step
    (autocast caches only weights that require grad), with the logits the model's own head gives."""
    from torch.profiler import profile

    from orsd.engines.decode import next_token_head

    model = tiny_model.eval()
    head = model.get_output_embeddings()
    head.weight.requires_grad_(False)
    try:
        hidden = torch.randn(3, model.config.hidden_size)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(next_token_head(model)(hidden), head(hidden))
            engine = HfEngine(model, tiny_tokenizer)
            with profile(record_shapes=True) as prof:
                generated = engine.generate([[10, 11, 12], [13, 14]], Sampling(max_new_tokens=6, greedy=True))
        assert all(len(g.ids) == 6 for g in generated)  # 6 steps, which would be 6 casts
        weight_shape = list(head.weight.shape)
        casts = [e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] == weight_shape]
        assert len(casts) == 1
    finally:
        head.weight.requires_grad_(True)


def test_top_k_samples_only_the_k_most_likely_tokens(tiny_model, tiny_tokenizer):
    """top_k=1 at a high temperature is greedy decoding (and equals transformers' top-k above), while
    the log-probs stay those of the whole temperature-scaled distribution."""
    prompts = [tiny_tokenizer.encode("the agent clicks", add_special_tokens=False)]
    engine = HfEngine(tiny_model.eval(), tiny_tokenizer)
    greedy = engine.generate(prompts, Sampling(max_new_tokens=12, greedy=True))[0]
    torch.manual_seed(0)
    top1 = engine.generate(prompts, Sampling(temperature=5.0, max_new_tokens=12, top_k=1))[0]
    assert top1.ids == greedy.ids
    assert all(lp < -1.0 for lp in top1.logprobs)  # at temperature 5 no token is near-certain
    with pytest.raises(ValueError, match="sampling.top_k=-1"):
        engine.generate(prompts, Sampling(max_new_tokens=4, top_k=-1))


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.95, 0.999])
def test_top_p_from_sorted_values_equals_transformers_warper(top_p):
    """The CPU path sorts values only (numpy) and cuts at the first kept value: the mask must be
    transformers' TopPLogitsWarper's, bit for bit, on SmolLM2-sized rows with banned (-inf) and
    top-k-filtered tokens, and it must actually be that path that answered."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from orsd.engines.decode import _top_p_by_values, top_k_filter, top_p_filter

    g = torch.Generator().manual_seed(int(top_p * 1000))
    scores = torch.randn(6, 49_152, generator=g) * torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0, 3.0])[:, None]
    scores[1, torch.randint(0, 49_152, (40,), generator=g)] = float("-inf")  # an n-gram ban
    scores[5] = top_k_filter(scores[5:6], 50)[0]  # top-k before top-p, as in the decode loop
    expected = TopPLogitsWarper(top_p)(None, scores.clone())
    assert _top_p_by_values(scores, top_p) is not None
    assert torch.equal(top_p_filter(scores, top_p), expected)
    assert ((expected == float("-inf")).sum(-1) > (scores == float("-inf")).sum(-1)).any()  # the cut removes tokens


def test_top_p_falls_back_to_the_index_sort_where_values_cannot_decide():
    """A tie across the cut (which of the equal scores goes is torch.sort's order) and a NaN row
    leave the values path (None); top_p_filter then is transformers' warper itself."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from orsd.engines.decode import _top_p_by_values, top_p_filter

    tie = torch.tensor([[0.0, 1.0, 1.0, 1.0, 3.0]])  # cumulative 0.034, 0.127, 0.220, 0.313, 1
    assert _top_p_by_values(tie, 0.85) is None  # 1 - 0.85 cuts between the first and second 1.0
    assert torch.equal(top_p_filter(tie, 0.85), TopPLogitsWarper(0.85)(None, tie.clone()))
    nan = torch.tensor([[0.0, float("nan"), 2.0]])
    assert _top_p_by_values(nan, 0.5) is None
    apart = torch.tensor([[0.0, 1.0, 1.5, 2.0, 3.0]])
    assert torch.equal(_top_p_by_values(apart, 0.5), TopPLogitsWarper(0.5)(None, apart.clone()))
