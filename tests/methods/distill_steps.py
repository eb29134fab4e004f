"""Helpers for the OPSD-family step tests: a verifier fake that forces B*, and the gradient of one
step of a method next to GRPO's on the same batch (same groups, same initial weights)."""

from __future__ import annotations

import copy

import numpy as np
import torch

from orsd.rubric import VerifierResult
from orsd.train.build import make_env
from orsd.train.model import frozen_copy
from orsd.train.trainer import Trainer
from scripted import ScriptedEngine, small_config

#: every distillation step here: no gradient clipping (it would rescale the gradients compared)
BASE = ("rollout.tasks_per_step=1", "rollout.group_size=4", "optim.grad_clip=0", "rollout.temperature=0.8")


class RewardVerifier:
    """Test fake verifier: bundle 0's criteria are met exactly by the transcripts with the valid
    scripted action (so ρ > 0 and B* = 0), bundle 1's by the others; criteria listed in `never`
    are met by no transcript of bundle 0 (CriPO's unexplored criteria)."""

    def __init__(self, never: tuple[int, ...] = ()):
        self.never = never
        self.calls = 0

    async def ascore_many_with_events(self, task, transcripts, bundles):
        self.calls += 1
        acted = np.array([1.0 if "search[shirt]" in t else 0.0 for t in transcripts])
        out = []
        for m, bundle in enumerate(bundles):
            row = acted if m == 0 else 1.0 - acted
            scores = np.repeat(row[:, None], len(bundle.criteria), axis=1)
            if m == 0:
                scores[:, list(self.never)] = 0.0
            out.append(VerifierResult(scores))
        return out


def make_trainer(config, model, tokenizer, verifier=None) -> Trainer:
    trainer = Trainer(config, model, tokenizer, frozen_copy(model), verifier, make_env(config),
                      engine=ScriptedEngine(model, tokenizer, config.env.name))
    trainer.writer.initial_engine = ScriptedEngine(trainer.reference, tokenizer, config.env.name)
    return trainer


def gradients(trainer: Trainer, groups) -> tuple[list[torch.Tensor], object]:
    """The gradient of one step's loss (kept in .grad after the optimizer step) and its result."""
    result = trainer.step(copy.deepcopy(groups))
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.policy.parameters()]
    return grads, result


def grpo_batch(model, tokenizer):
    """A GRPO step on a copy of `model`: (its gradients, its groups) — the batch every method reuses."""
    config = small_config("method.name=grpo", *BASE)
    trainer = make_trainer(config, copy.deepcopy(model), tokenizer)
    result = trainer.step()
    grads = [p.grad.detach().clone() for p in trainer.policy.parameters()]
    return grads, result.groups


def method_step(name: str, model, tokenizer, groups, *overrides: str, never: tuple[int, ...] = ()):
    """One step of method `name` on `groups`, from a copy of `model`'s weights: (gradients, result)."""
    config = small_config(f"method.name={name}", *BASE, *overrides)
    trainer = make_trainer(config, copy.deepcopy(model), tokenizer, RewardVerifier(never))
    return gradients(trainer, groups)


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def max_abs(grads: list[torch.Tensor]) -> float:
    return max(float(g.abs().max()) for g in grads)
