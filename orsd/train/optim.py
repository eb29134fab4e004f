"""The optimizer and learning-rate schedule of the RL update, built in one place (the plain trainer
and the DeepSpeed wrapper use the same AdamW and warm-up)."""

from __future__ import annotations

import torch


def build_optimizer(parameters, optim) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, from the `optim` config section."""
    return torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=optim.lr, betas=tuple(optim.betas),
                             weight_decay=optim.weight_decay)


def warmup_schedule(optimizer, warmup_steps: int):
    """Linear warm-up over `warmup_steps` optimizer steps, then the constant base rate."""
    warmup = max(warmup_steps, 0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
