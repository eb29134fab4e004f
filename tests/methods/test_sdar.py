"""SDAR: the worked example of research/baselines.md §3 (hand-computed: g = σ(5·δ) for
δ = ±ln 1.5 and 0; with λ = 0.01 the weights on ∇log π are λ·g), and one step next to GRPO's."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from distill_steps import grpo_batch, max_abs, max_difference, method_step
from orsd.methods import make_method
from orsd.methods.distill import sdar_gate, sdar_loss
from orsd.train.config import load_config
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


CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.mark.parametrize("env", ["webshop", "alfworld"])
def test_the_papers_opsd_rows_follow_sdars_protocol(env):
    """The ORSD paper's OPSD and GRPO+OPSD rows are SDAR's runs: "OPSD" = SDAR's gated loss without
    the PG term, "GRPO+OPSD" = SDAR with β_g = 0; their presets build exactly those terms."""
    opsd = make_method(load_config(CONFIGS / f"{env}_qwen3_1p7b_sdar_opsd.yaml")).distillation
    sdar = make_method(load_config(CONFIGS / f"{env}_qwen3_1p7b_sdar.yaml")).distillation
    assert (opsd.divergence, opsd.gate_beta, opsd.pg_coef) == ("sdar", 5.0, 0.0)
    # all else is SDAR's (λ, teacher, gate); top_k is read by the topk divergence only
    assert dataclasses.replace(opsd, top_k=0) == dataclasses.replace(sdar, pg_coef=0.0)
    grpo_opsd = make_method(load_config(CONFIGS / f"{env}_qwen3_1p7b_sdar_grpo_opsd.yaml")).distillation
    assert (grpo_opsd.divergence, grpo_opsd.gate_beta, grpo_opsd.pg_coef) == ("sdar", 0.0, 1.0)
    assert dataclasses.replace(grpo_opsd, top_k=0) == dataclasses.replace(sdar, gate_beta=0.0)


def test_gate_beta_zero_makes_the_term_teacher_independent():
    """β_g = 0: g ≡ 0.5 whatever the teacher says, so every sampled token gets −λ/2 on ∇log π."""
    spec = make_method(small_config("method.name=grpo_opsd", "method.distill_divergence=sdar",
                                    "method.sdar_gate_beta=0")).distillation
    grads = []
    for teacher in (torch.tensor([-0.1, -5.0]), torch.tensor([-9.0, -0.2])):
        student = torch.tensor([-1.0, -2.0], requires_grad=True)
        spec.on_token(student, teacher).sum().backward()
        grads.append(student.grad.tolist())
    assert grads == [[-0.5, -0.5], [-0.5, -0.5]]


@pytest.mark.slow
def test_opsd_with_the_sdar_divergence_is_sdar_without_the_pg_term(tiny_tokenizer):
    """On one batch: grad(sdar) − grad(grpo) = grad(opsd, distill_divergence=sdar) ≠ 0."""
    model = make_tiny_qwen3(tiny_tokenizer).train()
    grpo, groups = grpo_batch(model, tiny_tokenizer)
    with_pg, _ = method_step("sdar", model, tiny_tokenizer, groups, "method.distill_coef=0.5")
    alone, result = method_step("opsd", model, tiny_tokenizer, groups, "method.distill_coef=0.5",
                                "method.distill_divergence=sdar")
    assert result.metrics["distill_tokens"] == result.metrics["update_tokens"]
    assert max_abs(alone) > 1e-5
    difference = [w - g for w, g in zip(with_pg, grpo)]
    assert max_difference(difference, alone) < 1e-3 * max_abs(alone)
