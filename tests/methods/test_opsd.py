"""OPSD and GRPO+OPSD: the worked example of research/baselines.md §2 (one position, V = 3,
p = [0.5, 0.3, 0.2], q = [0.7, 0.2, 0.1]; every expected number computed by hand from the
definitions), the divergences' gradients through the real update against a direct full-logits
computation on a tiny model, and one step next to GRPO's on the same batch."""

import copy
import math

import pytest
import torch

from distill_steps import grpo_batch, max_abs, max_difference, method_step
from orsd.methods.distill import Distillation, generalized_jsd, outside_logmass, sampled_reverse_kl, topk_support
from orsd.train.loss import UpdateSpec, update
from orsd.train.teacher import DistillTerm, teacher_pass
from orsd.train.metrics import values
from orsd.train.records import TurnRecord
from orsd.train.packing import pack
from orsd.train.replay import ReplaySpec
from tiny_model import make_tiny_qwen3

P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log()  # student
Q = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64).log()  # teacher


@pytest.mark.parametrize("beta, expected", [(0.0, 0.085123), (1.0, 0.092033), (0.5, 0.021901)])
def test_worked_example_full_vocabulary(beta, expected):
    # forward KL(q‖p) = .7 ln(.7/.5) + .2 ln(.2/.3) + .1 ln(.1/.2); reverse swaps the roles;
    # D_0.5 uses m = [0.6, 0.25, 0.15]
    assert float(generalized_jsd(P, Q, beta)) == pytest.approx(expected, abs=1e-6)


def test_worked_example_top2_on_the_teachers_support():
    ids = torch.tensor([0, 1])  # the teacher's two most likely tokens
    forward = Distillation("topk", coef=1.0, beta=0.0, top_k=2)
    # renormalised (OPSD): q' = [7/9, 2/9], p' = [0.625, 0.375] -> 0.053814
    assert float(forward.on_support(*topk_support(P[ids], Q[ids]))) == pytest.approx(0.053814, abs=1e-6)
    # with a tail bucket, V = k + 1 recovers the full forward KL exactly
    tails = (outside_logmass(P, ids), outside_logmass(Q, ids))
    assert float(forward.on_support(*topk_support(P[ids], Q[ids], tails))) == pytest.approx(0.085123, abs=1e-6)


def test_worked_example_sampled_token_lowers_log_p_of_a_token_the_teacher_likes_less():
    logits = P.clone().requires_grad_(True)  # log p as logits: softmax gives p back
    student = torch.log_softmax(logits, -1)[1]  # y = 1
    loss = sampled_reverse_kl(student, Q[1])
    loss.backward()
    # sg(log q − log p) = ln(0.2/0.3) = −0.405465: ∂ℓ/∂log p(y) = +0.405465
    assert float((student - Q[1]).detach()) == pytest.approx(0.405465, abs=1e-6)
    assert float(logits.grad[1]) == pytest.approx(0.405465 * (1 - 0.3), abs=1e-6)  # ∂log p_1/∂z_1 = 1 − p_1
    with torch.no_grad():  # a gradient step lowers p(y)
        assert float(torch.softmax(logits - 0.1 * logits.grad, -1)[1]) < 0.3


def turn(context, response, slot):
    return TurnRecord(turn=0, context_ids=context, response_ids=response, rollout_logprobs=[0.0] * len(response),
                      rubric_slot=slot, response_text="", action=None, observation="", valid_action=False,
                      no_progress=False, truncated=False, context_truncated=False)


