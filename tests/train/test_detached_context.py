"""The warm start's detached contexts (warmstart.detached_context_hidden): the whole forward's values,
the gradient of the answers alone (against transformers' own cache continuing a no-grad forward),
and the fit that uses them."""

import copy

import pytest
import torch

from orsd.engines import prefill
from orsd.train.model import freeze_below
from orsd.train.forward import train_logprobs
from orsd.train.packing import batch_positions, pack
from orsd.train.warmstart import detached_context_hidden, warm_start

from tiny_model import make_tiny_qwen3
from test_frozen_layers import demos
from test_shared_prefix import group_records


@pytest.fixture
def four_layers(tiny_tokenizer):
    return make_tiny_qwen3(tiny_tokenizer, layers=4).train()


def packed_batch(seed=3):
    """group_records: shared prefixes, a repeated record, a one-token response."""
    packed = pack(group_records(seed=seed))
    batch = list(range(packed.num_sequences))
    return packed, batch, batch_positions(packed.response_mask, packed.cu_seqlens, batch)


def logprobs_and_grads(model, packed, batch, positions, weights, **kwargs):
    trained = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    logprobs, _, _ = train_logprobs(model, packed.ids, packed.cu_seqlens, batch, positions, 0.8, **kwargs)
    (weights * logprobs).sum().backward()
    return logprobs.detach(), [p.grad.clone() for p in trained]


def reference(model, packed, batch, positions, weights):
    """Each sequence alone through transformers' DynamicCache: everything before its first predicting
    position under no_grad, the rest continuing from that cache under autograd."""
    trained = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    out, offset = [], 0
    for s, wanted in zip(batch, positions):
        start, end = int(packed.cu_seqlens[s]), int(packed.cu_seqlens[s + 1])
        sequence, first = packed.ids[start:end], int(wanted[0]) - start - 1
        with torch.no_grad():
            cache = model.model(input_ids=sequence[None, :first], use_cache=True).past_key_values
        hidden = model.model(input_ids=sequence[None, first:], past_key_values=cache, use_cache=True).last_hidden_state[0]
        logp = torch.log_softmax(model.lm_head(hidden[wanted - start - 1 - first]).float() / 0.8, dim=-1)
        lp = logp.gather(-1, packed.ids[wanted].unsqueeze(-1)).squeeze(-1)
        (weights[offset:offset + len(lp)] * lp).sum().backward()
        out.append(lp.detach())
        offset += len(lp)
    return torch.cat(out), [p.grad.clone() for p in trained]


@pytest.mark.parametrize("token_budget", [48, 0])  # many small forwards / everything at once
def test_detached_contexts_give_the_whole_forwards_values_and_the_answers_gradient(four_layers, token_budget):
    packed, batch, positions = packed_batch()
    weights = torch.randn(int(sum(len(p) for p in positions)), generator=torch.Generator().manual_seed(0))
    rows = lambda *args, **kw: detached_context_hidden(*args, **kw, token_budget=token_budget)  # noqa: E731
    detached, detached_grads = logprobs_and_grads(four_layers, packed, batch, positions, weights, hidden_rows=rows)
    whole, whole_grads = logprobs_and_grads(four_layers, packed, batch, positions, weights, share_prefix=True)
    alone, alone_grads = reference(four_layers, packed, batch, positions, weights)
    torch.testing.assert_close(detached, whole, rtol=0, atol=2e-5)
    torch.testing.assert_close(detached, alone, rtol=0, atol=2e-5)
    for a, b in zip(detached_grads, alone_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # the contexts' keys/values carry a gradient in the whole forward: leaving it out shows
    apart = [float((a - b).norm() / b.norm()) for a, b in zip(detached_grads, whole_grads) if float(b.norm()) > 0]
    assert max(apart) > 1e-2


def test_detached_contexts_from_frozen_states(four_layers):
    """Above frozen layers (the warm start's default): the same values and gradients as from token ids."""
    packed, batch, positions = packed_batch(seed=4)
    weights = torch.randn(int(sum(len(p) for p in positions)), generator=torch.Generator().manual_seed(1))
    freeze_below(four_layers, 2, "warm_start.train_layers")
    sequences = [packed.ids[int(packed.cu_seqlens[s]):int(packed.cu_seqlens[s + 1])].tolist() for s in batch]
    with torch.no_grad():
        states = prefill.bottom_states(four_layers, sequences, 2)
    calls = []
    hook = four_layers.model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    rows = lambda *args, **kw: detached_context_hidden(*args, **kw, token_budget=64)  # noqa: E731
    above, above_grads = logprobs_and_grads(four_layers, packed, batch, positions, weights, hidden_rows=rows,
                                            frozen_states=(2, states))
    assert not calls  # the frozen layers never ran
    hook.remove()
    ids, ids_grads = logprobs_and_grads(four_layers, packed, batch, positions, weights, hidden_rows=rows)
    torch.testing.assert_close(above, ids, rtol=0, atol=2e-5)
    for a, b in zip(above_grads, ids_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert len(above_grads) > 0 and all(float(g.abs().sum()) > 0 for g in above_grads)


def test_detached_contexts_refuse_a_sequence_without_context(four_layers):
    ids = torch.tensor([5, 6, 7, 8])
    cu = torch.tensor([0, 4])
    with pytest.raises(ValueError, match="at least one context token"):
        detached_context_hidden(four_layers, ids, cu, [0], [torch.tensor([1, 2, 3])])
    with pytest.raises(ValueError, match="a position to predict"):
        detached_context_hidden(four_layers, ids, cu, [0], [torch.tensor([], dtype=torch.long)])


def test_warm_start_with_detached_contexts_fits(four_layers, tiny_tokenizer):
    """Same first loss as the whole-gradient fit (same forward), and it learns; fewer tokens forwarded
    under autograd is what it is for (docs/training.md has the times)."""
    runs = {}
    for detach in (True, False):
        model = copy.deepcopy(four_layers)
        runs[detach] = warm_start(model, demos(tiny_tokenizer), epochs=3, lr=1e-2, batch_size=3, micro_batch_tokens=64,
                                  train_layers=2, share_prefix=True, token_budget=4096, detach_context=detach)
    assert len(runs[True]) == 6 and runs[True][0] == pytest.approx(runs[False][0], rel=1e-5)
    assert runs[True][-1] < 0.5 * runs[True][0]


def test_warm_start_refuses_detached_contexts_under_gradient_checkpointing(four_layers, tiny_tokenizer):
    four_layers.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="warm_start.detach_context"):
        warm_start(four_layers, demos(tiny_tokenizer), epochs=1, lr=1e-2, batch_size=3, detach_context=True)
