"""The paper's Eq. 2, 8, 9, 11 and 14 on small hand-checked cases, through the trainer's real code path."""

import copy

import pytest
import torch

from scripted import ScriptedEngine, small_config
from orsd.envs.base import Task
from orsd.methods import make_method
from orsd.train.build import build_verifier, make_env
from orsd.train.loss import UpdateSpec, per_token_loss
from orsd.train.loss import update as tagged_update
from orsd.train.metrics import values
from orsd.train.model import frozen_copy
from orsd.train.records import Group, Trajectory, TurnRecord
from orsd.train.packing import pack
from orsd.train.replay import ReplaySpec, paired_replay
from orsd.train.trainer import Trainer


def update(*args, **kwargs):
    return values(tagged_update(*args, **kwargs))


def record(context, response, slot=1):
    return TurnRecord(turn=0, context_ids=list(context), response_ids=list(response),
                      rollout_logprobs=[0.0] * len(response), rubric_slot=slot, response_text="", action=None,
                      observation="", valid_action=False, no_progress=False, truncated=False,
                      context_truncated=False)


def full_logprobs(model, ids, temperature=1.0):
    """log π(ids[p] | ids[<p]) for p ≥ 1 from one plain forward: the hand computation."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double() / temperature
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def test_eq2_grpo_advantages_per_group():
    method = make_method(small_config("method.name=grpo"))
    task = Task("t", "train", "d", "k")
    groups = [Group(task, [Trajectory(task, [], [], records=[record([1], [2])] * 2, reward=r) for r in rewards])
              for rewards in ([1.0, 0.0, 0.0, 1.0], [0.5, 0.5], [0.2])]
    advantages = method.advantages(groups)
    std = (4 * 0.25 / 3) ** 0.5  # sample std of [1, 0, 0, 1]
    up, down = 0.5 / (std + 1e-6), -0.5 / (std + 1e-6)
    assert advantages.episode[0] == pytest.approx([up, down, down, up], rel=1e-6)
    assert advantages.episode[1] == [0.0, 0.0]  # constant group
    assert advantages.episode[2] == [0.0]  # singleton
    assert advantages.turn[0][1] == pytest.approx([down, down], rel=1e-6)  # broadcast to every turn


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_eq8_9_delta_and_shaped_advantage(tiny_model, temperature):
    rubric = [7, 8, 9, 10]
    records = [record([1, 2, 3, 4, 5], [11, 12, 13], slot=2),
               record([1, 2, 6], [14, 15], slot=3),  # slot at the end of the context
               record([1, 3, 3, 3], [16], slot=1)]
    alpha, advantages = 0.5, [1.0, -2.0, 0.25]
    out = paired_replay(tiny_model, records, advantages, [rubric, rubric, None], alpha, ReplaySpec(temperature, 64))
    cursor = 0
    for s, rec in enumerate(records):
        plain = rec.context_ids + rec.response_ids
        spliced = rec.context_ids[:rec.rubric_slot] + rubric + rec.context_ids[rec.rubric_slot:] + rec.response_ids
        lp_without = full_logprobs(tiny_model, plain, temperature)[-len(rec.response_ids):]
        lp_with = full_logprobs(tiny_model, spliced, temperature)[-len(rec.response_ids):]
        span = slice(cursor + len(rec.context_ids), cursor + len(plain))
        assert out.old_logprobs[span].double() == pytest.approx(lp_without, abs=1e-5)
        if s < 2:  # eligible: Δ = lp_with − lp_without (Eq. 8), A = A_GRPO + α·Δ (Eq. 9)
            assert out.valid[span].all()
            assert out.delta[span].double() == pytest.approx(lp_with - lp_without, abs=1e-5)
            assert out.advantages[span].double() == pytest.approx(advantages[s] + alpha * (lp_with - lp_without),
                                                                  abs=1e-5)
        else:  # no rubric for this record: e = 0, Δ = 0, A = A_GRPO
            assert not out.valid[span].any()
            assert (out.delta[span] == 0).all()
            assert (out.advantages[span] == advantages[s]).all()
        context = slice(cursor, cursor + len(rec.context_ids))
        assert (out.advantages[context] == 0).all() and not out.valid[context].any()
        cursor += len(plain)


# lengths 6, 4, 7. length packing, 12 padded tokens: {rec1, rec0} (2 × 6) and {rec2}. prefix packing
# (sorted by tokens, 10 tokens forwarded): rec0's 6, rec1's 3 beyond the token it shares, then rec2
@pytest.mark.parametrize("packing, budget, grouping", [("length", 12, [[1, 0], [2]]), ("prefix", 10, [[0, 1], [2]])])
def test_eq11_14_update_gradient_equals_the_hand_written_loss(tiny_model, packing, budget, grouping):
    """Σ w·f over micro-batches equals Eq. 14: (1/G) Σ_mb (1/|mb tokens|) Σ_{t∈mb} f_t."""
    records = [record([1, 2, 3], [4, 5, 6]), record([1, 7], [8, 9]), record([2, 3, 4, 5, 6, 7], [10])]
    packed = pack(records)
    length = len(packed.ids)
    old = -torch.rand(length) - 0.5
    ref = -torch.rand(length) - 0.5
    adv = torch.randn(length)
    kw = dict(clip_eps=0.2, dual_clip=3.0, log_ratio_clamp=20.0, kl_coef=0.1)

    model_a, model_b = tiny_model, copy.deepcopy(tiny_model)
    metrics = update(model_a, torch.optim.SGD(model_a.parameters(), lr=0.0), packed, old, ref, adv,
                     UpdateSpec(temperature=1.0, micro_batch_tokens=budget, grad_clip=0.0, share_prefix=True,
                                packing=packing, **kw))
    from orsd.train.loss import microbatches

    assert microbatches(packed, budget, by_prefix=packing == "prefix") == grouping
    assert metrics["micro_batches"] == 2

    # the hand computation, with that grouping
    total = 0.0
    model_b.train()
    for batch in grouping:
        per_mb = []
        for s in batch:
            rec = records[s]
            ids = rec.context_ids + rec.response_ids
            logits = model_b(torch.tensor([ids])).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
            lp = lp[-len(rec.response_ids):]
            start = int(packed.cu_seqlens[s]) + len(rec.context_ids)
            span = slice(start, start + len(rec.response_ids))
            per_mb.append(per_token_loss(lp, old[span], ref[span], adv[span], **kw).loss)
        tokens = torch.cat(per_mb)
        total = total + tokens.sum() / len(tokens)
    total = total / len(grouping)
    total.backward()
    assert metrics["loss"] == pytest.approx(float(total.detach()), abs=1e-5)
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_eq14_micro_batch_size_one_is_a_per_record_token_mean(tiny_model):
    """optim.micro_batch_size=1 (the paper's WebShop setting): the gradient equals the mean over
    records of each record's token-mean loss, (1/S) Σ_s (1/|T_s|) Σ_{t∈s} f_t, computed by hand."""
    records = [record([1, 2, 3], [4, 5, 6]), record([1, 7], [8, 9]), record([2, 3, 4, 5, 6, 7], [10])]
    packed = pack(records)
    generator = torch.Generator().manual_seed(3)
    old = -torch.rand(len(packed.ids), generator=generator) - 0.5
    ref = -torch.rand(len(packed.ids), generator=generator) - 0.5
    adv = torch.randn(len(packed.ids), generator=generator)
    kw = dict(clip_eps=0.2, dual_clip=0.0, log_ratio_clamp=20.0, kl_coef=0.05)
    model_a, model_b = tiny_model, copy.deepcopy(tiny_model)
    metrics = update(model_a, torch.optim.SGD(model_a.parameters(), lr=0.0), packed, old, ref, adv,
                     UpdateSpec(temperature=1.0, micro_batch_tokens=10**6, grad_clip=0.0, micro_batch_size=1, **kw))
    assert metrics["micro_batches"] == 3  # one record each, although all fit one token budget
    model_b.train()
    total = 0.0
    for s, rec in enumerate(records):
        ids = rec.context_ids + rec.response_ids
        logits = model_b(torch.tensor([ids])).logits[0, :-1].double()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
        start = int(packed.cu_seqlens[s]) + len(rec.context_ids)
        span = slice(start, start + len(rec.response_ids))
        f = per_token_loss(lp[-len(rec.response_ids):], old[span].double(), ref[span].double(),
                           adv[span].double(), **kw).loss
        total = total + f.mean()
    (total / len(records)).backward()
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.allclose(a.grad.double(), b.grad.double(), atol=1e-6), name


def test_alpha_zero_orsd_equals_grpo(tiny_model, tiny_tokenizer):
    """Same batch: ORSD with α = 0 gives GRPO's advantages, loss and gradients exactly."""
    orsd_config = small_config("method.name=orsd", "rubric.alpha=0.0")
    grpo_config = small_config("method.name=grpo")
    reference = frozen_copy(tiny_model)

    orsd = Trainer(orsd_config, tiny_model, tiny_tokenizer, reference,
                   build_verifier(orsd_config, reference, tiny_tokenizer), make_env(orsd_config),
                   engine=ScriptedEngine(tiny_model, tiny_tokenizer))
    groups = orsd.rollout(orsd.sample_tasks())
    advantages = orsd.method.advantages(groups)
    request = orsd.method.bundle_request(groups)
    candidates = orsd.method.candidates(groups, request, orsd.writer.write(request))
    bundles = [c.bundles[0] for c in candidates]  # make sure the rubric path is really exercised
    replay_orsd = orsd.paired_replay(groups, advantages, bundles)
    assert replay_orsd.valid.any()

    grpo = Trainer(grpo_config, tiny_model, tiny_tokenizer, reference, None, make_env(grpo_config))
    replay_grpo = grpo.paired_replay(groups, advantages, [None] * len(groups))
    assert torch.equal(replay_orsd.advantages, replay_grpo.advantages)
    assert torch.equal(replay_orsd.old_logprobs, replay_grpo.old_logprobs)

    reference_lp = orsd.reference_pass.logprobs(replay_orsd, replay_orsd.frozen_states)
    model_b = copy.deepcopy(tiny_model)
    zero = UpdateSpec(temperature=1.0, micro_batch_tokens=4096, clip_eps=0.2, dual_clip=0.0, log_ratio_clamp=20.0,
                      kl_coef=1e-3, grad_clip=0.0)
    m_a = update(tiny_model, torch.optim.SGD(tiny_model.parameters(), lr=0.0), replay_orsd.packed,
                 replay_orsd.old_logprobs, reference_lp, replay_orsd.advantages, zero)
    m_b = update(model_b, torch.optim.SGD(model_b.parameters(), lr=0.0), replay_grpo.packed,
                 replay_grpo.old_logprobs, reference_lp, replay_grpo.advantages, zero)
    assert m_a["loss"] == m_b["loss"]
    for a, b in zip(tiny_model.parameters(), model_b.parameters()):
        assert torch.equal(a.grad, b.grad)
