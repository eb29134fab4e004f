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
