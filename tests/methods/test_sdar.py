"""SDAR: the worked example of research/baselines.md §3 (hand-computed: g = σ(5·δ) for
δ = ±ln 1.5 and 0; with λ = 0.01 the weights on ∇log π are λ·g), and one step next to GRPO's."""

import math

import pytest
import torch

from distill_steps import grpo_batch, max_difference, method_step
from orsd.methods import make_method
from orsd.methods.distill import sdar_gate, sdar_loss
from scripted import small_config
from tiny_model import make_tiny_qwen3

DELTA = math.log(0.3 / 0.2)  # 0.405465


def test_worked_example_gate():
    gate = sdar_gate(torch.tensor([DELTA, -DELTA, 0.0], dtype=torch.float64), 5.0)
    assert gate.tolist() == pytest.approx([0.883636, 0.116364, 0.5], abs=1e-6)


@pytest.mark.parametrize("gate_beta, weights", [(5.0, [0.008836, 0.001164, 0.005]),
                                                (0.0, [0.005, 0.005, 0.005])])  # β_g = 0: SDAR's GRPO+OPSD
def test_worked_example_weights_on_the_log_prob_gradient(gate_beta, weights):
    """λ·ℓ has gradient −λ·g on log π(y): every sampled token is pushed up, by λ·g."""
    student = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64, requires_grad=True)
    teacher = student.detach() + torch.tensor([DELTA, -DELTA, 0.0], dtype=torch.float64)
    (0.01 * sdar_loss(student, teacher, gate_beta)).sum().backward()
    assert (-student.grad).tolist() == pytest.approx(weights, abs=1e-6)


def test_the_gate_uses_the_live_student_log_prob_without_its_gradient():
    student = torch.tensor([-2.0], requires_grad=True)
    loss = sdar_loss(student, torch.tensor([-1.0]), 5.0)
    loss.backward()
    gate = 1 / (1 + math.exp(-5.0))  # δ = −1 − (−2) = 1
    assert loss.item() == pytest.approx(gate * 1.0, rel=1e-6)
    assert float(student.grad) == pytest.approx(-gate, rel=1e-6)  # the gate itself is not differentiated


def test_sdar_keys_reach_the_term():
    method = make_method(small_config("method.name=sdar", "method.sdar_gate_beta=2.5", "method.distill_coef=0.1"))
    spec = method.distillation
    assert (spec.divergence, spec.gate_beta, spec.coef, spec.pg_coef) == ("sdar", 2.5, 0.1, 1.0)
    assert spec.teacher_view == "token"  # log q(y) only
    assert method.calls_verifier and method.alpha == 0.0  # B* by the ORSD pipeline; no Δ shaping


@pytest.mark.slow
def test_sdar_step_changes_grpos_gradient_on_the_same_batch(tiny_tokenizer):
    model = make_tiny_qwen3(tiny_tokenizer).train()
    grpo, groups = grpo_batch(model, tiny_tokenizer)
    grads, result = method_step("sdar", model, tiny_tokenizer, groups, "method.distill_coef=0.5")
    m = result.metrics
    assert m["teacher_token_fraction"] == 1.0 and m["distill_tokens"] == m["update_tokens"]
    assert m["distill_loss"] != 0 and math.isfinite(m["distill_loss"])
    assert result.outputs.teacher.topk_ids is None and result.outputs.teacher.hidden is None  # 4 bytes/token
    assert max_difference(grads, grpo) > 1e-5
