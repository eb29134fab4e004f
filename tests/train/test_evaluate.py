"""Held-out evaluation on a scripted policy, checked by hand."""

import pytest

from orsd import envs
from orsd.train.evaluate import eval_tasks, evaluate, summarize
from orsd.train.model import load_tokenizer
from scripted import ExpertReplayEngine


def test_webshop_eval_metrics_by_hand():
    tokenizer = load_tokenizer("smollm2-135m")
    env = envs.make("webshop", split="test")
    tasks = eval_tasks(env, "test", 12)
    kinds = sorted({t.kind for t in tasks})
    chosen = kinds[:2]
    engine = ExpertReplayEngine(tokenizer, env, lambda task, sample: task.kind in chosen)
    result = evaluate(engine, tokenizer, env, "test", 12, 2, 0.6, 64, 8192)
    expected_success = sum(t.kind in chosen for t in tasks) / len(tasks)
    assert result["num_episodes"] == 24 and result["num_tasks"] == 12
    assert result["success_rate"] == pytest.approx(expected_success)
    assert result["score_mean"] == pytest.approx(expected_success)  # expert scores 1, no purchase scores 0
    for kind, row in result["per_kind"].items():
        assert row["success_rate"] == (1.0 if kind in chosen else 0.0)
        assert row["episodes"] == 2 * sum(t.kind == kind for t in tasks)


def test_eval_tasks_are_a_fixed_sample():
    env = envs.make("webshop", split="test")
    assert eval_tasks(env, "test", 10) == eval_tasks(env, "test", 10)
    assert len({t.id for t in eval_tasks(env, "test", 10)}) == 10


def test_summarize_empty_split_is_an_error():
    class Empty:
        name = "webshop"

        def tasks(self, split):
            return []

    with pytest.raises(ValueError, match="no tasks"):
        eval_tasks(Empty(), "test", 3)
    assert summarize([], "webshop", "test", 0)["num_episodes"] == 0


def test_orsd_eval_takes_overrides_between_and_after_its_options(capsys):
    """`orsd-eval CKPT --tasks 8 train.seed=3` was refused by argparse ("unrecognized arguments")."""
    from orsd.train.evaluate import main

    assert main(["some/checkpoint", "train.seed=3", "--tasks", "-1", "train.eval_samples=2"]) == 2
    assert "--tasks=-1 must be >= 0" in capsys.readouterr().err


def test_orsd_eval_help_names_the_checkpoint_directories_a_run_writes(capsys):
    """The help named runs/<name>/checkpoints/final, which no run writes (checkpoint.py: step_<k>)."""
    import re

    from orsd.train.checkpoint import STEP_DIR
    from orsd.train.evaluate import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    named = re.findall(r"runs/<name>/checkpoints/(\S+?)[\s,)]", text)
    assert named == ["step_<k>"]
    assert STEP_DIR.match(named[0].replace("<k>", "12"))  # the name checkpoint.save writes


def test_orsd_train_takes_overrides_between_and_after_its_options():
    from orsd.train.cli import parse_args

    args = parse_args(["rubric.num_bundles=2", "--run-dir", "runs/x", "method.name=grpo", "--dry-run"])
    assert args.overrides == ["rubric.num_bundles=2", "method.name=grpo"] and args.run_dir == "runs/x"


def test_evaluation_samples_with_the_rollouts_top_p_and_top_k(monkeypatch, tiny_model):
    """orsd-eval and the in-run evaluation keep rollout.top_p / rollout.top_k (they sampled from the
    whole distribution whatever the config said), at train.eval_temperature."""
    from types import SimpleNamespace

    from orsd.train import evaluate as ev
    from orsd.train.config import load_config

    seen = []
    monkeypatch.setattr(ev, "rollout", lambda engine, tokenizer, env, tasks, samples, sampling, *rest: seen.append(
        sampling) or [])
    monkeypatch.setattr(ev, "eval_tasks", lambda env, split, num_tasks: [])
    config = load_config(None, ["rollout.top_k=7", "rollout.top_p=0.9", "train.eval_temperature=0.3",
                                "model.autocast="])
    trainer = SimpleNamespace(config=config, policy=tiny_model, engine=None, tokenizer=None, templates=None,
                              eval_env=SimpleNamespace(name="webshop"))
    ev.evaluate_trainer(trainer, step=0)
    assert [(s.temperature, s.top_p, s.top_k) for s in seen] == [(0.3, 0.9, 7)]
