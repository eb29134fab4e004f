"""Helpers for trainer tests: a scripted engine and small configs.

`ScriptedEngine` is a test fake around the real `HfEngine`: for some prompts it replaces the
sampled reply by a scripted text, tokenized once, and computes that reply's log-probs with a real
forward of the same model (teacher forcing), so records stay exact token-in/token-out. It exists
because a random 2-layer model never writes a valid action or a parsable bundle, and the step's
rubric path needs groups whose rewards differ and bundles that parse.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))

from orsd.train.config import load_config  # noqa: E402
from orsd.engines.base import Generation  # noqa: E402
from orsd.engines.hf import HfEngine  # noqa: E402

BUNDLE = """1. The agent searches with words taken from the task before clicking anything.
2. The agent opens a product whose title matches the requested product type.
3. The agent selects every option the task names before buying.
4. The agent checks the price against the budget stated in the task.
5. The agent never repeats an action that had no effect.
6. The agent clicks Buy Now only on the product page of a matching item."""

VALID = {"webshop": "<think>find it</think><action>search[shirt]</action>",
         "alfworld": "<think>look around</think><action>look</action>"}


class ScriptedEngine(HfEngine):
    """Test fake (see module docstring): bundle prompts get a parsable bundle; episode requests of
    even-numbered samples (from the request key, else the batch position) get a valid action; the
    rest is the model's own sample, or an invalid reply when `fully_scripted`."""

    INVALID = "<think>no idea</think>"

    def __init__(self, model, tokenizer, env_name: str = "webshop", bundle_text: str = BUNDLE,
                 fully_scripted: bool = False):
        super().__init__(model, tokenizer, batch_size=16)
        self.valid_text = VALID[env_name]
        self.bundle_text = bundle_text
        self.fully_scripted = fully_scripted
        self.calls: list[tuple[list[list[int]], list[Generation]]] = []

    def generate(self, prompts, sampling, keys=None):
        generations = [None] * len(prompts) if self.fully_scripted else super().generate(prompts, sampling)
        for i, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            sample = int(keys[i].split(":")[2]) if keys and ":bundle:" not in keys[i] else i
            if "process rubric" in text.lower() and "criteria" in text:
                generations[i] = self.teacher_forced(prompt, self.bundle_text, sampling.temperature)
            elif sample % 2 == 0:
                generations[i] = self.teacher_forced(prompt, self.valid_text, sampling.temperature)
            elif self.fully_scripted:
                generations[i] = self.teacher_forced(prompt, self.INVALID, sampling.temperature)
        self.calls.append((prompts, generations))
        return generations

    @torch.no_grad()
    def teacher_forced(self, prompt: list[int], text: str, temperature: float) -> Generation:
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.stop_ids[0]]
        full = torch.tensor([prompt + ids])
        logits = self.model(full).logits[0, len(prompt) - 1:-1].float() / temperature
        logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        return Generation(ids=ids, logprobs=logprobs.tolist(), finished=True)




def small_config(*overrides: str):
    """A step small enough for a test: 2 tasks x 4 episodes x 2 actions, short budgets."""
    return load_config(None, ["rollout.tasks_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=12",
                              "rollout.max_context_tokens=4096", "env.max_actions=2", "rubric.max_new_tokens=16",
                              "rubric.num_bundles=2", "rubric.transcript_chars=600", "optim.lr=1e-3",
                              "replay.token_budget=8192", "optim.micro_batch_tokens=4096", "model.autocast=",
                              *overrides])


class ExpertReplayEngine:
    """Test fake engine that plays the environment's expert where `plays_expert(task, sample)` says
    so and answers without an action otherwise. It rebuilds each episode from the prompt alone
    (task description + action history, replayed in a shadow copy of the env), so its answers depend
    only on what a policy would see; bundle prompts get a parsable bundle."""

    def __init__(self, tokenizer, env, plays_expert, split=None):
        import re

        self.tokenizer, self.env, self.plays_expert = tokenizer, env, plays_expert
        self.by_description = {t.description: t for t in env.tasks(split or env.split)}
        self.action_pattern = re.compile(r"<action>(.*?)</action>", re.S)
        self.stop = tokenizer.eos_token_id

    def generate(self, prompts, sampling, keys=None):
        out = []
        for i, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt)
            if "process rubric" in text.lower() and "criteria" in text:
                answer = BUNDLE
            else:
                task = next(t for d, t in self.by_description.items() if d in text)
                sample = int(keys[i].split(":")[2]) if keys else i
                answer = "<think>pass</think>"
                if self.plays_expert(task, sample):
                    shadow = self.env.fork()
                    shadow.reset(task)
                    history = text.split("<|im_start|>user", 1)[1]
                    for action in self.action_pattern.findall(history):
                        shadow.step(action)
                    answer = f"<think>go</think><action>{shadow.expert_action()}</action>"
            ids = self.tokenizer.encode(answer, add_special_tokens=False) + [self.stop]
            out.append(Generation(ids, [-0.5] * len(ids), True))
        return out

    def sync_weights(self, model):
        pass
