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
    """Check type, dtype, rank, device and contiguity of one tensor argument."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {_names([value.dtype])} is not supported; expected {_names(dtypes)}")
    if value.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(value.shape)}")
    if value.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: tensors on {value.device} are not supported; expected cpu or cuda")
    if device is not None and value.device != device:
        raise ValueError(f"{name}: is on {value.device}, expected {device} (the device of {device_of})")
    if not value.is_contiguous():
        raise ValueError(
            f"{name}: must be contiguous (shape {tuple(value.shape)}, strides {value.stride()}); "
            "call .contiguous() first"
        )
    return value


def length(name: str, value: torch.Tensor, expected: int, what: str) -> None:
    if value.shape[0] != expected:
        raise ValueError(f"{name}: has {value.shape[0]} entries, expected {expected} ({what})")


def real(name: str, value: object, *, positive: bool = False, nonnegative: bool = False) -> float:
    """A finite real number (int, float or NumPy scalar; not a bool or tensor), optionally > 0 or >= 0."""
    if isinstance(value, (bool, torch.Tensor)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}: expected a finite number, got {number}")
    if positive and number <= 0:
        raise ValueError(f"{name}: expected a number > 0, got {number}")
    if nonnegative and number < 0:
        raise ValueError(f"{name}: expected a number >= 0, got {number}")
    return number


def integer(name: str, value: object, *, minimum: int) -> int:
    """An int (or NumPy integer; not a bool) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
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
