"""Forwards along the records' prefix tree (replay.share_prefix, optim.share_prefix) against the
whole padded forwards they replace: paired replay's log-probs, Δ and advantages, the reference
pass, the update's log-probs and gradients; fewer tokens forwarded."""

import random

import pytest
import torch

from orsd.train.model import autocast
from orsd.train.records import TurnRecord
from orsd.train.replay import ReplaySpec, paired_replay


def record(context, response, slot):
    return TurnRecord(turn=0, context_ids=list(context), response_ids=list(response),
                      rollout_logprobs=[0.0] * len(response), rubric_slot=slot, response_text="", action=None,
                      observation="", valid_action=False, no_progress=False, truncated=False,
                      context_truncated=False)


def records_and_rubrics(seed=0, count=9):
    """Contexts of 1-40 tokens, responses of 1-6, slots anywhere from 0 to the context's end (and -1:
    no slot), two different rubrics and records without one, so batches mix every case."""
    rng = random.Random(seed)
    rubrics = [[rng.randrange(3, 90) for _ in range(5)], [rng.randrange(3, 90) for _ in range(9)]]
    records, privileged = [], []
    for i in range(count):
        context = [rng.randrange(3, 90) for _ in range(rng.randint(1, 40))]
        slot = [0, len(context), -1][i] if i < 3 else rng.randint(0, len(context))
        records.append(record(context, [rng.randrange(3, 90) for _ in range(rng.randint(1, 6))], slot))
        privileged.append(None if i % 4 == 3 or slot < 0 else rubrics[i % 2])
    return records, privileged


def trie_size(sequences):
    """Tokens a forward along the sequences' prefix tree needs at least: their distinct prefixes."""
    return len({tuple(s[:end]) for s in sequences for end in range(1, len(s) + 1)})


def tokens_forwarded(model, fn):
    """Call fn() and count the tokens the decoder was given, padding (id 0, never a record's id here) aside."""
    count = [0]

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        count[0] += int((ids != 0).sum())

    handle = model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)
    try:
        out = fn()
    finally:
        handle.remove()
    return out, count[0]


@pytest.mark.parametrize("token_budget", [64, 4096])  # many small batches / one batch
@pytest.mark.parametrize("fused", [True, False])
def test_shared_prefix_equals_two_whole_passes(tiny_model, token_budget, fused):
    records, privileged = records_and_rubrics()
    advantages = [0.5 * i - 2 for i in range(len(records))]
    run = lambda share: paired_replay(tiny_model, records, advantages, privileged, 0.3,
                                      ReplaySpec(0.8, token_budget, fused=fused, share_prefix=share))
    shared, shared_tokens = tokens_forwarded(tiny_model, lambda: run(True))
    whole, whole_tokens = tokens_forwarded(tiny_model, lambda: run(False))
    assert shared.valid.sum() > 0 and torch.equal(shared.valid, whole.valid)
    assert shared.old_logprobs.double().numpy() == pytest.approx(whole.old_logprobs.double().numpy(), abs=2e-5)
    assert shared.delta.double().numpy() == pytest.approx(whole.delta.double().numpy(), abs=4e-5)
    assert shared.advantages.double().numpy() == pytest.approx(whole.advantages.double().numpy(), abs=2e-5)
    assert (shared.old_logprobs[shared.packed.response_mask] != 0).any()
    # each pass along its own prefix tree: what the plain sequences share is forwarded once, and
    # what the spliced ones share (their context up to the slot, then a rubric) once; a leaf may
    # repeat at most its scored positions (from the last context token on)
    plain = [r.context_ids + r.response_ids for r in records]
    spliced = [r.context_ids[:r.rubric_slot] + p + r.context_ids[r.rubric_slot:] + r.response_ids
               for r, p in zip(records, privileged) if p is not None]
    scored = sum(len(r.response_ids) + 1 for r in records)
    assert shared_tokens <= trie_size(plain) + trie_size(spliced) + 2 * scored
    assert shared_tokens <= whole_tokens


