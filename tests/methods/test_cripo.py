"""CriPO: the worked example of research/baselines.md §4 (ω = [3, 1, 1, 1], G = 4; every number
computed by hand), its safeguards, the injection teacher's context, and one step next to GRPO's."""

import math

import numpy as np
import pytest
import torch

from distill_steps import grpo_batch, max_difference, method_step
from orsd import ops
from orsd.envs.base import Task
from orsd.methods import Advantages, Candidates, make_method
from orsd.methods.cripo import (SUPPRESSED_NEGATIVE, SUPPRESSED_ZERO, UNEXPLORED, criterion_status, decay,
                                nonnegative_share, satisfied)
from orsd.methods.distill import Distillation
from orsd.rubric import Alignment, RubricBundle, VerifierResult
from orsd.train.teacher import response_weights
from orsd.train.records import Group, Trajectory, TurnRecord
from orsd.train.packing import pack
from scripted import small_config
from tiny_model import make_tiny_qwen3

# rows y1..y4, columns c1..c4: y1 {c1, c2}, y2 {c1}, y3 {c3}, y4 {c2, c3}
R_MATRIX = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 1, 0]], dtype=float)
A = [1.161890, 0.387297, -1.161890, -0.387297]  # (R − 0.416667) / 0.215166, R = [4, 3, 1, 2] / 6


def test_worked_example_advantages():
    weights = np.array([3, 1, 1, 1])
    rewards = R_MATRIX @ weights / weights.sum()
    assert rewards.tolist() == pytest.approx([4 / 6, 3 / 6, 1 / 6, 2 / 6])
    ours = ops.grpo_advantages(torch.tensor(rewards, dtype=torch.float32), torch.zeros(4, dtype=torch.long), 1e-6, True)
    assert ours.tolist() == pytest.approx(A, abs=1e-5)  # unbiased std, as verl's GRPO


def test_worked_example_statuses_and_s():
    assert criterion_status(R_MATRIX, A) == ["", "", SUPPRESSED_NEGATIVE, UNEXPLORED]  # c1, c2, c3, c4
    assert sum(A[i] for i in (2, 3)) == pytest.approx(-1.549187, abs=1e-5)  # Σ over S_3 = {3, 4}
    assert nonnegative_share(A) == 0.5  # s = 2/4, so β̃ = 2·0.5·β = β


def test_zero_sum_criteria_are_suppressed_only_when_few_trajectories_meet_them():
    r = np.array([[1, 1, 0], [0, 1, 0], [0, 1, 0], [0, 0, np.nan]], dtype=float)
    equal = [0.0, 0.0, 0.0, 0.0]  # all rewards equal: every Σ A is 0
    # c1: |S| = 1 ≤ N/2 -> suppressed; c2: |S| = 3 > N/2 -> neither; c3: unscored for y4, met by none -> undetermined
    assert criterion_status(r, equal) == [SUPPRESSED_ZERO, "", ""]


def test_satisfied_thresholds_scores_and_keeps_unscored():
    out = satisfied(np.array([[0.5, 0.49, np.nan]]), 0.5)
    assert out[0, :2].tolist() == [1.0, 0.0] and math.isnan(out[0, 2])


def test_beta_decays_linearly_over_the_last_quarter():
    assert [decay(s, 100, 0.25) for s in (0, 75, 80, 99)] == pytest.approx([1.0, 1.0, 0.8, 0.04])
    assert decay(50, 100, 0.0) == 1.0


def test_divergence_is_capped_at_ten_without_gradient_above():
    loss = torch.tensor([12.0, 3.0], requires_grad=True)
    capped = Distillation("topk", coef=1.0, beta=0.0, top_k=64, clamp=10.0).capped(loss)
    capped.sum().backward()
    assert capped.tolist() == [10.0, 3.0] and loss.grad.tolist() == [0.0, 1.0]


def turn(response_ids, text="go"):
    return TurnRecord(turn=0, context_ids=[1, 2, 3], response_ids=response_ids,
                      rollout_logprobs=[0.0] * len(response_ids), rubric_slot=1, response_text=text, action=None,
                      observation="", valid_action=False, no_progress=False, truncated=False, context_truncated=False)


def test_first_and_last_one_percent_of_each_response_are_masked():
    records = [turn(list(range(150))), turn(list(range(10)))]
    weight = response_weights(pack(records), [0.3, 0.3], torch.tensor([True, True]), 0.01)
    first = weight[3:153]  # record 0's response: ceil(1.5) = 2 tokens masked at each end
    assert first[:2].tolist() == [0, 0] and first[-2:].tolist() == [0, 0] and bool((first[2:-2] == 0.3).all())
    second = weight[156:166]  # ceil(0.1) = 1 at each end
    assert second.tolist() == pytest.approx([0] + [0.3] * 8 + [0])


def test_injection_teacher_sees_the_turn_response_and_the_unexplored_criteria():
    method = make_method(small_config("method.name=cripo", "method.distill_coef=0.2", "method.cripo_max_criteria=1"))
    task = Task("t", "train", "buy a shirt", "k")
    trajectories = [Trajectory(task, [], [], records=[turn([5], text=f"reply {i}")]) for i in range(4)]
    criteria = ["c1 text", "c2 text", "c3 text", "c4 text"]
    candidates = Candidates(bundles=[RubricBundle(criteria)])
    scores = [VerifierResult(R_MATRIX.copy())]
    selection = Alignment(rho=[0.5], index=0)
    advantages = Advantages(episode=[A], turn=[[[a] for a in A]])
    out = method.teacher_contexts([Group(task, trajectories)], advantages, [candidates], [scores], [selection], step=0)
    texts = [turns[0] for turns in out.texts[0]]
    assert all("c4 text" in t and "c3 text" not in t for t in texts)  # only the unexplored criterion
    assert [f"reply {i}" in t for i, t in enumerate(texts)] == [True] * 4  # each turn's own response
    assert out.coef == pytest.approx([2 * 0.5 * 0.2])  # β̃ = 2·s·β
    assert out.metrics["cripo_unexplored_criteria"][0] == 1 and out.metrics["cripo_suppressed_criteria"][0] == 1
    spec = method.distillation
    assert (spec.divergence, spec.beta, spec.top_k, spec.tail) == ("topk", 0.0, 64, True)  # forward KL, top-64
    assert (spec.clamp, spec.edge_fraction) == (10.0, 0.01)


@pytest.mark.slow
def test_cripo_step_injects_for_an_unexplored_criterion(tiny_tokenizer):
    model = make_tiny_qwen3(tiny_tokenizer).train()
    grpo, groups = grpo_batch(model, tiny_tokenizer)
    # the scripted verifier meets no transcript on bundle 0's last criterion: unexplored
    grads, result = method_step("cripo", model, tiny_tokenizer, groups, "method.distill_coef=0.5", never=(5,))
    m = result.metrics
    assert m["cripo_unexplored_criteria"] == 1 and m["groups_with_teacher"] == 1.0
    assert 0 < m["teacher_token_fraction"] < 1  # every response loses its first and last token
    assert m["distill_loss"] > 0 and max_difference(grads, grpo) > 1e-5
    teacher = result.outputs.teacher
    # two of the four episodes act validly and get the higher reward: s = 0.5, β̃ = β
    assert set(teacher.weight[teacher.weight > 0].tolist()) == {0.5}
    assert teacher.topk_ids.shape[1] == 64
