"""Speculative bundle decoding (engines/speculative.py): the ids greedy decoding gives, the log-probs
a full forward gives, and the distribution the plain loop samples, with drafts accepted and refused."""

import collections

import pytest
import torch
from scipy import stats

from orsd.engines.decode import NGramBan
from orsd.engines.base import Sampling
from orsd.engines.hf import HfEngine
from orsd.engines.speculative import Lookup, banned_after

TEXTS = ["the agent clicks", "Task: put a clean apple in the fridge.", "yes no"]


def encode(tokenizer, texts):
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def peaked(model, factor: float):
    """The tiny model with its logits scaled by `factor` (its final norm's weight): its next-token
    distributions are too flat for sampled tokens to meet drafts often enough to test anything."""
    with torch.no_grad():
        model.model.norm.weight.mul_(factor)
    return model.eval()


def test_greedy_returns_the_plain_loops_ids_whatever_the_drafts(tiny_model, tiny_tokenizer):
    """Drafts that are right (the greedy continuations themselves) and drafts that are wrong (each
    prompt's end followed by other tokens): the same ids and log-probs as the plain loop, in fewer
    forwards where the drafts are right."""
    model = tiny_model.eval()
    prompts = encode(tiny_tokenizer, TEXTS)
    plain = HfEngine(model, tiny_tokenizer).generate(prompts, Sampling(max_new_tokens=24, greedy=True))
    right = HfEngine(model, tiny_tokenizer, draft_corpus=[p + g.ids for p, g in zip(prompts, plain)])
    wrong = HfEngine(model, tiny_tokenizer, draft_corpus=[p[-4:] + [(t + 1) % 300 + 5 for t in g.ids]
                                                          for p, g in zip(prompts, plain)])
    for engine in (right, wrong):
        got = engine.generate(prompts, Sampling(max_new_tokens=24, greedy=True, draft_tokens=5))
        for a, b in zip(got, plain):
            assert a.ids == b.ids and a.finished == b.finished
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    tokens = sum(len(g.ids) for g in plain)
    assert right.draft_stats.tokens == wrong.draft_stats.tokens == tokens
    assert right.draft_stats.accepted >= tokens // 2 and right.draft_stats.forwards <= 12
    assert wrong.draft_stats.drafted > 0 and wrong.draft_stats.accepted < right.draft_stats.accepted


