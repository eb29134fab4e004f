"""Data-parallel training with DeepSpeed ZeRO (launched by `deepspeed` or `torchrun`).

Each rank rolls out, verifies and replays its own share of the step's tasks; DeepSpeed averages
gradients over the D ranks, so with every rank weighting its tokens by 1/(G·|micro-batch|) the
update is the paper's Eq. 14 with D·G micro-batches. G is the largest micro-batch count of any
rank; ranks with fewer run zero-weight micro-batches so that every rank makes the same number of
forward/backward calls (ZeRO-3 gathers parameters collectively in both). Under ZeRO-3 the no-grad
replay forwards are padded the same way. Everything here is imported lazily: single-process runs
never need DeepSpeed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from .optim import build_optimizer, warmup_schedule


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    zero_stage: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def max_int(self, value: int) -> int:
        """The largest `value` over all ranks (a collective: every rank must call it)."""
        tensor = torch.tensor([value], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return int(tensor.item())

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        torch.distributed.barrier()

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")


def launch_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) as set by torchrun / the deepspeed launcher."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def setup(config) -> Dist | None:
    """Initialise the process group when launched on several ranks or asked for DeepSpeed."""
    rank, world, local = launch_env()
    d = config.distributed
    if world == 1 and not d.deepspeed:
        return None
    if config.rollout.tasks_per_step % world:
        raise ValueError(f"rollout.tasks_per_step={config.rollout.tasks_per_step} must be divisible by the "
                         f"number of ranks ({world}): each rank rolls out an equal share of the tasks")
    if d.zero_stage == 3 and config.rollout.engine == "hf":
        raise ValueError("distributed.zero_stage=3 with rollout.engine=hf: transformers cannot generate from "
                         "ZeRO-3 shards rank by rank; use rollout.engine=vllm or distributed.zero_stage<=2")
    import deepspeed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + (os.getpid() % 1000)))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("LOCAL_RANK", str(local))
    backend = d.backend if d.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    deepspeed.init_distributed(dist_backend=backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    return Dist(rank, world, local, d.zero_stage)


def deepspeed_config(config) -> dict:
    o, d = config.optim, config.distributed
    zero: dict = {"stage": d.zero_stage}
    if d.zero_stage == 3:
        zero["overlap_comm"] = False
    if d.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,
        # the number of micro-batches varies per step: the trainer marks the accumulation boundary
        # itself (deepspeed_backward) and calls step() once per optimizer step
        "gradient_accumulation_steps": 1,
        "gradient_clipping": o.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": config.model.dtype == "bfloat16"},
        "fp16": {"enabled": config.model.dtype == "float16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def wrap(policy, config):
    """The DeepSpeed engine around the policy, with a client AdamW (no JIT-built fused optimizer)."""
    import deepspeed

    o = config.optim
    optimizer = build_optimizer(policy.parameters(), o)

    engine, optimizer, _, _ = deepspeed.initialize(
        model=policy, optimizer=optimizer, config=deepspeed_config(config),
        lr_scheduler=lambda opt: warmup_schedule(opt, o.warmup_steps))
    return engine


def deepspeed_backward(engine, loss, last: bool) -> None:
    """Backward of one micro-batch; gradients are reduced across ranks only at the last one.

    Our forwards call the wrapped module directly, not engine.forward(), so the per-micro-batch
    bookkeeping engine.forward() does (ZeRO-3 counts micro-steps there to accumulate rather than
    overwrite partitioned gradients) is done here, before the backward that depends on it."""
    if hasattr(engine.optimizer, "clear_backward_seen_flag"):
        engine.optimizer.clear_backward_seen_flag()
    engine.set_gradient_accumulation_boundary(last)
    engine.backward(loss, scale_wrt_gas=False)  # Eq. 14's weights already hold the 1/G


def deepspeed_hooks(engine):
    """(backward(loss, last), step() -> grad norm) of the update under DeepSpeed, which owns both;
    (None, None) without it (the update's own backward and optimizer step)."""
    if engine is None:
        return None, None
    return (lambda loss, last: deepspeed_backward(engine, loss, last),
            lambda: (engine.step(), float(engine.get_global_grad_norm() or 0.0))[1])


def gathered(*params):
    """Full values of ZeRO-3-partitioned parameters inside the block (a no-op for others)."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(params), modifier_rank=None)
    return contextlib.nullcontext()
