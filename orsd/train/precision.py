"""The run's CPU setup, decided once at start and recorded in environment.json: the intra-op thread
count (`model.threads`, a cgroup CPU quota: cpu_quota.py) and the precision `model.autocast: auto`
resolves to (bf16 only where the device runs it well, by its flags or a measurement)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cpu_quota import cpu_quota, threads_for

#: oneDNN primitives kept for reuse (its default: 1,024). One forward and backward of the model asks
#: for a few dozen distinct shapes; every other call has new sequence lengths, so a larger cache
#: only holds memory for no measurable speed (0 is slower: every matmul re-JITs its kernel).
ONEDNN_CACHE_CAPACITY = 64


@dataclass(frozen=True)
class Threads:
    """torch's intra-op thread count as configured at start, and why (logged, environment.json)."""

    count: int
    reason: str


def configure_threads(threads: int) -> Threads:
    """model.threads > 0: that many intra-op threads; 0: OMP_NUM_THREADS where it is set, else one
    per core (torch's default) but no more than a cgroup CPU quota allows (cpu_quota.py: torch
    counts the cores a quota does not hide). Called once at start. Also bounds oneDNN's primitive
    cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY, unless set): oneDNN reads it when it first builds a
    primitive, so it holds for a process whose first bf16 matmul comes after this."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE_CAPACITY))
    if threads:
        torch.set_num_threads(threads)
        return Threads(torch.get_num_threads(), "model.threads")
    if os.environ.get("OMP_NUM_THREADS", "").strip():
        return Threads(torch.get_num_threads(), "OMP_NUM_THREADS")
    seen, quota = torch.get_num_threads(), cpu_quota()
    if quota is not None and threads_for(quota) < seen:
        torch.set_num_threads(threads_for(quota))
        return Threads(torch.get_num_threads(),
                       f"the cgroup's CPU quota of {quota.cpus:g} CPU{'s' * (quota.cpus != 1)} ({quota.source}), "
                       f"where torch saw {seen} cores")
    return Threads(seen, "one per core, torch's default")


# -- model.autocast=auto ----------------------------------------------------------------------------
# bf16 autocast is faster than fp32 where the CPU has bf16 dot-product instructions, and many times
# slower where it has not (oneDNN emulates it), so `auto` never assumes: it reads the CPU's flags
# and, without them, measures.

#: /proc/cpuinfo flags of x86 CPUs that run bf16 matmuls natively (oneDNN uses them for autocast)
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: bf16 must beat fp32 by this factor in the probe: the matmul is not the whole model, and autocast
#: adds casts around it
PROBE_MARGIN = 1.2


@dataclass(frozen=True)
class Precision:
    """What model.autocast resolved to, and why (logged once and kept in environment.json)."""

    requested: str  # the config's value: auto | '' | bfloat16 | float16
    autocast: str  # what runs: '' (fp32) | bfloat16 | float16
    reason: str
    probe_speedup: float | None = None  # fp32 time / bf16 time of the probe matmul, when it ran

    def as_dict(self) -> dict:
        return {"requested": self.requested, "autocast": self.autocast, "reason": self.reason,
                "probe_speedup": self.probe_speedup}


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo; where that cannot be read (not Linux), the bf16
    flags torch's cpuinfo reports."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    flags = set()
    for flag, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_bf16", "_is_amx_tile_supported")):
        if getattr(torch.cpu, check, lambda: False)():
            flags.add(flag)
    return flags


def native_bf16(flags: set[str] | None = None) -> list[str]:
    """The NATIVE_BF16_FLAGS among `flags` (default: this CPU's `cpu_flags()`)."""
    flags = cpu_flags() if flags is None else flags
    return [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


def onednn_isa_cap() -> str | None:
    """The instruction-set cap set for oneDNN (`ONEDNN_MAX_CPU_ISA`, or its older name
    `DNNL_MAX_CPU_ISA`), which runs autocast's CPU matmuls, or None. Capped below the bf16 sets on a
    CPU that has them, oneDNN emulates bf16 like an AVX2 CPU does, many times slower than fp32."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name}={value}"
    return None


def probe_bf16_speedup(hidden_size: int, intermediate_size: int, rows: int = 256,
                       budget_seconds: float = 1.0) -> float:
    """fp32 time / bf16-autocast time of one [rows, hidden] @ [hidden, intermediate] matmul (the
    model's MLP up-projection) on the CPU, best of a few calls within about `budget_seconds`.

    Where bf16 is emulated one call can take many times the fp32 one, so the bf16 side stops as
    soon as its first call has used half the budget: that call alone already says "slower"."""
    x = torch.randn(rows, hidden_size)
    weight = torch.randn(intermediate_size, hidden_size)

    def fp32():
        torch.nn.functional.linear(x, weight)

    def bf16():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.linear(x, weight)

    def best(fn, seconds: float) -> float:
        deadline, times = time.perf_counter() + seconds, []
        while len(times) < 5 and (not times or time.perf_counter() < deadline):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    fp32()  # first calls pay for kernel selection and page faults, not the arithmetic
    fp32_seconds = best(fp32, budget_seconds / 4)
    start = time.perf_counter()
    bf16()
    first = time.perf_counter() - start
    if first > budget_seconds / 2:
        return fp32_seconds / first
    return fp32_seconds / best(bf16, budget_seconds / 2)


def choose_autocast(requested: str, device: torch.device | str, weights_dtype: torch.dtype,
                    hidden_size: int, intermediate_size: int, *, flags: set[str] | None = None,
                    probe: Callable[[], float] | None = None) -> Precision:
    """Resolve model.autocast. Anything but 'auto' is kept as set. 'auto': off for weights that are
    not fp32 (autocast would only add casts); on CUDA, bf16 where the device supports it; on a CPU,
    bf16 where it runs bf16 natively (AMX / AVX-512-BF16 in `flags`, oneDNN not capped by
    `onednn_isa_cap`), else bf16 only when `probe`
    (default: `probe_bf16_speedup` on the model's shape) measures it at least PROBE_MARGIN times
    faster than fp32; otherwise fp32."""
    device = torch.device(device)
    if requested != "auto":
        reason = f"model.autocast={requested!r} set in the config"
        if requested == "bfloat16" and device.type == "cpu" and not native_bf16(flags):
            reason += (", though this CPU has no AMX/AVX-512-BF16: its bf16 matmuls are emulated, 10-30x slower "
                       "than fp32 on AVX2 ('auto' measures before it chooses)")
        return Precision(requested, requested, reason)
    if weights_dtype != torch.float32:
        return Precision(requested, "", f"weights are already {str(weights_dtype).removeprefix('torch.')} "
                                        f"(model.dtype): autocast would only add casts")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision(requested, "bfloat16", f"{torch.cuda.get_device_name(device)} supports bf16")
        return Precision(requested, "", f"{torch.cuda.get_device_name(device)} has no bf16 support")
    if device.type != "cpu":
        return Precision(requested, "", f"no bf16 rule for device {device.type!r}: fp32")
    native, cap = native_bf16(flags), onednn_isa_cap()
    if native and cap is None:
        return Precision(requested, "bfloat16", f"the CPU runs bf16 natively ({', '.join(native)})")
    # without the flags, or with them but oneDNN capped (it may then emulate bf16): measure
    speedup = (probe or (lambda: probe_bf16_speedup(hidden_size, intermediate_size)))()
    measured = (f"a {hidden_size}x{intermediate_size} matmul probe ran bf16 at {speedup:.2f}x the speed "
                f"of fp32")
    found = f"the CPU has {', '.join(native)} but {cap} is set" if native else "no AMX/AVX-512-BF16"
    if speedup >= PROBE_MARGIN:
        return Precision(requested, "bfloat16", f"{found}, and {measured}", speedup)
    return Precision(requested, "", f"{found}, and {measured}: fp32", speedup)


_RESOLVED: dict[tuple, Precision] = {}


def resolve_autocast(model, requested: str, decided: Precision | None = None) -> Precision:
    """`choose_autocast` for this model (its device, weights dtype and shape), decided once per
    process and shape: the probe is a measurement, and a run must not change its mind mid-way.
    `decided`: the choice another process of the run made for this model (the warm start's child),
    kept as this process's."""
    parameter = next(model.parameters())
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None) or 1024
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    key = (requested, str(parameter.device), parameter.dtype, hidden, intermediate)
    if decided is not None:
        _RESOLVED[key] = decided
    elif key not in _RESOLVED:
        _RESOLVED[key] = choose_autocast(requested, parameter.device, parameter.dtype, hidden, intermediate)
    return _RESOLVED[key]
