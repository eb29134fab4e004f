"""The update's two LM-head paths (optim.lm_head): the fused native op and the chunked torch
reference give the same log-probs, entropies and parameter gradients on the tiny model, and the
default path is the fused one."""

import warnings

import pytest
import torch

from orsd import ops
from orsd.train.loss import UpdateSpec, update
from orsd.train.metrics import values
from orsd.train.forward import train_logprobs
from orsd.train.packing import batch_positions, pack
from orsd.train.records import TurnRecord


def _records(tokenizer, count=3):
    generator = torch.Generator().manual_seed(1)
    vocab = len(tokenizer)
    records = []
    for s in range(count):
        context = torch.randint(4, vocab, (5 + 3 * s,), generator=generator).tolist()
        response = torch.randint(4, vocab, (4 + 2 * s,), generator=generator).tolist()
        records.append(TurnRecord(turn=0, context_ids=context, response_ids=response,
                                  rollout_logprobs=[-1.0] * len(response), rubric_slot=-1, response_text="",
                                  action=None, observation="", valid_action=False, no_progress=False,
                                  truncated=False, context_truncated=False))
    return records


def _logprobs_and_grads(model, packed, lm_head, precision="", temperature=0.7):
    model.zero_grad(set_to_none=True)
    batch = list(range(packed.num_sequences))
    positions = batch_positions(packed.response_mask, packed.cu_seqlens, batch)
    lp, entropy, _ = train_logprobs(model, packed.ids, packed.cu_seqlens, batch, positions, temperature,
                                    chunk_tokens=5, precision=precision, lm_head=lm_head)
    # a loss touching every token with a different weight, so that a permuted gradient would show
    (lp * torch.linspace(0.5, 1.5, len(lp))).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), entropy, grads


@pytest.fixture
def with_native_op():
    if ops.backend()["cpu"] != "native":
        pytest.fail("orsd._C is not built: the fused LM head cannot be tested against the reference")


@pytest.mark.parametrize("softcap, scale", [(0.0, 0.0), (3.0, 0.5)])
def test_fused_matches_chunked_in_fp32(tiny_model, tiny_tokenizer, with_native_op, softcap, scale):
    # soft-capping and a logit scale as Gemma / Cohere configs declare them (read by both paths)
    tiny_model.config.final_logit_softcapping = softcap or None
    tiny_model.config.logit_scale = scale or None
    packed = pack(_records(tiny_tokenizer))
    lp_c, ent_c, grads_c = _logprobs_and_grads(tiny_model, packed, "chunked")
    lp_f, ent_f, grads_f = _logprobs_and_grads(tiny_model, packed, "fused")
    torch.testing.assert_close(lp_f, lp_c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_f, ent_c, rtol=1e-5, atol=1e-5)
    assert grads_f.keys() == grads_c.keys() and len(grads_c) > 10
    for name in grads_c:
        torch.testing.assert_close(grads_f[name], grads_c[name], rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_fused_matches_chunked_under_bf16_autocast(tiny_model, tiny_tokenizer, with_native_op):
    packed = pack(_records(tiny_tokenizer))
    lp_c, _, grads_c = _logprobs_and_grads(tiny_model, packed, "chunked", precision="bfloat16")
    lp_f, _, grads_f = _logprobs_and_grads(tiny_model, packed, "fused", precision="bfloat16")
    # the chunked path rounds the logits to bf16 before the f32 softmax, the fused one does not
    torch.testing.assert_close(lp_f, lp_c, rtol=0, atol=0.1)
    head = "lm_head.weight" if "lm_head.weight" in grads_c else "model.embed_tokens.weight"
    cosine = torch.nn.functional.cosine_similarity(grads_f[head].flatten(), grads_c[head].flatten(), dim=0)
    assert cosine > 0.99
    assert all(g.dtype == torch.float32 for g in grads_f.values())  # master weights get f32 gradients


def test_fused_path_never_builds_tokens_by_vocab_logits(tiny_model, tiny_tokenizer, with_native_op, monkeypatch):
    import torch.nn.functional as F

    called = []
    original = F.linear
    vocab = tiny_model.get_output_embeddings().weight.shape[0]

    def spy(x, weight, bias=None):
        if weight.shape[0] == vocab:
            called.append(tuple(x.shape))
        return original(x, weight, bias)

    monkeypatch.setattr(F, "linear", spy)
    packed = pack(_records(tiny_tokenizer))
    _logprobs_and_grads(tiny_model, packed, "fused")
    assert called == []
    _logprobs_and_grads(tiny_model, packed, "chunked")
    assert called  # the spy does see the reference path's head matmul


def test_update_uses_the_fused_head_by_default_and_agrees_with_chunked(tiny_model, tiny_tokenizer, with_native_op):
    import copy

    records = _records(tiny_tokenizer)
    packed = pack(records)
    n = len(packed.ids)
    generator = torch.Generator().manual_seed(3)
    old = -torch.rand(n, generator=generator)
    ref = -torch.rand(n, generator=generator)
    advantages = torch.randn(n, generator=generator)
    results = {}
    for lm_head in ("fused", "chunked"):
        model = copy.deepcopy(tiny_model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        metrics = update(model, optimizer, packed, old, ref, advantages,
                         UpdateSpec(temperature=1.0, micro_batch_tokens=64, clip_eps=0.2, dual_clip=0.0,
                                    log_ratio_clamp=20.0, kl_coef=1e-3, grad_clip=0.0, lm_head=lm_head))
        results[lm_head] = (values(metrics), dict(model.named_parameters()))
    for key in ("loss", "entropy", "kl"):
        assert results["fused"][0][key] == pytest.approx(results["chunked"][0][key], rel=1e-5, abs=1e-7)
    for name, parameter in results["chunked"][1].items():
        torch.testing.assert_close(results["fused"][1][name], parameter, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert UpdateSpec(1.0, 64, 0.2, 0.0, 20.0, 0.0, 0.0).lm_head == "fused"  # the update's default


def test_bad_lm_head_name_is_refused(tiny_model, tiny_tokenizer):
    packed = pack(_records(tiny_tokenizer, 1))
    positions = batch_positions(packed.response_mask, packed.cu_seqlens, [0])
    with pytest.raises(ValueError, match="lm_head: 'cce'; expected 'fused' or 'chunked'"):
        train_logprobs(tiny_model, packed.ids, packed.cu_seqlens, [0], positions, 1.0, lm_head="cce")


def test_config_refuses_an_unknown_lm_head():
    from orsd.train.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="optim.lm_head"):
            load_config(None, ["optim.lm_head=full"])
