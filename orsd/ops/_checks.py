"""Argument validation shared by the op wrappers. Every failure is a ValueError that names the
argument, shows the offending value and says what was expected.

Shape, dtype, device and contiguity checks read only metadata. Value checks (index ranges,
monotone offsets, finite rewards) are collected in a `ValueChecks` and evaluated together, so an
op on CUDA tensors costs exactly one device-to-host sync for all of them; the offending element is
looked up only after a check has failed.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def tensor(
    name: str,
    value: object,
    *,
    dtypes: tuple[torch.dtype, ...],
    ndim: int,
    device: torch.device | None = None,
    device_of: str = "",
) -> torch.Tensor:
    """Check type, dtype, rank, device, layout and memory of one tensor argument: after this the
    kernel may read numel() elements of the dtype from data_ptr() and get exactly the values the
    tensor means."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise ValueError(
            f"{name}: has layout {value.layout}; expected a dense tensor (torch.strided), call .to_dense()"
        )
    if value.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {_names([value.dtype])} is not supported; expected {_names(dtypes)}")
    if value.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(value.shape)}")
    if value.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: tensors on {value.device} are not supported; expected cpu or cuda")
    if device is not None and value.device != device:
        raise ValueError(f"{name}: is on {value.device}, expected {device} (the device of {device_of})")
    # Lazy views keep the raw memory of another tensor and a flag saying how to read it; the
    # kernels read raw memory, so they would see x where the tensor means -x (or conj(x)), and a
    # ZeroTensor has no memory at all.
    if value.is_neg():
        raise ValueError(f"{name}: is a negative-bit view (torch._neg_view); call .resolve_neg() first")
    if value.is_conj():
        raise ValueError(f"{name}: is a conjugate view; call .resolve_conj() first")
    if value._is_zerotensor():
        raise ValueError(f"{name}: is an efficient ZeroTensor without memory; pass torch.zeros(...) instead")
    if not value.is_contiguous():
        raise ValueError(
            f"{name}: must be contiguous (shape {tuple(value.shape)}, strides {value.stride()}); "
            "call .contiguous() first"
        )
    if value.numel() > 0:
        # A storage can be shrunk under a live tensor (untyped_storage().resize_(0), as FSDP does
        # to free a sharded parameter); the kernel would then read freed memory.
        needed = (value.storage_offset() + value.numel()) * value.element_size()
        held = value.untyped_storage().nbytes()
        if held < needed:
            raise ValueError(
                f"{name}: its storage holds {held} bytes but the tensor spans {needed} "
                "(a freed or resized storage); expected a tensor with live memory"
            )
    return value


def length(name: str, value: torch.Tensor, expected: int, what: str) -> None:
    if value.shape[0] != expected:
        raise ValueError(f"{name}: has {value.shape[0]} entries, expected {expected} ({what})")


F32_MAX = 3.4028234663852886e38


def real(
    name: str, value: object, *, positive: bool = False, nonnegative: bool = False, f32: bool = False
) -> float:
    """A finite real number (int, float or NumPy scalar; not a bool or tensor), optionally > 0 or
    >= 0, or (f32) finite once rounded to the f32 a kernel takes it as."""
    if isinstance(value, (bool, torch.Tensor)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int (or Fraction) beyond the double range, e.g. 10**400
        shown = str(value)[:40]
        raise ValueError(f"{name}: expected a finite number, got {shown}... (beyond the f64 range)") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}: expected a finite number, got {number}")
    if positive and number <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {number}")
    if nonnegative and number < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {number}")
    if f32 and abs(number) > F32_MAX:
        raise ValueError(f"{name}: expected |{name}| <= 3.4e38 (it is used as an f32), got {number:g}")
    return number


MIN_TEMPERATURE = 1e-6
"""Smallest softmax temperature the log-prob ops take. The kernels scale by 1/T in f32, which
overflows for a subnormal T (while torch's x / T does not), so some floor is needed; at 1e-6 a
logit gap of 1e-4 is already 100 nats, i.e. the distribution is one-hot to f32 precision, so no
meaningful temperature lies below it."""

MAX_TEMPERATURE = 3.0e38
"""The kernels take the temperature as an f32: it must stay finite there (F32_MAX is 3.4e38)."""


def temperature(name: str, value: object) -> float:
    """A softmax temperature in [MIN_TEMPERATURE, MAX_TEMPERATURE]."""
    number = real(name, value, positive=True)
    if not MIN_TEMPERATURE <= number <= MAX_TEMPERATURE:
        raise ValueError(
            f"{name}: expected a temperature in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {number:g} "
            "(below 1e-6 the softmax is one-hot to f32 precision and 1/T leaves the f32 range)"
        )
    return number


def flag(name: str, value: object) -> bool:
    """A Python bool (not a truthy int or string, which usually means an argument in the wrong place)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")
    return value


def integer(name: str, value: object, *, minimum: int, maximum: int = 2**63 - 1) -> int:
    """An int (or NumPy integer; not a bool) in [minimum, maximum] (by default it must fit int64,
    the kernels' integer type)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name}: expected an int <= {maximum}, got {value}")
    return int(value)


def first_bad(name: str, values: torch.Tensor, bad: torch.Tensor, expected: str) -> str:
    """Message for the first position where `bad` holds (computed only after a check failed)."""
    index = int(torch.nonzero(bad.reshape(-1))[0])
    return (
        f"{name}: value {values.reshape(-1)[index].item()} at index {index} is invalid; expected {expected}"
    )


class ValueChecks:
    """Collects element-wise conditions; `run` evaluates all of them with one host sync."""

    def __init__(self) -> None:
        self._checks: list[tuple[torch.Tensor, Callable[[], str]]] = []

    def add(self, bad: torch.Tensor, message: Callable[[], str]) -> None:
        """`bad`: a bool tensor, True where the input is invalid; `message` builds the error."""
        self._checks.append((bad, message))

    def out_of_range(
        self,
        name: str,
        values: torch.Tensor,
        low: int,
        high: int,
        where: torch.Tensor | None = None,
        note: str = "",
    ) -> None:
        """Require low <= values < high (only where `where` is True, if given). One min/max pass;
        the element-wise mask is built only for the error message."""
        if values.numel() == 0:
            return
        checked = values if where is None else torch.where(where, values, low)
        smallest, largest = torch.aminmax(checked)
        flag = (smallest < low) | (largest >= high)
        expected = f"an index in [{low}, {high}){note}"

        def message() -> str:
            bad = (values < low) | (values >= high)
            return first_bad(name, values, bad if where is None else bad & where, expected)

        self.add(flag, message)

    def run(self, fetch: Iterable[torch.Tensor] = ()) -> list:
        """Raise the first failed check's ValueError; return the `fetch` scalars as Python numbers.

        `fetch` lets a caller piggy-back values it needs on the host (e.g. an output length) on the
        same sync.
        """
        fetch = list(fetch)
        parts = [bad.any().reshape(1).to(torch.int64) for bad, _ in self._checks]
        parts += [value.reshape(1).to(torch.int64) for value in fetch]
        if not parts:
            return []
        host = torch.cat(parts).tolist()
        for flag, (_, message) in zip(host, self._checks):
            if flag:
                raise ValueError(message())
        return host[len(self._checks) :]
