"""Frozen bottom layers run once (engines/frozen.py): their states per sequence, and the layers
above started from them, against whole forwards; the warm start that reuses them."""

import copy

import pytest
import torch

from orsd.engines import frozen, prefill
from orsd.train.model import freeze_below
from orsd.train.forward import train_logprobs
from orsd.train.packing import batch_positions, pack
from orsd.train.warmstart import Demo, warm_start

from tiny_model import make_tiny_qwen3
from test_shared_prefix import group_records, tokens_forwarded


@pytest.fixture
def four_layers(tiny_tokenizer):
    return make_tiny_qwen3(tiny_tokenizer, layers=4).train()


def whole_states(model, sequence, split):
    """The states entering layer `split` of one sequence forwarded alone (output_hidden_states)."""
    out = model.get_decoder()(input_ids=torch.tensor([sequence]), output_hidden_states=True)
    return out.hidden_states[split][0]


def test_frozen_layers_counts_the_bottom_layers_without_gradients(four_layers):
    assert frozen.frozen_layers(four_layers) == 0  # everything trains
    freeze_below(four_layers, 1, "optim.train_layers")
    assert frozen.frozen_layers(four_layers) == 3
    four_layers.model.layers[1].mlp.up_proj.weight.requires_grad_(True)  # a trained layer ends the run
    assert frozen.frozen_layers(four_layers) == 1
    four_layers.model.embed_tokens.weight.requires_grad_(True)  # trained embeddings: nothing is frozen below
    assert frozen.frozen_layers(four_layers) == 0


def test_layer_range_runs_a_slice_and_gives_everything_back(four_layers):
    decoder = four_layers.model
    layers, config, norm = decoder.layers, decoder.config, decoder.norm
    indices = [layer.self_attn.layer_idx for layer in layers]
    with frozen.layer_range(decoder, 1, 3):
        assert list(decoder.layers) == list(layers[1:3]) and decoder.config.num_hidden_layers == 2
        assert [layer.self_attn.layer_idx for layer in decoder.layers] == [0, 1]
        assert isinstance(decoder.norm, torch.nn.Identity) and config.num_hidden_layers == 4
    with pytest.raises(RuntimeError, match="inside"):
        with frozen.layer_range(decoder, 2, 4):
            assert decoder.norm is norm  # the top keeps its final norm
            raise RuntimeError("inside")
    assert decoder.layers is layers and decoder.config is config and decoder.norm is norm
    assert [layer.self_attn.layer_idx for layer in layers] == indices
    for start, stop in ((0, 0), (3, 2), (-1, 2), (0, 5)):
        expected = rf"layer_range: \[{start}, {stop}\) is not a range of the decoder's 4 layers"
        with pytest.raises(ValueError, match=expected):
            with frozen.layer_range(decoder, start, stop):
                pass


@pytest.mark.parametrize("token_budget", [40, 0])  # many small forwards / one batch per trunk
def test_bottom_states_equal_each_sequence_forwarded_alone(four_layers, token_budget):
    """Every position's state (a trunk's shared prefix included) from fewer tokens forwarded."""
    sequences = [r.context_ids + r.response_ids for r in group_records(seed=5)]
    with torch.no_grad():
        states, tokens = tokens_forwarded(four_layers, lambda: prefill.bottom_states(four_layers, sequences, 2,
                                                                                     token_budget))
        for sequence, got in zip(sequences, states):
            assert got.shape == (len(sequence), 64) and got.dtype == torch.float32
            torch.testing.assert_close(got, whole_states(four_layers, sequence, 2), rtol=1e-4, atol=5e-5)
    assert tokens < 0.6 * sum(len(s) for s in sequences)


