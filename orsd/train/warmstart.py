"""Warm start: a short supervised fit on expert demonstrations, in the rollout's own format.

A 135M model zero-shot almost never writes a valid `<action>`, so every reward in a group is
equal and neither GRPO nor ORSD has a signal. Demonstrations come from `env.expert_action()`
played in the same chat format the policy sees during rollouts; with `noise` > 0 a random command
is sometimes executed instead of the expert's (the label stays the expert's), so the demos also
cover states off the expert's path (DAgger-style).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from orsd.envs.prompts import demonstration_answer

from .records import Trajectory
from .replay import pack, batch_positions, train_logprobs
from .rollout import build_context


@dataclass
class Demo:
    context_ids: list[int]
    response_ids: list[int]


def collect_demos(env, tokenizer, episodes: int, max_context_tokens: int, rng: random.Random,
                  noise: float = 0.0, max_actions: int = 0) -> list[Demo]:
    demos = []
    stop = tokenizer.eos_token_id
    for _ in range(episodes):
        task = env.sample_task(rng)
        episode = env.fork()
        trajectory = Trajectory(task=task, observations=[episode.reset(task)], actions=[])
        done = False
        while not done and episode.num_actions < (max_actions or env.max_actions):
            context, _, _ = build_context(tokenizer, episode, trajectory, max_context_tokens)
            expert = episode.expert_action()
            answer = demonstration_answer(env.name, expert)
            demos.append(Demo(context, tokenizer.encode(answer, add_special_tokens=False) + [stop]))
            admissible = episode.admissible_actions()
            action = expert
            if noise and rng.random() < noise:
                action = rng.choice(admissible) if admissible else expert
            observation, done, _ = episode.step(action)
            trajectory.actions.append(action)
            trajectory.observations.append(observation)
    return demos


def warm_start(model, demos: list[Demo], epochs: int, lr: float, batch_size: int, seed: int = 0,
               progress=None) -> list[float]:
    """Cross-entropy on the demonstration answers only; returns the loss of every optimizer step."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = random.Random(seed)
    losses = []
    model.train()
    for _ in range(epochs):
        order = list(range(len(demos)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chosen = [demos[i] for i in order[start:start + batch_size]]
            packed = pack([_as_record(d) for d in chosen])
            batch = list(range(len(chosen)))
            positions = batch_positions(packed.response_mask, packed.cu_seqlens, batch)
            logprobs, _ = train_logprobs(model, packed.ids, packed.cu_seqlens, batch, positions, 1.0)
            loss = -logprobs.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                progress(losses[-1])
    return losses


class _as_record:
    """The two fields `pack` reads, without building a full TurnRecord."""

    def __init__(self, demo: Demo):
        self.context_ids, self.response_ids = demo.context_ids, demo.response_ids

    @property
    def num_tokens(self) -> int:
        return len(self.context_ids) + len(self.response_ids)