def direct_loss(spec: Distillation, student, teacher, records, privileged, temperature):
    """Token-mean ℓ from plain full-logits forwards of each sequence (the hand computation)."""
    losses = []
    for record, extra in zip(records, privileged):
        n = len(record.response_ids)
        ids = record.context_ids + record.response_ids
        slot = record.rubric_slot
        spliced = record.context_ids[:slot] + extra + record.context_ids[slot:] + record.response_ids
        p = torch.log_softmax(student(torch.tensor([ids])).logits[0, -n - 1:-1].double() / temperature, -1)
        with torch.no_grad():
            q = torch.log_softmax(teacher(torch.tensor([spliced])).logits[0, -n - 1:-1].double() / temperature, -1)
        y = torch.tensor(record.response_ids)[:, None]
        if spec.divergence == "sampled":
            lp, lq = p.gather(-1, y).squeeze(-1), q.gather(-1, y).squeeze(-1)
            losses.append((lp - lq).detach() * lp)
            continue
        if spec.divergence == "sdar":
            lp, lq = p.gather(-1, y).squeeze(-1), q.gather(-1, y).squeeze(-1)
            gate = torch.sigmoid(spec.gate_beta * (lq - lp.detach()))
            losses.append(gate * (lq - lp))
            continue
        ps, qs = p.exp(), q.exp()
        if spec.divergence == "topk":
            top = qs.topk(spec.top_k, -1).indices
            ps, qs = ps.gather(-1, top), qs.gather(-1, top)
            if spec.tail:  # the (k+1)-th bucket: what the k ids leave
                ps = torch.cat([ps, 1 - ps.sum(-1, keepdim=True)], -1)
                qs = torch.cat([qs, 1 - qs.sum(-1, keepdim=True)], -1)
            else:
                ps, qs = ps / ps.sum(-1, keepdim=True), qs / qs.sum(-1, keepdim=True)
        if spec.beta == 0.0:  # OPSD's special cases: the mixture form itself vanishes at β = 0 and 1
            losses.append((qs * (qs / ps).log()).sum(-1))
            continue
        m = spec.beta * qs + (1 - spec.beta) * ps
        losses.append(spec.beta * (qs * (qs / m).log()).sum(-1) + (1 - spec.beta) * (ps * (ps / m).log()).sum(-1))
    return torch.cat(losses).mean()


