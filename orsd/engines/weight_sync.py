"""Moving a policy's parameters into a rollout engine in bounded buckets, with a deadline.

Engine-agnostic: it walks the policy's parameters in order, groups them into buckets of at most
`bucket_bytes` (full, unpartitioned size), gathers one bucket at a time (DeepSpeed ZeRO-3
parameters are all-gathered only for the bucket in hand, so the whole model is never
materialised at once) and runs every stage under a deadline that fails loudly, naming the stage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


class WeightSyncTimeout(RuntimeError):
    """A weight-sync stage did not finish in time; the rollout engine is unusable afterwards."""

    def __init__(self, stage: str, timeout_seconds: float, detail: str = ""):
        self.stage = stage
        self.timeout_seconds = timeout_seconds
        message = f"vllm weight sync timed out after {timeout_seconds:.1f} s in stage {stage!r}"
        super().__init__(message + (f" ({detail})" if detail else ""))


@dataclass(frozen=True)
class Bucket:
    names: list[str]
    params: list[torch.nn.Parameter]
    nbytes: int  # full (gathered) size of the parameters it holds

    def describe(self) -> str:
        return f"{len(self.names)} parameters from {self.names[0]!r}, {self.nbytes / 2**20:.1f} MiB"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model inside DeepSpeed/DDP wrappers (`.module`), so names carry no `module.` prefix."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def is_zero3(param: torch.Tensor) -> bool:
    """DeepSpeed ZeRO-3 partitions a parameter in place and tags it with `ds_id`/`ds_status`."""
    return hasattr(param, "ds_id") and hasattr(param, "ds_status")


def full_nbytes(param: torch.Tensor) -> int:
    numel = param.ds_numel if is_zero3(param) else param.numel()
    return int(numel) * param.element_size()


def named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's parameters under the HF checkpoint's names, in `named_parameters` order (tied
    weights once). A peft LoRA layer (model.lora: `base_layer` with `lora_A`/`lora_B`) gives its
    weight merged, W + scaling·B·A for its active adapters, under the base layer's name, and its
    adapter factors not at all: vLLM knows only the base architecture and gets the adapted policy."""
    model = unwrap(model)
    adapted = {name: module for name, module in model.named_modules()
               if hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "get_delta_weight")}
    for name, param in model.named_parameters():
        if not adapted:
            yield name, param
            continue
        if ".lora_" in name:  # an adapter factor: merged into its base weight
            continue
        owner, found, leaf = name.rpartition(".base_layer.")
        if not found or owner not in adapted:
            yield name, param
        elif leaf != "weight":
            yield f"{owner}.{leaf}", param
        else:
            module = adapted[owner]
            with torch.no_grad():
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
            yield f"{owner}.weight", param.detach() + delta.to(param.dtype)


def buckets(model: torch.nn.Module, bucket_bytes: int) -> Iterator[Bucket]:
    """named_tensors(model) (parameters; a LoRA layer's weight merged), grouped up to
    `bucket_bytes`; a tensor larger than the bound travels alone."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: expected a positive byte count")
    names: list[str] = []
    params: list[torch.nn.Parameter] = []
    size = 0
    for name, param in named_tensors(model):
        nbytes = full_nbytes(param)
        if params and size + nbytes > bucket_bytes:
            yield Bucket(names, params, size)
            names, params, size = [], [], 0
        names.append(name)
        params.append(param)
        size += nbytes
    if params:
        yield Bucket(names, params, size)


def gather(bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """The bucket's full tensors. ZeRO-3 parameters are gathered for this bucket only and
    copied out, since their storage is released again when the gather context exits."""
    if not any(is_zero3(p) for p in bucket.params):
        return [(name, param.detach()) for name, param in zip(bucket.names, bucket.params)]
    import deepspeed

    with deepspeed.zero.GatheredParameters(bucket.params, modifier_rank=None):
        return [(name, param.detach().clone()) for name, param in zip(bucket.names, bucket.params)]


class Deadline:
    """One time budget for a whole sync; each stage runs in a watched thread and may use what
    is left of it. A thread that overruns cannot be cancelled, so the caller must treat the
    raised `WeightSyncTimeout` as fatal for the engine (the thread is a daemon: it never keeps
    the process alive)."""

    def __init__(self, timeout_seconds: float, hook: Callable[[str], None] | None = None):
        if not timeout_seconds > 0:
            raise ValueError(f"sync_timeout_seconds={timeout_seconds}: expected a positive number of seconds")
        self.timeout_seconds = timeout_seconds
        self.expires = time.monotonic() + timeout_seconds
        self.hook = hook  # called at the start of every stage, inside the watched thread (tests)

    def run(self, stage: str, fn: Callable[[], object], detail: str = ""):
        outcome: dict[str, object] = {}
        done = threading.Event()
        device = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

        def target():
            try:
                if device is not None:  # the current CUDA device is per thread
                    torch.cuda.set_device(device)
                if self.hook is not None:
                    self.hook(stage)
                outcome["value"] = fn()
            except BaseException as error:  # handed to the caller's thread below
                outcome["error"] = error
            finally:
                done.set()

        thread = threading.Thread(target=target, name=f"orsd-weight-sync-{stage}", daemon=True)
        thread.start()
        if not done.wait(max(self.expires - time.monotonic(), 0.0)):
            raise WeightSyncTimeout(stage, self.timeout_seconds, detail)
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome.get("value")
