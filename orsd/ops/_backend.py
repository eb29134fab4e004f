"""Which implementation runs each op: the native module `orsd._C` (CPU always, CUDA when compiled
and a device is present) or, when the module is missing, the torch reference with one warning."""

from __future__ import annotations

import functools
import warnings

import torch

try:
    from orsd import _C
except ImportError as error:  # an install without the compiled extension
    _C = None
    _IMPORT_ERROR: ImportError | None = error
else:
    _IMPORT_ERROR = None

# dtype codes shared with csrc/include/orsd/common.h (enum class DType)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_warned_reference = False
#: device kinds whose native kernels failed the self-check and were set aside (kind -> why)
_distrusted: dict[str, str] = {}


def distrust(kind: str, reason: str) -> None:
    """Route every op on `kind` ("cpu" | "cuda") tensors to the torch reference from now on, because
    its kernels disagreed with the reference (the run asked for the fallback, see orsd.train.build)."""
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"kind: expected 'cpu' or 'cuda', got {kind!r}")
    _distrusted[kind] = reason


def backend() -> dict[str, str]:
    """Report the implementation each device uses, e.g. {"cpu": "native", "cuda": "absent"}.

    "cpu": "native" (C++ kernels) or "absent" (orsd._C missing: torch reference).
    "cuda": "native" (CUDA kernels and a usable device), "compiled-no-device" (CUDA kernels built
    but no driver/device), or "absent" (built without CUDA or orsd._C missing: CUDA tensors use
    the torch reference). Extra keys: "cpu_isa" (the CPU row-math instruction set, "" without the
    module) and "cuda_detail" (the device probe's message or the import error).
    """
    if _C is None:
        return {"cpu": "absent", "cuda": "absent", "cpu_isa": "", "cuda_detail": str(_IMPORT_ERROR)}
    report = {"cpu": "native", "cpu_isa": _C.cpu_isa()}
    if _distrusted:  # set aside after a failed self-check: those tensors use the reference
        report["distrusted"] = dict(_distrusted)
    if not _C.cuda_compiled():
        report.update(cuda="absent", cuda_detail="built without CUDA kernels")
        return report
    count, code, message = _C.cuda_probe()
    if count > 0:
        report.update(cuda="native", cuda_detail=f"{count} device(s), archs {_C.cuda_archs()}")
    else:
        report.update(cuda="compiled-no-device", cuda_detail=f"cuda error {code}: {message}")
    return report


@functools.lru_cache(maxsize=1)
def _cuda_kernels_usable() -> bool:
    # Our kernels run on this module's own (static) CUDA runtime, which may need a newer driver
    # than torch's: torch seeing a GPU is not enough.
    return _C is not None and _C.cuda_compiled() and _C.cuda_probe()[0] > 0


def native_kind(device: torch.device) -> str | None:
    """Return "cpu" or "cuda" when a native kernel serves tensors on `device`, else None."""
    if _C is None or device.type in _distrusted:
        return None
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda" and _cuda_kernels_usable():
        return "cuda"
    return None


def warn_reference(op: str) -> None:
    """Warn once per process that the torch reference stands in for the native kernels."""
    global _warned_reference
    if _warned_reference:
        return
    _warned_reference = True
    if _distrusted:
        reason = "the native kernels failed the self-check (" + "; ".join(_distrusted.values()) + ")"
    elif _C is None:
        reason = "orsd._C could not be imported"
    elif not _C.cuda_compiled():
        reason = "it was built without CUDA kernels"
    else:
        reason = "its CUDA kernels cannot run here"
    warnings.warn(
        f"orsd.ops.{op}: using the pure-torch reference implementation because {reason} "
        f"(orsd.ops.backend() = {backend()}); results are the same, speed and memory are not",
        RuntimeWarning,
        stacklevel=3,
    )


def num_threads() -> int:
    """Threads for the OpenMP kernels: torch's setting, so both share one budget (and libgomp)."""
    return max(1, torch.get_num_threads())


def cuda_launch_args(tensor: torch.Tensor) -> tuple[int, int]:
    """(device index, current stream handle) for launching on `tensor`'s device."""
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(index).cuda_stream


def ptr(tensor: torch.Tensor | None) -> int:
    """Raw address for the native module; 0 stands for an absent optional tensor."""
    return 0 if tensor is None else tensor.data_ptr()