@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("split", [1, 3])
def test_the_layers_above_from_frozen_states_give_the_whole_forward(four_layers, share_prefix, split):
    """train_logprobs(frozen_states=...): the log-probs and every trained parameter's gradient of
    whole forwards (fp32), without running a frozen layer."""
    packed = pack(group_records(seed=3))
    batch = list(range(packed.num_sequences))
    positions = batch_positions(packed.response_mask, packed.cu_seqlens, batch)
    weights = torch.randn(int(sum(len(p) for p in positions)), generator=torch.Generator().manual_seed(0))
    freeze_below(four_layers, 4 - split, "optim.train_layers")
    assert frozen.frozen_layers(four_layers) == split and frozen.serves(four_layers, split)
    trained = [p for p in four_layers.parameters() if p.requires_grad]
    sequences = [packed.ids[int(packed.cu_seqlens[s]):int(packed.cu_seqlens[s + 1])].tolist() for s in batch]
    with torch.no_grad():
        states = prefill.bottom_states(four_layers, sequences, split)
    calls = []
    hook = four_layers.model.layers[0].register_forward_hook(lambda *_: calls.append(1))

    def run(frozen_states):
        four_layers.zero_grad(set_to_none=True)
        logprobs, _, _ = train_logprobs(four_layers, packed.ids, packed.cu_seqlens, batch, positions, 0.8,
                                        share_prefix=share_prefix, frozen_states=frozen_states)
        (weights * logprobs).sum().backward()
        return logprobs.detach(), [p.grad.clone() for p in trained]

    reused, reused_grads = run((split, states))
    assert not calls  # the bottom layer never ran
    whole, whole_grads = run(None)
    hook.remove()
    assert calls
    torch.testing.assert_close(reused, whole, rtol=0, atol=2e-5)
    for a, b in zip(reused_grads, whole_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(float(g.abs().sum()) > 0 for g in whole_grads)


def demos(tokenizer, count=6):
    text = "Task: put a clean apple in the fridge. Observation 0: You are in the middle of a room."
    answer = tokenizer.encode("Action 1: go to countertop 1", add_special_tokens=False)
    return [Demo(tokenizer.encode(text, add_special_tokens=False)[: 10 + 3 * i], answer[: 4 + i]) for i in range(count)]


def test_warm_start_reusing_frozen_states_fits_the_same_weights(four_layers, tiny_tokenizer):
    """Two epochs with reuse_frozen on and off: the same losses and weights (fp32); with it on the
    frozen layers run in one pass before the first epoch and never in the fit."""
    initial = [p.detach().clone() for p in four_layers.parameters()]
    runs = []
    for reuse in (True, False):
        model = copy.deepcopy(four_layers)
        calls = []
        model.model.layers[0].register_forward_hook(lambda *_: calls.append(1))
        losses = warm_start(model, demos(tiny_tokenizer), epochs=2, lr=1e-2, batch_size=2, micro_batch_tokens=64,
                            train_layers=2, share_prefix=True, reuse_frozen=reuse, token_budget=4096)
        runs.append((losses, [p.detach().clone() for p in model.parameters()], len(calls)))
    (reused, reused_weights, reused_calls), (whole, whole_weights, whole_calls) = runs
    assert len(reused) == 6 and reused == pytest.approx(whole, rel=1e-4, abs=1e-6) and reused[-1] < reused[0]
    for a, b, start in zip(reused_weights, whole_weights, initial):
        # AdamW moves an element whose gradient is ~0 by up to lr on rounding alone (its first step is
        # lr * sign(g)), so a single element may differ by a sizeable part of the fit's largest move
        # (on an AVX2-only CPU one did: 0.0016 of 0.060): compare each tensor's whole difference with
        # how far the fit moved it
        assert float((a - b).norm()) <= 0.01 * float((b - start).norm()) + 1e-7
    assert reused_calls <= 4  # serves()'s check (two), the six along their prefix tree (a trunk, a batch)
    assert whole_calls >= 6  # every micro-batch of both epochs


def test_a_decoder_that_transforms_its_inputs_is_not_split(four_layers, tiny_tokenizer, monkeypatch):
    """Simulated: an architecture whose forward rescales inputs_embeds (as Gemma's did before its
    scaling moved into the embedding) fails the check, and the warm start forwards every layer."""
    decoder = four_layers.model
    forward = decoder.forward

    def scaled(*args, inputs_embeds=None, **kwargs):
        return forward(*args, inputs_embeds=None if inputs_embeds is None else inputs_embeds * 8.0, **kwargs)

    monkeypatch.setattr(decoder, "forward", scaled)
    freeze_below(four_layers, 2, "optim.train_layers")
    assert not frozen.serves(four_layers, 2)
    for p in four_layers.parameters():
        p.requires_grad_(True)
    calls = []
    decoder.layers[0].register_forward_hook(lambda *_: calls.append(1))
    warm_start(four_layers, demos(tiny_tokenizer), epochs=1, lr=1e-2, batch_size=2, micro_batch_tokens=64,
               train_layers=2)
    assert len(calls) >= 3  # every micro-batch ran the bottom layers


def test_paired_replay_keeps_the_frozen_states_and_gives_the_same_numbers(four_layers):
    """reuse_frozen: the plain pass runs the frozen layers once per record and the rest from their
    states: the same log-probs, Δ and advantages as whole forwards (fp32), and the states kept are
    each record's own. With every layer trained there is nothing to keep."""
    from orsd.train.replay import ReplaySpec, paired_replay

    from test_shared_prefix import records_and_rubrics

    records, privileged = records_and_rubrics(seed=2)
    advantages = [(-1.0) ** i for i in range(len(records))]
    with torch.no_grad():
        plain = paired_replay(four_layers, records, advantages, privileged, 0.5,
                              ReplaySpec(0.9, 4096, reuse_frozen=True))
        assert plain.frozen_states is None  # nothing frozen
        freeze_below(four_layers, 2, "optim.train_layers")
        reused = paired_replay(four_layers, records, advantages, privileged, 0.5,
                               ReplaySpec(0.9, 4096, reuse_frozen=True))
        whole = paired_replay(four_layers, records, advantages, privileged, 0.5,
                              ReplaySpec(0.9, 4096, reuse_frozen=False))
        assert whole.frozen_states is None
        split, states = reused.frozen_states
        assert split == 2 and len(states) == len(records)
        for record, got in zip(records, states):
            torch.testing.assert_close(got, whole_states(four_layers, record.context_ids + record.response_ids, 2),
                                       rtol=1e-4, atol=5e-5)
    for name in ("old_logprobs", "delta", "advantages"):
        torch.testing.assert_close(getattr(reused, name), getattr(plain, name), rtol=0, atol=2e-5)
        torch.testing.assert_close(getattr(whole, name), getattr(plain, name), rtol=0, atol=2e-5)
    assert reused.valid.any() and torch.equal(reused.valid, plain.valid)


def test_the_reference_pass_and_the_update_from_the_plain_pass_states(four_layers):
    """The reference (a frozen copy) and the update started from the replay's states: the reference
    log-probs, the update's metrics and the weights after it equal those of whole forwards."""
    from orsd.train.loss import UpdateSpec, update
    from orsd.train.model import frozen_copy
    from orsd.train.forward import replay_logprobs
    from orsd.train.replay import ReplaySpec, paired_replay

    records = group_records(seed=6)
    freeze_below(four_layers, 2, "optim.train_layers")
    reference = frozen_copy(four_layers)
    with torch.no_grad():
        replay = paired_replay(four_layers, records, [1.0, -1.0] * (len(records) // 2) + [0.5] * (len(records) % 2),
                               [None] * len(records), 0.0, ReplaySpec(1.0, 4096, reuse_frozen=True))
    p, states = replay.packed, replay.frozen_states
    assert states is not None
    refs = [replay_logprobs(reference, p.ids, p.cu_seqlens, p.response_mask, 1.0, 4096, share_prefix=True,
                            frozen_states=given) for given in (states, None)]
    torch.testing.assert_close(refs[0], refs[1], rtol=0, atol=2e-5)
    reference_lp = replay.old_logprobs + 0.1 * torch.randn(len(p.ids), generator=torch.Generator().manual_seed(2))
    results = []
    for given in (states, None):
        model = copy.deepcopy(four_layers)
        optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-3)
        metrics = update(model, optimizer, p, replay.old_logprobs, reference_lp, replay.advantages,
                         UpdateSpec(temperature=1.0, micro_batch_tokens=96, clip_eps=0.2, dual_clip=3.0,
                                    log_ratio_clamp=20.0, kl_coef=0.05, grad_clip=1.0, share_prefix=True,
                                    packing="prefix"), frozen_states=given)
        results.append(({k: m.value for k, m in metrics.items()}, [q.detach().clone() for q in model.parameters()]))
    (reused, reused_weights), (whole, whole_weights) = results
    assert reused["micro_batches"] == whole["micro_batches"] > 1
    for key in ("loss", "kl", "grad_norm"):
        assert reused[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6)
    assert whole["grad_norm"] > 0
    for a, b in zip(reused_weights, whole_weights):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("history", [False, True])
def test_the_rubric_pass_continues_from_a_plain_pass_that_ran_its_frozen_layers_apart(four_layers, history):
    """reuse_frozen and reuse_plain together (the CPU default: the top 15 of 30 layers trained): the
    plain pass keeps every layer's keys/values, the frozen layers' from bottom_states and the rest
    from the layers above, equal to those a plain pass without frozen layers keeps; the rubric pass
    continues from them (fewer tokens) and gives whole forwards' Δ and advantages (fp32)."""
    from orsd.train.replay import ReplaySpec, paired_replay, plain_replay

    records = group_records(seed=6, history=history)
    rubrics = [[7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
    privileged = [rubrics[i // 9] if i < 18 else None for i in range(len(records))]
    advantages = [float(i % 3) - 1 for i in range(len(records))]
    with torch.no_grad():
        unfrozen = plain_replay(four_layers, records, ReplaySpec(1.0, 4096, reuse_frozen=True), keep_prefixes=True)
        assert unfrozen.frozen_states is None
        freeze_below(four_layers, 2, "optim.train_layers")
        plain = plain_replay(four_layers, records, ReplaySpec(1.0, 4096, reuse_frozen=True), keep_prefixes=True)
        assert plain.frozen_states is not None and plain.frozen_states[0] == 2
        kept, expected = plain.prefixes, unfrozen.prefixes
        assert sorted(kept.sequences) == sorted(expected.sequences) and len(kept) > 0
        for sequence, kv in zip(kept.sequences, kept.kv):
            want = expected.kv[expected.sequences.index(sequence)]
            assert len(kv) == len(want) == 4  # every layer, the frozen ones first
            for (keys, values), (want_keys, want_values) in zip(kv, want):
                torch.testing.assert_close(keys, want_keys, rtol=1e-4, atol=5e-5)
                torch.testing.assert_close(values, want_values, rtol=1e-4, atol=5e-5)
        reused, reused_tokens = tokens_forwarded(four_layers, lambda: paired_replay(
            four_layers, records, advantages, privileged, 0.3, ReplaySpec(1.0, 4096, reuse_frozen=True), plain=plain))
        whole, whole_tokens = tokens_forwarded(four_layers, lambda: paired_replay(
            four_layers, records, advantages, privileged, 0.3, ReplaySpec(1.0, 4096, share_prefix=False)))
    assert reused.valid.any() and torch.equal(reused.valid, whole.valid)
    for name in ("old_logprobs", "delta", "advantages"):
        torch.testing.assert_close(getattr(reused, name), getattr(whole, name), rtol=0, atol=4e-5)
    branches = sum(len(p) + r.num_tokens - r.rubric_slot for r, p in zip(records, privileged) if p is not None)
    assert reused_tokens <= branches  # the rubric pass forwarded only what follows each record's slot


def test_the_reference_shares_the_policys_frozen_tensors_and_nothing_else(four_layers):
    """share_frozen: the reference's embeddings and frozen bottom layers become the policy's own
    tensors (one copy resident), its modules and the layers above stay its own; nothing is shared
    where every layer trains or the values differ."""
    from orsd.train.model import frozen_copy, share_frozen

    reference = frozen_copy(four_layers)
    assert share_frozen(four_layers, reference) == 0  # every layer trains
    freeze_below(four_layers, 2, "optim.train_layers")
    with torch.no_grad():
        reference.get_decoder().layers[0].mlp.up_proj.weight.add_(1.0)
    assert share_frozen(four_layers, reference) == 0  # not the same values
    reference = frozen_copy(four_layers)
    ids = torch.arange(3, 20).unsqueeze(0)
    with torch.no_grad():
        before = reference(input_ids=ids).logits
    assert share_frozen(four_layers, reference) == 2
    mine, theirs = four_layers.get_decoder(), reference.get_decoder()
    for a, b in zip([*mine.embed_tokens.parameters(), *mine.layers[0].parameters(), *mine.layers[1].parameters()],
                    [*theirs.embed_tokens.parameters(), *theirs.layers[0].parameters(), *theirs.layers[1].parameters()]):
        assert a is b
    for a, b in zip([*mine.layers[2].parameters(), *mine.layers[3].parameters(), *mine.norm.parameters()],
                    [*theirs.layers[2].parameters(), *theirs.layers[3].parameters(), *theirs.norm.parameters()]):
        assert a is not b and torch.equal(a, b)
    assert not any(a is b for a, b in zip(four_layers.modules(), reference.modules()))
    assert four_layers.get_output_embeddings().weight is mine.embed_tokens.weight  # a tied head (as SmolLM2's)
    assert reference.get_output_embeddings().weight is mine.embed_tokens.weight  # shares the tensor too
    with torch.no_grad():
        torch.testing.assert_close(reference(input_ids=ids).logits, before, rtol=0, atol=0)
        mine.layers[3].mlp.up_proj.weight.add_(1.0)  # the policy's update reaches only its own layers
        torch.testing.assert_close(reference(input_ids=ids).logits, before, rtol=0, atol=0)
