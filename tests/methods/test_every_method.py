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
    trainer.initial_engine = ScriptedEngine(reference, tokenizer, config.env.name)
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
    if not method.writes_bundles:
        assert result.metrics["groups_with_bundle"] == 0 and result.metrics["valid_token_fraction"] == 0
    elif method.selection in ("single", "random"):  # a bundle every group uses, spliced: Δ ≠ 0
        assert result.metrics["groups_with_bundle"] == 1.0
        assert result.metrics["valid_token_fraction"] > 0 and result.metrics["delta_abs_mean"] > 0
