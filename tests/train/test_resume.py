"""A run killed after step k and resumed gives the same records and weights as an unbroken run."""

import json

import pytest
import torch
from safetensors.torch import load_file

from orsd.train import checkpoint
from orsd.train.cli import run
from orsd.train.config import load_config
from orsd.train.trainer import Trainer

COMPARED = ("reward_mean", "success_rate", "turns_mean", "response_tokens", "loss", "pg_loss", "kl", "entropy",
            "grad_norm", "replay_rollout_gap", "groups_rewards_differ", "groups_with_bundle")


def config_for(model_dir, steps):
    return load_config(None, [f"model.path={model_dir}", f"train.steps={steps}", "train.save_every=1",
                              "train.keep_checkpoints=2", "train.progress=false", "train.report=false",
                              "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                              "rollout.max_context_tokens=4096", "env.max_actions=2", "rubric.max_new_tokens=8",
                              "rubric.num_bundles=2", "warm_start.episodes=2", "warm_start.epochs=1",
                              "optim.lr=1e-3"])


def records(run_dir):
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    groups = [json.loads(line) for line in (run_dir / "groups.jsonl").read_text().splitlines()]
    for g in groups:
        g.pop("verifier_events", None)
    return [{k: s[k] for k in COMPARED} for s in steps], groups


def weights(run_dir):
    path = checkpoint.latest(run_dir)
    return load_file(next(path.glob("*.safetensors")))


@pytest.mark.slow
def test_killed_then_resumed_equals_unbroken(tiny_smol_dir, tmp_path, monkeypatch):
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    run(load_config_steps := config_for(tiny_smol_dir, 3), str(unbroken), log=lambda *_: None)
    assert load_config_steps.warm_start.enabled  # the reference is the warm-started policy

    calls = {"n": 0}
    real_step = Trainer.step

    def dies_in_third_step(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real_step(self)

    monkeypatch.setattr(Trainer, "step", dies_in_third_step)
    with pytest.raises(KeyboardInterrupt):
        run(config_for(tiny_smol_dir, 3), str(broken), log=lambda *_: None)
    monkeypatch.setattr(Trainer, "step", real_step)
    assert [n for n, _ in checkpoint.step_dirs(broken)] == [1, 2]
    with pytest.raises(SystemExit, match="--resume"):  # never silently mixes two runs
        run(config_for(tiny_smol_dir, 3), str(broken), log=lambda *_: None)
    run(config_for(tiny_smol_dir, 3), str(broken), resume=True, log=lambda *_: None)

    steps_a, groups_a = records(unbroken)
    steps_b, groups_b = records(broken)
    assert len(steps_a) == len(steps_b) == 3
    assert steps_a == steps_b
    assert groups_a == groups_b
    wa, wb = weights(unbroken), weights(broken)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    assert [n for n, _ in checkpoint.step_dirs(broken)] == [2, 3]  # keep-last-2
