"""Held-out evaluation: metrics and per-episode records on a scripted policy checked by hand, the stratified
task sample, and common random numbers on a tiny real model (same episodes in any batch, global RNG untouched)."""

import random
from collections import Counter

import pytest

from orsd import envs
from orsd.engines.base import Sampling
from orsd.engines.hf import HfEngine
from orsd.train.evaluate import eval_tasks, evaluate, summarize
from orsd.train.rollout import Episodes
from orsd.train.model import load_tokenizer
from scripted import ExpertReplayEngine


def test_webshop_eval_metrics_by_hand():
    """The expert plays sample 1 of the tasks of two kinds; sample 0 answers without an action."""
    tokenizer = load_tokenizer("smollm2-135m")
    env = envs.make("webshop", split="test")
    tasks = eval_tasks(env, "test", 12)
    kinds = sorted({t.kind for t in tasks})
    chosen = kinds[:2]
    engine = ExpertReplayEngine(tokenizer, env, lambda task, sample: task.kind in chosen and sample == 1)
    result = evaluate(engine, tokenizer, env, "test", 12, Episodes(2, Sampling(0.6, max_new_tokens=64), 8192))
    expected_success = sum(t.kind in chosen for t in tasks) / (2 * len(tasks))
    assert result["num_episodes"] == 24 and result["num_tasks"] == 12
    assert result["success_rate"] == pytest.approx(expected_success)
    assert result["score_mean"] == pytest.approx(expected_success)  # expert scores 1, no purchase scores 0
    for kind, row in result["per_kind"].items():
        assert row["success_rate"] == (0.5 if kind in chosen else 0.0)
        assert row["episodes"] == 2 * sum(t.kind == kind for t in tasks)
    episodes = result["episodes"]
    assert [(e["task"], e["kind"], e["sample"]) for e in episodes] == [(t.id, t.kind, s) for t in tasks for s in (0, 1)]
    for episode in episodes:
        expert = episode["kind"] in chosen and episode["sample"] == 1
        assert episode["won"] == expert and episode["score"] == (1.0 if expert else 0.0)
        assert episode["turns"] == len(episode["actions"]) >= 1 and episode["error"] == ""
        if expert:  # the expert's purchase ends the episode; every action was valid
            assert episode["invalid_actions"] == 0 and episode["actions"][-1].lower().startswith("click[buy")
        else:  # no action each turn, until the env's action budget ran out
            assert episode["actions"] == [None] * env.max_actions and episode["invalid_actions"] == env.max_actions
    assert sum(e["won"] for e in episodes) / len(episodes) == result["success_rate"]
    assert sum(e["score"] for e in episodes) / len(episodes) == pytest.approx(result["score_mean"])


class KindsEnv:
    """Tasks of three kinds, 1, 10 and 10 of them, in a shuffled listing."""
    name = "fake"

    def __init__(self, order_seed: int = 0):
        from orsd.envs.base import Task

        self.listing = [Task(id=f"{kind}-{i:02d}", split="test", description="", kind=kind)
                        for kind, count in (("a", 1), ("b", 10), ("c", 10)) for i in range(count)]
        random.Random(order_seed).shuffle(self.listing)

    def tasks(self, split):
        return list(self.listing)


