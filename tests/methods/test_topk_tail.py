"""The top-k divergence with a tail bucket (SDPO's; CriPO's forward KL on top-64): the tail's mass
from a log-sum-exp over the ids outside the k, checked against float64 on the whole vocabulary.
Before, the tail was 1 − Σ p over k float32 probabilities, which cancels where the teacher is
confident (issue 58: the case below gave 4.6776 for 4.5945, errors up to 0.067 nats/token)."""

import math

import pytest
import torch

from orsd.methods.distill import Distillation, generalized_jsd, outside_logmass, topk_support
from orsd.train.teacher import DistillTerm, Teacher


def exact(student_logits, teacher_logits, k, beta):
    """D_β on the teacher's top-k ids plus one bucket for the rest, in float64 from whole rows."""
    p = torch.softmax(student_logits.double(), -1)
    q = torch.softmax(teacher_logits.double(), -1)
    top = q.topk(k, -1).indices
    outside = torch.ones_like(q, dtype=torch.bool).scatter(-1, top, False)
    ps = torch.cat([p.gather(-1, top), (p * outside).sum(-1, keepdim=True)], -1)
    qs = torch.cat([q.gather(-1, top), (q * outside).sum(-1, keepdim=True)], -1)
    return generalized_jsd(ps.log(), qs.log(), beta)


def through_the_update(student_logits, teacher_logits, k, beta):
    """ℓ as the update computes it: the teacher pass's float32 top-k and tail, the student's chunk."""
    spec = Distillation("topk", coef=1.0, beta=beta, top_k=k, tail=True)
    teacher_logp = torch.log_softmax(teacher_logits.float(), -1)
    values, ids = teacher_logp.topk(k, -1)
    rows = len(teacher_logits)
    teacher = Teacher(weight=torch.ones(rows), logprobs=torch.zeros(rows), rows=torch.arange(rows),
                      topk_ids=ids.to(torch.int32), topk_logprobs=values, topk_tail=outside_logmass(teacher_logp, ids))
    fn, tensors = DistillTerm(spec, teacher, temperature=1.0).chunk_term(torch.arange(rows))
    return fn(torch.log_softmax(student_logits.float(), -1), *tensors)


def test_a_confident_teacher_gives_the_exact_divergence():
    # q = softmax([15, 15, 0]): the tail holds 1/(2e^15 + 1) = 1.53e-7, p = 1/3 each; β = 1 is
    # KL(p‖q) = 2/3·ln((2e^15 + 1)/(3e^15)) + 1/3·ln((2e^15 + 1)/3) = 4.5945
    student, teacher = torch.zeros(1, 3), torch.tensor([[15.0, 15.0, 0.0]])
    z = 2 * math.exp(15) + 1
    by_hand = 2 / 3 * math.log(z / (3 * math.exp(15))) + 1 / 3 * math.log(z / 3)
    assert by_hand == pytest.approx(4.5945, abs=1e-4)
    assert float(exact(student, teacher, k=2, beta=1.0)) == pytest.approx(by_hand, abs=1e-12)
    assert float(through_the_update(student, teacher, k=2, beta=1.0)) == pytest.approx(by_hand, abs=1e-5)


def random_case(seed, vocab=500):
    """Student and teacher logits [8, V] at scales from flat to sharp; half the teacher rows put two
    or three ids far ahead, where the top-k holds all but ~1e-7 of the mass."""
    g = torch.Generator().manual_seed(seed)
    scale = [1.0, 4.0, 12.0][seed % 3]
    student = torch.randn(8, vocab, generator=g) * scale
    teacher = torch.randn(8, vocab, generator=g) * scale
    teacher[:4, :3] += 18.0
    return student, teacher


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k, beta", [(1, 0.0), (2, 1.0), (3, 0.5), (50, 0.0), (50, 1.0)])
def test_value_and_gradient_equal_float64_on_the_whole_vocabulary(seed, k, beta):
    student, teacher = random_case(seed)
    got_logits = student.clone().requires_grad_(True)
    got = through_the_update(got_logits, teacher, k, beta)
    want_logits = student.double().requires_grad_(True)
    want = exact(want_logits, teacher, k, beta)
    assert torch.isfinite(want).all() and float(want.detach().abs().max()) > 1e-3  # a case with a real value
    assert float((got.double() - want).abs().max()) <= 1e-5
    got.sum().backward()
    want.sum().backward()
    assert float((got_logits.grad.double() - want_logits.grad).abs().max()) <= 1e-5


def test_k_equal_to_the_vocabulary_leaves_an_empty_bucket_and_a_finite_value():
    student, teacher = torch.randn(2, 4), torch.randn(2, 4)
    logits = student.clone().requires_grad_(True)
    got = through_the_update(logits, teacher, k=4, beta=0.5)
    got.sum().backward()
    want = generalized_jsd(torch.log_softmax(student.double(), -1), torch.log_softmax(teacher.double(), -1), 0.5)
    assert torch.allclose(got.double(), want, atol=1e-6)  # the empty bucket adds nothing
    assert torch.isfinite(logits.grad).all()


def test_renormalised_top_k_is_unchanged():
    # OPSD's top-k (no tail): both sides renormalised over the k; q' = [7/9, 2/9], p' = [0.625, 0.375]
    p, q = torch.tensor([0.5, 0.3, 0.2]).log(), torch.tensor([0.7, 0.2, 0.1]).log()
    ids = torch.tensor([0, 1])
    forward = Distillation("topk", coef=1.0, beta=0.0, top_k=2)
    assert float(forward.on_support(*topk_support(p[ids], q[ids]))) == pytest.approx(0.053814, abs=1e-6)