def test_log_probs_are_a_full_forwards_after_refused_drafts(tiny_model, tiny_tokenizer):
    """Sampled with temperature, top-p and the n-gram ban, rows of different lengths accepting
    different counts: each row's log-probs equal a forward of its prompt and ids alone, so the
    keys/values of refused drafts (kept in the cache under a zero mask) and the positions after them
    change nothing."""
    model = peaked(tiny_model, 8)
    prompts = encode(tiny_tokenizer, TEXTS)
    sampling = Sampling(temperature=0.3, top_p=0.95, max_new_tokens=20, no_repeat_ngram_size=3, draft_tokens=4)
    likeliest = HfEngine(model, tiny_tokenizer).generate(
        prompts, Sampling(max_new_tokens=20, greedy=True, no_repeat_ngram_size=3))
    engine = HfEngine(model, tiny_tokenizer, draft_corpus=[p + g.ids for p, g in zip(prompts, likeliest)])
    torch.manual_seed(1)
    got = engine.generate(prompts, sampling)
    assert 0 < engine.draft_stats.accepted < engine.draft_stats.drafted  # drafts both kept and refused
    for prompt, generation in zip(prompts, got):
        ids = torch.tensor([prompt + generation.ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        expected = torch.log_softmax(logits / sampling.temperature, dim=-1).gather(
            -1, torch.tensor(generation.ids)[:, None])[:, 0]
        assert generation.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
        grams = [tuple((prompt + generation.ids)[i:i + 3]) for i in range(len(prompt + generation.ids) - 2)]
        assert len(set(grams)) == len(grams)  # the ban held at drafted positions too


def sequences(engine, prompt, rows, sampling):
    return collections.Counter(tuple(g.ids) for g in engine.generate([prompt] * rows, sampling))


@pytest.mark.parametrize("sampling", [
    Sampling(temperature=1.0, max_new_tokens=3, draft_tokens=2),
    Sampling(temperature=1.2, top_p=0.9, max_new_tokens=3, no_repeat_ngram_size=2, draft_tokens=2),
], ids=["temperature", "top-p-ban"])
def test_samples_the_plain_loops_distribution(tiny_model, tiny_tokenizer, sampling):
    """1,500 three-token continuations of one prompt each way, drafts from the likeliest
    continuation (so they are often kept): the counts of the commonest sequences do not differ
    beyond chance (chi-squared, fixed seeds). Keeping every draft that comes up, or a draft the
    policy would not have sampled, shifts mass onto the drafted sequence and fails this."""
    model = peaked(tiny_model, 4)
    prompt = encode(tiny_tokenizer, ["the agent clicks"])[0]
    plain = Sampling(sampling.temperature, sampling.top_p, sampling.max_new_tokens,
                     no_repeat_ngram_size=sampling.no_repeat_ngram_size)
    likeliest = HfEngine(model, tiny_tokenizer).generate([prompt], Sampling(max_new_tokens=3, greedy=True))[0].ids
    torch.manual_seed(0)
    expected = sequences(HfEngine(model, tiny_tokenizer), prompt, 1500, plain)
    engine = HfEngine(model, tiny_tokenizer, draft_corpus=[prompt + likeliest])
    torch.manual_seed(1)
    got = sequences(engine, prompt, 1500, sampling)
    assert engine.draft_stats.accepted > 150
    common = [s for s, _ in expected.most_common(8)]
    table = [[expected[s] for s in common] + [1500 - sum(expected[s] for s in common)],
             [got[s] for s in common] + [1500 - sum(got[s] for s in common)]]
    assert stats.chi2_contingency(table).pvalue > 0.01, table


def test_banned_after_is_the_ban_of_the_extended_row():
    """For random rows and continuations, what `banned_after` forbids is what a ban built on the
    extended row forbids."""
    generator = torch.Generator().manual_seed(0)
    for size in (1, 2, 3, 4):
        for _ in range(40):
            row = torch.randint(0, 5, (int(torch.randint(0, 9, (1,), generator=generator)),),
                                generator=generator).tolist()
            extra = torch.randint(0, 5, (int(torch.randint(0, 5, (1,), generator=generator)),),
                                  generator=generator).tolist()
            scores = torch.zeros(1, 5)
            NGramBan(size, [row + extra]).apply(scores)
            expected = set(torch.isinf(scores[0]).nonzero().flatten().tolist())
            assert set(banned_after(NGramBan(size, [row]), 0, extra)) == expected, (size, row, extra)


def test_lookup_drafts_what_followed_the_longest_match_last_seen():
    lookup = Lookup(corpus=[[1, 2, 3, 4, 5, 6]], prompts=[[9, 2, 3], [7, 7]])
    assert lookup.draft(0, 3) == [4, 5, 6]  # "2 3" ended the corpus's 2 3 4 ...
    lookup.extend(1, [8, 2, 3, 0, 0])  # row 1 now has "2 3" followed by 0 0: seen later, preferred
    assert lookup.draft(0, 2) == [0, 0]
    lookup.extend(0, [4])  # row 0 ends "2 3 4": the three-token match (the corpus) wins over "3 4"
    assert lookup.draft(0, 5) == [5, 6]
    assert lookup.draft(1, 4) == []  # row 1 ends "3 0 0", seen nowhere with anything after it
    lookup.extend(1, [0])
    assert lookup.draft(1, 4) == [0]  # its own earlier "0 0" was followed by 0
    assert Lookup([], [[1]]).draft(0, 4) == []


def test_bad_draft_settings_are_refused(tiny_model, tiny_tokenizer):
    from orsd.engines import speculative
    from orsd.engines.vllm import _check_sampling
    from orsd.train.config import ConfigError, load_config

    with pytest.raises(ValueError, match="sampling.draft_tokens"):
        speculative.decode(tiny_model, [[1, 2]], None, Sampling(draft_tokens=0), [0], 0)
    with pytest.raises(ValueError, match="sampling.draft_tokens"):
        _check_sampling(Sampling(draft_tokens=4))
    with pytest.raises(ConfigError, match="rubric.draft_tokens"):
        load_config(None, ["rollout.engine=vllm", "rubric.no_repeat_ngram_size=0"])
    assert load_config(None, ["rollout.engine=vllm", "rubric.no_repeat_ngram_size=0",
                              "rubric.draft_tokens=0"]).rubric.draft_tokens == 0