def test_paired_replay_forwards_what_a_step_shares_once(tiny_model):
    """On records shaped like a step's (one system prompt, tasks with several episodes, a full
    history; a rubric per task at the slot after the task), both passes forward far fewer tokens."""
    records = group_records(seed=5)
    rubrics = [[7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
    privileged = [rubrics[i // 9] if i < 18 else None for i in range(len(records))]
    advantages = [1.0] * len(records)
    run = lambda share: paired_replay(tiny_model, records, advantages, privileged, 0.3,
                                      ReplaySpec(1.0, 4096, share_prefix=share))
    shared, shared_tokens = tokens_forwarded(tiny_model, lambda: run(True))
    whole, whole_tokens = tokens_forwarded(tiny_model, lambda: run(False))
    assert whole_tokens == sum(r.num_tokens for r in records) + sum(r.num_tokens + len(p) for r, p in
                                                                    zip(records, privileged) if p is not None)
    assert shared_tokens < 0.5 * whole_tokens
    assert shared.valid.sum() > 0 and torch.equal(shared.valid, whole.valid)
    torch.testing.assert_close(shared.delta, whole.delta, rtol=0, atol=4e-5)


@pytest.mark.parametrize("token_budget", [48, 4096])  # branch batches split by the budget / one batch
# a full history: a trajectory's turns chain, its last turn kept for all; or turns that do not
# chain (as on the default shape, where histories render earlier replies differently): every
# distinct record kept, the rubric pass's rows each from another kept sequence
@pytest.mark.parametrize(("history", "kept_count"), [(True, 6 + 1), (False, 18 + 1)])
def test_rubric_pass_continues_from_the_plain_pass(tiny_model, token_budget, history, kept_count):
    """replay.reuse_plain: the rubric pass starts each record's sequence from the plain pass's keys
    and values at its slot. Same log-probs, Δ and advantages as recomputing the shared context
    (fp32), and the rubric pass forwards only each record's rubric and what follows its slot
    (fewer where the rubric starts with the tokens that follow the slot in a kept sequence)."""
    from orsd.train.replay import ReplaySpec, plain_replay

    records = group_records(seed=6, history=history)
    rubrics = [[7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
    privileged = [rubrics[i // 9] if i < 18 else None for i in range(len(records))]
    advantages = [float(i % 3) - 1 for i in range(len(records))]
    plain = plain_replay(tiny_model, records, ReplaySpec(1.0, token_budget), keep_prefixes=True)
    kept = plain.prefixes
    # kept: the sequences no other extends (with a history, each trajectory's last turn), and the
    # unrelated record
    sequences = {tuple(r.context_ids + r.response_ids) for r in records}
    ends = {s for s in sequences if not any(o != s and o[:len(s)] == s for o in sequences)}
    assert {tuple(s) for s in kept.sequences} == ends and len(ends) == kept_count <= len(sequences)
    assert all(len(kv) == len(tiny_model.get_decoder().layers) for kv in kept.kv)
    reused, reused_tokens = tokens_forwarded(tiny_model, lambda: paired_replay(
        tiny_model, records, advantages, privileged, 0.3, ReplaySpec(1.0, token_budget), plain=plain))
    assert plain.prefixes is None  # released once the rubric pass ran
    again, again_tokens = tokens_forwarded(tiny_model, lambda: paired_replay(
        tiny_model, records, advantages, privileged, 0.3, ReplaySpec(1.0, token_budget, reuse_plain=False),
        plain=plain_replay(tiny_model, records, ReplaySpec(1.0, token_budget))))
    assert reused.valid.sum() > 0 and torch.equal(reused.valid, again.valid)
    torch.testing.assert_close(reused.old_logprobs, again.old_logprobs, rtol=0, atol=0)
    torch.testing.assert_close(reused.delta, again.delta, rtol=0, atol=4e-5)
    torch.testing.assert_close(reused.advantages, again.advantages, rtol=0, atol=2e-5)
    branches = sum(len(p) + r.num_tokens - r.rubric_slot for r, p in zip(records, privileged) if p is not None)
    assert reused_tokens <= branches < again_tokens


@pytest.mark.parametrize("token_budget", [48, 4096])
def test_rubric_pass_forwards_a_stem_its_records_share_once(tiny_model, token_budget):
    """Records whose contexts agree up to the slot (a group's N first turns) continue from the same
    kept sequence there and carry the same rubric: the rubric and what follows the slot up to the
    response (the generation prompt) are forwarded once, each record then forwarding only its last
    context token and its response. Δ as without reuse (fp32); a stem that saves less than one more
    forward costs (PAD_TOKENS) is not made."""
    from orsd.engines.tree import PAD_TOKENS
    from orsd.train.replay import ReplaySpec, plain_replay

    rng = random.Random(11)
    tokens = lambda n: [rng.randrange(3, 60) for _ in range(n)]  # noqa: E731
    prompt_tail = [61, 62, 63]  # the generation prompt after the slot (action placement)
    long_rubric, short_rubric = [rng.randrange(64, 90) for _ in range(70)], [64, 65]
    records, privileged, sets = [], [], []
    for size, rubric in ((4, long_rubric), (3, long_rubric), (3, short_rubric)):
        context = tokens(rng.randint(5, 20)) + prompt_tail
        sets.append((size, len(rubric)))
        for _ in range(size):
            records.append(record(context, tokens(rng.randint(1, 5)), len(context) - len(prompt_tail)))
            privileged.append(rubric)
    records.append(record(tokens(9) + prompt_tail, [7, 8], 9))  # a record of its own
    privileged.append(long_rubric)
    advantages = [1.0] * len(records)
    plain = plain_replay(tiny_model, records, ReplaySpec(1.0, token_budget), keep_prefixes=True)
    reused, reused_tokens = tokens_forwarded(tiny_model, lambda: paired_replay(
        tiny_model, records, advantages, privileged, 0.5, ReplaySpec(1.0, token_budget), plain=plain))
    again = paired_replay(tiny_model, records, advantages, privileged, 0.5,
                          ReplaySpec(1.0, token_budget, reuse_plain=False))
    assert reused.valid.sum() > 0 and torch.equal(reused.valid, again.valid)
    torch.testing.assert_close(reused.delta, again.delta, rtol=0, atol=4e-5)
    # a record continues at its slot, its rubric and the generation prompt up to the position that
    # scores its first response token in a stem where one is made, then that position and its response
    own = lambda r, p: len(p) + len(prompt_tail) + len(r.response_ids)  # noqa: E731
    expected, start = 0, 0
    for size, rubric_length in sets:
        members = records[start:start + size]
        stem = rubric_length + len(prompt_tail) - 1
        assert ((size - 1) * stem > PAD_TOKENS) == (rubric_length == len(long_rubric))
        if (size - 1) * stem > PAD_TOKENS:
            expected += stem + sum(1 + len(r.response_ids) for r in members)
        else:
            expected += sum(own(r, privileged[start]) for r in members)
        start += size
    expected += own(records[-1], privileged[-1])
    assert reused_tokens == expected < sum(own(r, p) for r, p in zip(records, privileged))


def test_continue_from_leaves_the_callers_cache_as_it_was(tiny_model):
    """The stems live in a cache of the pass's own: the plain pass's kept sequences are what they were."""
    from orsd.engines.prefill import PrefixCache, shared_prefix_hidden

    base = list(range(3, 20))
    stem = list(range(40, 100))
    cache = PrefixCache()
    with torch.no_grad():
        shared_prefix_hidden(tiny_model, [base], [[len(base) - 1]], keep_into=cache)
        sequences = [base + stem + [k, k + 1] for k in (5, 7, 9)]
        needed = [[len(base) + len(stem) + 1]] * 3
        with_stem = shared_prefix_hidden(tiny_model, sequences, needed, prefixes=cache)
        whole = shared_prefix_hidden(tiny_model, sequences, needed)
    assert len(cache) == 1 and cache.sequences == [base]
    for a, b in zip(with_stem, whole):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


def test_continued_rows_batch_by_their_starts_as_well_as_their_lengths():
    """The rubric pass's rows each continue from a cache of their own, padded to the batch's latest
    start: rows of the same length but far-apart starts go to different forwards, and every batch
    keeps the padding and budget bounds its docstring states."""
    from orsd.engines.tree import PAD_TOKENS, Hanging, _batches, _continued_batches

    rows = [Hanging(start, [1] * 200, i) for i, start in enumerate([400, 10, 400, 10])]
    assert len(_batches(rows, 400)) == 1  # by length alone: one forward, every cache padded to 400
    assert [sorted(item.prompt for item in batch) for batch in _continued_batches(rows)] == [[1, 3], [0, 2]]

    rng = random.Random(3)
    rows = [Hanging(rng.randrange(0, 600), [1] * rng.randrange(1, 400), i) for i in range(60)]
    batches = _continued_batches(rows, token_budget=4096)
    assert sorted(item.prompt for batch in batches for item in batch) == list(range(60))
    for batch in batches:
        start, width = max(i.start for i in batch), max(len(i.tokens) for i in batch)
        tokens = sum(len(i.tokens) for i in batch)
        pairs = sum(len(i.tokens) * (i.start + len(i.tokens)) for i in batch)
        assert len(batch) == 1 or len(batch) * (start + width) <= 4096
        assert len(batch) * width - tokens <= 0.25 * tokens + PAD_TOKENS
        assert len(batch) * width * (start + width) - pairs <= 0.25 * pairs + PAD_TOKENS * (start + width)
    assert len(batches) < 60  # rows do share forwards


def test_prefix_cache_refuses_frozen_states_and_picks_the_longest(tiny_model):
    from orsd.engines.prefill import PrefixCache, shared_prefix_hidden

    cache = PrefixCache()
    kv = [(torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))]
    cache.add([1, 2, 3, 4], kv)
    cache.add([1, 2, 5, 6], kv)
    assert cache.longest([1, 2, 5, 9]) == (1, 3) and cache.longest([1, 2, 3, 4, 7]) == (0, 4)
    assert cache.longest([9, 1]) == (-1, 0)
    with pytest.raises(ValueError, match="not with states"):
        shared_prefix_hidden(tiny_model, [[1, 2, 3]], [[1]], states=[torch.zeros(3, 8)], split=1, prefixes=cache)


def test_shared_prefix_under_bf16_autocast(tiny_model):
    """The default run replays under bf16 autocast: the two paths agree to bf16 precision."""
    records, privileged = records_and_rubrics(seed=1)
    advantages = [1.0] * len(records)
    with autocast(tiny_model, "bfloat16"):
        shared = paired_replay(tiny_model, records, advantages, privileged, 1.0,
                               ReplaySpec(1.0, 4096, share_prefix=True))
        whole = paired_replay(tiny_model, records, advantages, privileged, 1.0,
                              ReplaySpec(1.0, 4096, share_prefix=False))
    mask = shared.packed.response_mask
    assert torch.isfinite(shared.old_logprobs).all() and torch.isfinite(shared.delta).all()
    assert shared.old_logprobs[mask].numpy() == pytest.approx(whole.old_logprobs[mask].numpy(), abs=0.1)
    assert shared.delta[mask].numpy() == pytest.approx(whole.delta[mask].numpy(), abs=0.15)


def test_no_rubric_anywhere_gives_the_plain_pass(tiny_model):
    """GRPO's replay (no privileged ids) goes through the same path; Δ = 0, e = 0, A = A_GRPO."""
    records, _ = records_and_rubrics(seed=2)
    advantages = [float(i) for i in range(len(records))]
    shared = paired_replay(tiny_model, records, advantages, [None] * len(records), 0.5, ReplaySpec(1.0, 128))
    whole = paired_replay(tiny_model, records, advantages, [None] * len(records), 0.5,
                          ReplaySpec(1.0, 128, share_prefix=False))
    assert not shared.valid.any() and (shared.delta == 0).all()
    assert shared.old_logprobs.numpy() == pytest.approx(whole.old_logprobs.numpy(), abs=2e-5)
    assert torch.equal(shared.advantages, whole.advantages)


def group_records(seed=1, history=False):
    """What a step's records share: one system prompt, two tasks with three episodes each, later
    turns whose context extends an earlier turn's (a full history: with `history`, its response
    too, as a rollout's records are, and the rubric slot before each turn's observation), a repeated
    record, and a record with a one-token response."""
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(3, 90) for _ in range(n)]  # noqa: E731
    system = tokens(12)
    records = []
    for _ in range(2):
        task = system + tokens(9)
        for _ in range(3):
            context, slot = task + tokens(rng.randint(1, 5)), len(task)
            for turn in range(3):
                records.append(record(context, tokens(rng.randint(1, 5)), slot))
                # the next turn extends this context; with `history` its slot is where its new
                # observation starts (rubric.placement=observation), else after the task
                seen = context + records[-1].response_ids * history
                context, slot = seen + tokens(rng.randint(2, 6)), (len(seen) if history else slot)
    records.append(record(records[4].context_ids, records[4].response_ids, 0))
    records.append(record(tokens(7), [5], 0))
    return records


@pytest.mark.parametrize("token_budget", [48, 4096])  # leaf batches split by the budget / one batch
@pytest.mark.parametrize("fused", [True, False])
def test_reference_pass_with_shared_prefixes_equals_whole_forwards(tiny_model, token_budget, fused):
    """replay_logprobs(share_prefix=True), the reference pass: the log-probs of whole padded
    forwards (fp32) at every response token, 0 elsewhere, from far fewer tokens forwarded."""
    from orsd.train.forward import replay_logprobs
    from orsd.train.packing import pack

    packed = pack(group_records())
    run = lambda share: replay_logprobs(tiny_model, packed.ids, packed.cu_seqlens, packed.response_mask,  # noqa: E731
                                        0.8, token_budget, fused, share_prefix=share)
    shared, shared_tokens = tokens_forwarded(tiny_model, lambda: run(True))
    whole, whole_tokens = tokens_forwarded(tiny_model, lambda: run(False))
    scored = packed.response_mask & (torch.arange(len(packed.ids)) > packed.cu_seqlens[packed.seq_ids])
    assert torch.all(whole[scored] < 0) and torch.all(shared[~scored] == 0)
    torch.testing.assert_close(shared, whole, rtol=0, atol=2e-5)
    assert shared_tokens < 0.6 * whole_tokens
    assert tiny_model.training  # restored (the fixture's model trains)


def test_reference_pass_under_bf16_autocast_is_close_to_whole_forwards(tiny_model):
    from orsd.train.forward import replay_logprobs
    from orsd.train.packing import pack

    packed = pack(group_records(seed=2))
    with autocast(tiny_model, "bfloat16"):
        shared, whole = (replay_logprobs(tiny_model, packed.ids, packed.cu_seqlens, packed.response_mask, 1.0, 4096,
                                         share_prefix=share) for share in (True, False))
    assert (shared - whole).abs().max() < 0.05 and shared.abs().sum() > 1


@pytest.mark.parametrize("lm_head", ["fused", "chunked"])
@pytest.mark.parametrize("top", [0, 1])  # every layer trained / the lower layer frozen (optim.train_layers)
def test_update_forward_with_shared_prefixes_equals_whole_forwards(tiny_model, lm_head, top):
    """train_logprobs(share_prefix=True), the update's and the warm start's forward: the log-probs
    and every parameter's gradient of whole padded forwards (fp32), from fewer tokens forwarded."""
    from orsd.train.model import freeze_below
    from orsd.train.forward import train_logprobs
    from orsd.train.packing import batch_positions, pack

    packed = pack(group_records(seed=3))
    batch = list(range(packed.num_sequences))
    positions = batch_positions(packed.response_mask, packed.cu_seqlens, batch)
    weights = torch.randn(int(sum(len(p) for p in positions)), generator=torch.Generator().manual_seed(0))
    freeze_below(tiny_model, top, "optim.train_layers")
    trained = [p for p in tiny_model.parameters() if p.requires_grad]
    assert 0 < len(trained) and (top == 0) == (len(trained) == len(list(tiny_model.parameters())))

    def run(share):
        tiny_model.zero_grad(set_to_none=True)
        logprobs, _, _ = train_logprobs(tiny_model, packed.ids, packed.cu_seqlens, batch, positions, 0.8,
                                        lm_head=lm_head, share_prefix=share)
        (weights * logprobs).sum().backward()
        return logprobs.detach(), [p.grad.clone() for p in trained]

    (shared, shared_grads), shared_tokens = tokens_forwarded(tiny_model, lambda: run(True))
    (whole, whole_grads), whole_tokens = tokens_forwarded(tiny_model, lambda: run(False))
    torch.testing.assert_close(shared, whole, rtol=0, atol=2e-5)
    for a, b in zip(shared_grads, whole_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert all(float(g.abs().sum()) > 0 for g in whole_grads)
    assert shared_tokens < 0.6 * whole_tokens


def test_update_with_shared_prefixes_takes_the_same_step(tiny_model):
    """loss.update with optim.share_prefix on and off: the same metrics and the same weights after
    the step (fp32, a step with PPO clipping and the k3 KL active)."""
    import copy

    from orsd.train.loss import UpdateSpec, update
    from orsd.train.packing import pack

    packed = pack(group_records(seed=4))
    generator = torch.Generator().manual_seed(1)
    n = len(packed.ids)
    old = -torch.rand(n, generator=generator) * 3
    ref = old + 0.1 * torch.randn(n, generator=generator)
    advantages = torch.randn(n, generator=generator)
    results = []
    for share in (True, False):
        model = copy.deepcopy(tiny_model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        metrics = update(model, optimizer, packed, old, ref, advantages,
                         UpdateSpec(temperature=1.0, micro_batch_tokens=96, clip_eps=0.2, dual_clip=3.0,
                                    log_ratio_clamp=20.0, kl_coef=0.05, grad_clip=1.0, share_prefix=share))
        results.append(({k: m.value for k, m in metrics.items()}, [p.detach().clone() for p in model.parameters()]))
    (shared_metrics, shared_weights), (whole_metrics, whole_weights) = results
    assert shared_metrics["micro_batches"] == whole_metrics["micro_batches"] > 1
    for key in ("loss", "kl", "clip_fraction", "grad_norm"):
        assert shared_metrics[key] == pytest.approx(whole_metrics[key], rel=1e-4, abs=1e-6)
    assert shared_metrics["clip_fraction"] > 0
    for a, b in zip(shared_weights, whole_weights):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="packing: 'tree'; expected 'prefix' or 'length'"):
        update(model, optimizer, packed, old, ref, advantages,
               UpdateSpec(temperature=1.0, micro_batch_tokens=96, clip_eps=0.2, dual_clip=3.0, log_ratio_clamp=20.0,
                          kl_coef=0.05, grad_clip=1.0, packing="tree"))