def test_eval_tasks_are_stratified_by_kind_and_fixed():
    env = envs.make("webshop", split="test")
    everything = env.tasks("test")
    kinds = {t.kind for t in everything}
    chosen = eval_tasks(env, "test", 64)
    assert len({t.id for t in chosen}) == 64 and {t.split for t in chosen} == {"test"}
    counts = Counter(t.kind for t in chosen)
    assert set(counts) == kinds
    assert set(counts.values()) <= {64 // len(kinds), 64 // len(kinds) + 1}  # an even share per kind
    assert eval_tasks(envs.make("webshop", split="test"), "test", 64) == chosen  # the same in every run
    assert eval_tasks(env, "test", 20) == chosen[:20]  # a smaller sample is the start of a larger one
    # a kind with fewer tasks than its share leaves the rest to the others; the env's listing order does not matter
    few = eval_tasks(KindsEnv(), "test", 9)
    assert Counter(t.kind for t in few) == {"a": 1, "b": 4, "c": 4}
    assert eval_tasks(KindsEnv(order_seed=1), "test", 9) == few


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
    monkeypatch.setattr(ev, "rollout", lambda engine, tokenizer, env, tasks, episodes, *rest, **named:
                        seen.append((episodes.sampling, engine.batch_size, named["group_keys"])) or [])
    monkeypatch.setattr(ev, "eval_tasks", lambda env, split, num_tasks: [SimpleNamespace(id="t-3")])
    config = load_config(None, ["rollout.top_k=7", "rollout.top_p=0.9", "train.eval_temperature=0.3",
                                "model.autocast=", "train.seed=5", "rollout.batch_size=2", "train.eval_batch_size=9"])
    engine = SimpleNamespace(batch_size=config.rollout.batch_size)
    held_out = ev.HeldOut(config, tiny_model, engine, None)
    held_out.env = SimpleNamespace(name="webshop")
    held_out(step=0)
    # keyed by train.seed and the task, batched by train.eval_batch_size, the rollouts' batch size restored after
    assert [(s.temperature, s.top_p, s.top_k, s.seed, size, keys) for s, size, keys in seen] == [
        (0.3, 0.9, 7, 5, 9, ["heldout:t-3"])]
    assert engine.batch_size == 2


class RecordingEngine(HfEngine):
    """The hf engine, keeping every request's sampled ids by key and the size of every batch it decoded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled, self.batches = {}, []

    def generate(self, prompts, sampling, keys=None):
        generations = super().generate(prompts, sampling, keys)
        self.sampled.update(zip(keys, (g.ids for g in generations)))
        return generations

    def _generate_batch(self, prompts, sampling, noise=None):
        self.batches.append(len(prompts))
        return super()._generate_batch(prompts, sampling, noise)


@pytest.fixture
def tiny_policy(tiny_smol_dir, one_torch_thread):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_smol_dir).eval(), load_tokenizer(str(tiny_smol_dir))


def test_heldout_episodes_do_not_depend_on_what_else_is_evaluated(monkeypatch, tiny_policy):
    """Common random numbers: one checkpoint evaluated on 3 tasks one request at a time, and on 5
    tasks (those 3 among them) in the reverse order all in one batch, samples the same ids for every
    turn of the episodes both ran, so their records are identical."""
    from orsd.train import evaluate as ev

    policy, tokenizer = tiny_policy
    env = envs.make("webshop", split="test", max_actions=2)
    tasks = eval_tasks(env, "test", 5)

    def run(task_list, batch_size):
        monkeypatch.setattr(ev, "eval_tasks", lambda env, split, num_tasks: task_list)
        engine = RecordingEngine(policy, tokenizer, batch_size=64)
        result = ev.evaluate(engine, tokenizer, env, "test", len(task_list),
                             Episodes(2, Sampling(1.0, max_new_tokens=8, seed=3), 4096), batch_size=batch_size)
        return {(e["task"], e["sample"]): e for e in result["episodes"]}, engine

    small, one_by_one = run(tasks[:3], 1)
    large, together = run(tasks[::-1], 0)
    assert set(one_by_one.batches) == {1} and max(together.batches) == 10  # 5 tasks × 2 samples in one batch
    assert len(small) == 6 and len(large) == 10 and set(small) <= set(large)
    assert len(one_by_one.sampled) == 12 and set(one_by_one.sampled) <= set(together.sampled)  # 2 turns each
    assert {key: together.sampled[key] for key in one_by_one.sampled} == one_by_one.sampled
    assert len({tuple(ids) for ids in one_by_one.sampled.values()}) == 12  # every episode and turn its own draw
    assert {key: large[key] for key in small} == small


def test_evaluation_leaves_the_global_generators_alone(tiny_policy):
    """Training reseeds every step, but an evaluation between steps must not even read its stream."""
    import numpy as np
    import torch

    policy, tokenizer = tiny_policy
    env = envs.make("webshop", split="test", max_actions=1)
    torch.manual_seed(123)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    result = evaluate(HfEngine(policy, tokenizer, 0), tokenizer, env, "test", 2,
                      Episodes(2, Sampling(1.0, max_new_tokens=8, seed=3), 4096))
    assert result["num_episodes"] == 4
    assert torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() == states[1] and (np.random.get_state()[1] == states[2]).all()


def test_orsd_eval_writes_per_episode_records(tmp_path, tiny_smol_dir, one_torch_thread):
    """`orsd-eval` on a checkpoint: its eval.jsonl line carries the episodes beside the aggregates."""
    import json

    from orsd.train.evaluate import main

    argv = [str(tiny_smol_dir), "--tasks", "3", "--samples", "2", "--run-dir", str(tmp_path), "model.autocast=",
            "model.dtype=float32", "model.device=cpu", "rollout.max_new_tokens=4", "env.max_actions=1",
            "train.eval_batch_size=4", "train.seed=3"]
    assert main(argv) == 0
    [line] = (tmp_path / "eval.jsonl").read_text().splitlines()
    result = json.loads(line)
    tasks = eval_tasks(envs.make("webshop", split="test"), "test", 3)
    assert [(e["task"], e["sample"]) for e in result["episodes"]] == [(t.id, s) for t in tasks for s in (0, 1)]
    assert result["num_episodes"] == 6 and result["seed"] == 3
    assert set(result["episodes"][0]) == {"task", "kind", "sample", "score", "won", "actions", "invalid_actions",
                                          "turns", "error"}