@pytest.mark.parametrize("spec", [
    Distillation("jsd", coef=1.0, pg_coef=0.0, beta=0.5),
    Distillation("jsd", coef=1.0, pg_coef=0.0, beta=0.0),
    Distillation("topk", coef=1.0, pg_coef=0.0, beta=0.5, top_k=7),
    Distillation("topk", coef=1.0, pg_coef=0.0, beta=0.0, top_k=7, tail=True),
    Distillation("sampled", coef=1.0, pg_coef=0.0),
    Distillation("sdar", coef=1.0, pg_coef=0.0, gate_beta=5.0),
], ids=["jsd", "forward_kl", "topk", "topk_tail", "sampled", "sdar"])
def test_update_gradient_matches_a_direct_full_logits_computation(spec, tiny_tokenizer):
    """The term through teacher_pass, DistillTerm and the real update (several checkpointed chunks,
    Eq. 14 weights of one micro-batch: the token mean) equals plain torch on whole logits."""
    student = make_tiny_qwen3(tiny_tokenizer, seed=0).train()
    teacher = make_tiny_qwen3(tiny_tokenizer, seed=1)  # a different model: q ≠ p everywhere
    temperature = 0.7
    records = [turn([1, 5, 9, 14, 3, 22], [40, 41, 42, 43, 44], slot=2),
               turn([1, 7, 8], [50, 51, 52, 53], slot=3)]
    privileged = [[60, 61, 62, 63], [70, 71]]
    packed = pack(records)
    teacher_view = teacher_pass(teacher, packed, records, privileged, [1.0, 1.0], spec,
                                ReplaySpec(temperature, 4096, fused=False), chunk_tokens=2)
    term = DistillTerm(spec, teacher_view, temperature)
    term.chunk_tokens = 3  # the student's chunks cut through both responses
    zeros = torch.zeros(len(packed.ids))
    settings = UpdateSpec(temperature=temperature, micro_batch_tokens=10**6, clip_eps=0.2, dual_clip=0.0,
                          log_ratio_clamp=20.0, kl_coef=0.0, grad_clip=0.0)
    metrics = values(update(student, torch.optim.SGD(student.parameters(), lr=0.0), packed, zeros, zeros, zeros,
                            settings, distill=term))
    through_update = [p.grad.clone() for p in student.parameters()]
    student.zero_grad()
    expected = direct_loss(spec, student, teacher, records, privileged, temperature)
    expected.backward()
    assert metrics["distill_tokens"] == 9
    assert metrics["loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert metrics["distill_loss"] == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    scale = max(float(p.grad.abs().max()) for p in student.parameters())
    assert scale > 1e-4  # the term has a real gradient
    for got, p in zip(through_update, student.parameters()):
        assert torch.allclose(got, p.grad.float(), atol=1e-5 * scale, rtol=1e-4)


def test_topk_teacher_pass_keeps_k_ids_per_token_and_no_vocab_tensor(tiny_tokenizer):
    teacher = make_tiny_qwen3(tiny_tokenizer, seed=1)
    records = [turn([1, 5, 9, 14], [40, 41, 42], slot=2), turn([1, 7], [50, 51], slot=1)]
    spec = Distillation("topk", coef=0.5, beta=0.0, top_k=4)
    view = teacher_pass(teacher, pack(records), records, [[60, 61], None], [0.5, 0.5], spec,
                        ReplaySpec(1.0, 4096, fused=False))
    assert view.topk_ids.shape == (3, 4) and view.topk_ids.dtype == torch.int32  # 3 taught tokens, k = 4
    assert view.hidden is None
    assert view.weight.tolist() == [0, 0, 0, 0, 0.5, 0.5, 0.5, 0, 0, 0, 0]  # record 2 has no teacher
    assert torch.all(view.topk_logprobs[:, :-1] >= view.topk_logprobs[:, 1:])  # sorted, most likely first


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    model = make_tiny_qwen3(tiny_tokenizer).train()
    grads, groups = grpo_batch(model, tiny_tokenizer)
    return model, grads, groups


@pytest.mark.slow
def test_grpo_opsd_adds_the_term_and_opsd_is_the_term_alone(batch, tiny_tokenizer):
    """On the same batch: grad(grpo_opsd) − grad(grpo) = grad(opsd) ≠ 0 (opsd drops the PG loss; the
    k3 gradient is 0 at the first step, where the policy is the reference)."""
    model, grpo, groups = batch
    with_term, result = method_step("grpo_opsd", model, tiny_tokenizer, groups, "method.distill_coef=0.5")
    alone, alone_result = method_step("opsd", model, tiny_tokenizer, groups, "method.distill_coef=0.5")
    m = result.metrics
    assert m["groups_with_teacher"] == 1.0 and m["teacher_token_fraction"] == 1.0
    assert m["distill_loss"] > 1e-3 and m["distill_tokens"] == m["update_tokens"]
    assert alone_result.metrics["distill_loss"] == pytest.approx(m["distill_loss"], rel=1e-6)
    assert max_abs(alone) > 1e-5
    assert max_difference(with_term, grpo) > 1e-5
    difference = [w - g for w, g in zip(with_term, grpo)]
    assert max_difference(difference, alone) < 1e-3 * max_abs(alone)
    teacher = result.outputs.teacher
    assert teacher.hidden is not None and teacher.hidden.shape[0] == m["distill_tokens"]  # jsd keeps H per token


@pytest.mark.slow
def test_success_context_uses_a_won_sibling(batch, tiny_tokenizer):
    model, _, groups = batch
    groups = copy.deepcopy(groups)
    for group in groups:  # the scripted engine never wins: mark the first two episodes as successes
        for trajectory in group.trajectories[:2]:
            trajectory.won = True
    grads, result = method_step("grpo_opsd", model, tiny_tokenizer, groups, "method.distill_context=success",
                                "method.distill_divergence=sampled", "method.distill_teacher=reference")
    m = result.metrics
    assert result.outputs.candidates[0].bundles == []  # no bundles, no verifier for this context
    assert m["groups_with_teacher"] == 1.0 and m["teacher_token_fraction"] == 1.0
    assert math.isfinite(m["distill_loss"]) and m["distill_loss"] != 0
