"""Held-out evaluation on a scripted policy, checked by hand."""

import re

import pytest

from orsd import envs
from orsd.train.engines import Generation
from orsd.train.evaluate import eval_tasks, evaluate, summarize
from orsd.train.model import load_tokenizer


class ExpertForKinds:
    """Test fake engine: plays the env's expert on tasks of `kinds` and answers without an action
    otherwise. It rebuilds each episode's state from the prompt (task + action history) in a shadow
    copy of the env, so its answers depend only on what the policy would see."""

    def __init__(self, tokenizer, env, kinds):
        self.tokenizer, self.env, self.kinds = tokenizer, env, set(kinds)
        self.by_description = {t.description: t for t in env.tasks(env.split)}
        self.stop = tokenizer.eos_token_id

    def generate(self, prompts, sampling, keys=None):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            task = next(t for d, t in self.by_description.items() if d in text)
            answer = "<think>pass</think>"
            if task.kind in self.kinds:
                shadow = self.env.fork()
                shadow.reset(task)
                for action in re.findall(r"<action>(.*?)</action>", text.split("<|im_start|>user", 1)[1]):
                    shadow.step(action)
                answer = f"<think>go</think><action>{shadow.expert_action()}</action>"
            ids = self.tokenizer.encode(answer, add_special_tokens=False) + [self.stop]
            out.append(Generation(ids, [-0.5] * len(ids), True))
        return out

    def sync_weights(self, model):
        pass


def test_webshop_eval_metrics_by_hand():
    tokenizer = load_tokenizer("smollm2-135m")
    env = envs.make("webshop", split="test")
    tasks = eval_tasks(env, "test", 12)
    kinds = sorted({t.kind for t in tasks})
    chosen = kinds[:2]
    result = evaluate(ExpertForKinds(tokenizer, env, chosen), tokenizer, env, "test", 12, 2, 0.6, 64, 8192)
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
