"""One training step end to end for every method in orsd.methods.METHODS (a method added to the
registry is picked up here without editing this file), on the tiny random model with the
scripted engine of tests/train/scripted.py."""

import math
from pathlib import Path

import pytest
import torch

from orsd.methods import METHODS, make_method
from orsd.report.run_dir import RunDir
from orsd.train.build import build_verifier, make_env
from orsd.train.model import frozen_copy
from orsd.train.trainer import Trainer
from scripted import ScriptedEngine, small_config

#: keys some methods need and the others ignore (static_rubric: a rubric file)
EXTRA = [f"method.rubric_file={Path(__file__).parents[2] / 'configs' / 'rubrics' / 'webshop_static.yaml'}"]


def make_trainer(config, model, tokenizer):
    reference = frozen_copy(model)
    verifier = build_verifier(config, reference, tokenizer) if make_method(config).calls_verifier else None
    trainer = Trainer(config, model, tokenizer, reference, verifier, make_env(config),
                      engine=ScriptedEngine(model, tokenizer, config.env.name))
    trainer.writer.initial_engine = ScriptedEngine(reference, tokenizer, config.env.name)
    return trainer


@pytest.mark.parametrize("name", sorted(METHODS))
def test_one_step_of_every_method(name, tiny_model, tiny_tokenizer, tmp_path):
    config = small_config(f"method.name={name}", "rollout.group_size=2", *EXTRA)
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    method = trainer.method
    before = [p.detach().clone() for p in tiny_model.parameters()]
    result = trainer.step()

    assert type(method) is METHODS[name]
    assert len(result.records) == config.rollout.tasks_per_step
    assert all(len(g.trajectories) == config.rollout.group_size for g in result.groups)
    assert any(not torch.equal(b, p) for b, p in zip(before, tiny_model.parameters())), "no update"
    for key in ("loss", "reward_mean", "advantage_abs_mean", "replay_rollout_gap"):
        assert math.isfinite(result.metrics[key]), (key, result.metrics[key])
    assert result.metrics["replay_rollout_gap"] < 1e-3  # the plain replay reproduces the rollout
    packed = result.outputs.replay.packed
    assert torch.isfinite(result.outputs.replay.advantages[packed.response_mask]).all()
    run = RunDir(tmp_path)  # the records go into a run directory as the trainer's loop writes them
    run.append("steps.jsonl", dict(result.metrics, seconds=result.seconds))
    for record in result.records:
        run.append("groups.jsonl", record)
    CHECKS[name](result.metrics, result, method)


# What each method's step must show on this batch. The scripted engine gives every even sample a
# valid action and every bundle request a parsable bundle, so each group's rewards differ and its
# bundles parse; the verifier is the frozen tiny model. A method added to METHODS needs a line here.

def no_rubric(m, result, method):
    """grpo, gigpo: no bundle is written or spliced, no verifier, no teacher."""
    assert m["groups_with_bundle"] == 0 and m["valid_token_fraction"] == 0 and m["bundles_parsed"] == 0
    assert "distill_loss" not in m and result.outputs.teacher is None


def spliced_without_verifier(m, result, method):
    """offline_rubric, single_bundle, random_bundle, static_rubric: a bundle every group uses is
    spliced (Δ ≠ 0 on every response token) and nothing is scored."""
    assert m["groups_with_bundle"] == 1.0
    assert m["valid_token_fraction"] > 0 and m["delta_abs_mean"] > 0
    assert "verifier" not in m and all(scores is None for scores in result.outputs.scores)


def orsd(m, result, method):
    """M bundles per group, every bundle scored on every trajectory, B* by ρ, A = A_GRPO + α·e·Δ."""
    groups, n = len(result.groups), len(result.groups[0].trajectories)
    assert m["bundles_parsed"] == groups * method.num_bundles
    criteria = sum(len(b.criteria) for c in result.outputs.candidates for b in c.bundles)
    assert m["verifier"]["cells_scored"] == n * criteria  # every criterion of every bundle, each trajectory
    assert m["groups_with_bundle"] == 1.0 and m["valid_token_fraction"] == 1.0 and m["delta_abs_mean"] > 0
    # Eq. 9 per record: removing α·e·Δ leaves the record's own GRPO advantage on each response token
    replay, turn = result.outputs.replay, result.outputs.advantages.turn
    grpo = [a for group in turn for trajectory in group for a in trajectory]  # the packing's record order
    cu = replay.packed.cu_seqlens.tolist()
    for s, advantage in enumerate(grpo):
        tokens = torch.zeros_like(replay.packed.response_mask)
        tokens[cu[s]:cu[s + 1]] = True
        tokens &= replay.packed.response_mask
        base = replay.advantages[tokens] - method.alpha * replay.valid[tokens] * replay.delta[tokens]
        assert torch.allclose(base, torch.full_like(base, advantage), atol=1e-6), s
    assert len(grpo) == len(cu) - 1 and "distill_loss" not in m


def distilled(m, result, method):
    """The OPSD family: B* by the ORSD pipeline as the teacher's context, no Δ shaping (α = 0), and
    the loss = pg_coef·PG + λ·ℓ on every token (k3 = 0 at the first step, where π = π_ref)."""
    spec = method.distillation
    assert method.alpha == 0 and m["valid_token_fraction"] == 0 and m["delta_abs_mean"] == 0
    assert m["groups_with_bundle"] == 1.0 and m["groups_with_teacher"] == 1.0 and m["verifier"]["requests"] > 0
    assert m["teacher_token_fraction"] == 1.0 and m["distill_tokens"] == m["update_tokens"]
    assert math.isfinite(m["distill_loss"]) and m["distill_loss"] != 0 and m["kl"] == 0
    assert m["loss"] == pytest.approx(spec.pg_coef * m["pg_loss"] + spec.coef * m["distill_loss"], rel=1e-4)
    kept = {"full": "hidden", "topk": "topk_ids", "token": None}[spec.teacher_view]
    assert [k for k in ("hidden", "topk_ids") if getattr(result.outputs.teacher, k) is not None] == [k for k in [kept] if k]


def cripo(m, result, method):
    """CriPO: a teacher for the turns with unexplored criteria, its top-64 kept, the first and last
    response tokens of each turn left out (edge_fraction), β̃ = 2sβ per group."""
    assert m["groups_with_teacher"] == 1.0 and m["cripo_unexplored_criteria"] > 0
    assert 0 < m["distill_tokens"] < m["update_tokens"]  # the edges are masked
    assert result.outputs.teacher.topk_ids.shape[1] == method.distillation.top_k
    assert math.isfinite(m["distill_loss"]) and m["distill_loss"] > 0 and m["valid_token_fraction"] == 0


CHECKS = {"grpo": no_rubric, "gigpo": no_rubric, "offline_rubric": spliced_without_verifier,
          "single_bundle": spliced_without_verifier, "random_bundle": spliced_without_verifier,
          "static_rubric": spliced_without_verifier, "orsd": orsd, "opsd": distilled, "grpo_opsd": distilled,
          "sdar": distilled, "cripo": cripo}


def test_every_method_has_its_checks():
    assert sorted(CHECKS) == sorted(METHODS)
