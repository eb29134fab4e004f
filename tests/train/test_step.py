"""One training step end to end on CPU with the tiny random model, in every mode."""

import math

import pytest
import torch

from scripted import ScriptedEngine, small_config
from orsd.train.model import frozen_copy
from orsd.train.trainer import Trainer, make_env
from orsd.train.verifiers import build_verifier


def make_trainer(config, model, tokenizer):
    reference = frozen_copy(model)
    verifier = build_verifier(config, reference, tokenizer) if config.rubric.mode == "orsd" else None
    trainer = Trainer(config, model, tokenizer, reference, verifier, make_env(config),
                      engine=ScriptedEngine(model, tokenizer, config.env.name))
    trainer.initial_engine = ScriptedEngine(reference, tokenizer, config.env.name)
    return trainer


def check_records(result, config):
    assert len(result.groups) == config.rollout.tasks_per_step
    for group in result.groups:
        assert len(group.trajectories) == config.rollout.group_size
        for trajectory in group.trajectories:
            assert not trajectory.error
            assert len(trajectory.records) == len(trajectory.actions) == len(trajectory.observations) - 1
            assert 1 <= len(trajectory.records) <= config.env.max_actions
            for turn, record in enumerate(trajectory.records):
                assert record.turn == turn
                assert record.context_ids and record.response_ids
                assert len(record.rollout_logprobs) == len(record.response_ids)
                assert all(lp <= 0 and math.isfinite(lp) for lp in record.rollout_logprobs)
                assert 0 < record.rubric_slot < len(record.context_ids)


@pytest.mark.parametrize("mode", ["orsd", "grpo", "offline_rubric", "single_bundle", "random_bundle"])
def test_every_mode_runs_a_step_on_webshop(mode, tiny_model, tiny_tokenizer):
    config = small_config(f"rubric.mode={mode}")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    result = trainer.step()
    check_records(result, config)
    m = result.metrics
    assert m["groups_rewards_differ"] == 1.0  # scripted: half the episodes act validly
    assert m["response_tokens"] == sum(len(r.response_ids) for g in result.groups
                                       for t in g.trajectories for r in t.records)
    assert m["replay_rollout_gap"] < 1e-3  # the plain replay reproduces the rollout's log-probs
    assert any(not torch.equal(b, p) for b, p in zip(before, tiny_model.parameters()))
    if mode == "grpo":
        assert m["groups_with_bundle"] == 0 and m["valid_token_fraction"] == 0
        assert set(result.seconds) >= {"rollout", "replay", "reference", "update"}
        assert "bundles" not in result.seconds
    else:
        assert all(g.bundles for g in result.groups), [g.bundle_errors for g in result.groups]
        if mode != "orsd":  # the ablations always use their bundle
            assert m["groups_with_bundle"] == 1.0
        assert m["valid_token_fraction"] > 0 if m["groups_with_bundle"] else True
    if mode == "orsd":
        for group in result.groups:
            assert len(group.scores) == len(group.bundles) == 2
            assert all(s.shape == (4, 6) for s in group.scores)
            assert len(group.rho) == 2
        assert m["verifier"]["requests"] > 0
    if m["groups_with_bundle"]:
        assert m["delta_abs_mean"] > 0  # the rubric changes the tiny model's log-probs


def test_offline_rubric_keeps_the_first_bundle_per_task(tiny_model, tiny_tokenizer):
    config = small_config("rubric.mode=offline_rubric", "rollout.tasks_per_step=1")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    first = trainer.step()
    task = first.groups[0].task
    kept = trainer.offline_bundles[task.id]
    trainer.task_rng.seed(config.train.seed)  # draw the same task again
    second = trainer.step()
    assert second.groups[0].task == task
    assert second.groups[0].bundles == [kept]
    generated = sum(1 for prompts, _ in trainer.initial_engine.calls for _ in prompts)
    assert generated == 1  # generated once, by the initial policy, then kept


def test_summary_of_a_group_is_json_ready(tiny_model, tiny_tokenizer):
    import json

    config = small_config()
    result = make_trainer(config, tiny_model, tiny_tokenizer).step()
    for group in result.groups:
        line = json.dumps(group.summary(), allow_nan=False)
        back = json.loads(line)
        assert len(back["transcripts"]) == config.rollout.group_size
        assert "reward" not in json.dumps(back["bundle_texts"]).lower()


def test_bf16_autocast_step_learns_and_keeps_replay_close(tiny_model, tiny_tokenizer):
    """The CPU default's mixed precision: no-grad stages and update forwards in bf16, fp32 weights."""
    config = small_config("rubric.mode=grpo", "model.autocast=bfloat16")
    trainer = make_trainer(config, tiny_model, tiny_tokenizer)
    before = [p.detach().clone() for p in tiny_model.parameters()]
    result = trainer.step()
    assert result.metrics["replay_rollout_gap"] < 0.05  # bf16 rounding differs with batching
    assert abs(result.metrics["ratio"] - 1.0) < 1e-2  # π_old and the update's forward agree
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, tiny_model.parameters()))
