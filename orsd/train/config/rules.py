"""What a config value may be: `Allowed` (choices, bounds, pattern, length; declared next to a
field's default with `doc`) and `ConfigError`, the one exception every refused value becomes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Allowed:
    """What values a field accepts, declared next to its default and help: `choices` (or a function
    returning them, where another module owns the names), bounds `ge`/`gt`/`le`/`lt` (a number;
    applied to each element of a list), a `pattern` the whole string must match, a list `length`.
    Numbers must always be finite. `text` says it in words where a pattern or a cross-field rule in
    `Config.validate` needs them; `secret` keeps a rejected value out of the error (a pasted key)."""

    choices: tuple | Callable[[], tuple] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pattern: str = ""
    length: int | None = None
    text: str = ""
    secret: bool = False

    @property
    def options(self) -> tuple:
        return self.choices() if callable(self.choices) else self.choices

    @property
    def bounded(self) -> bool:
        return any(bound is not None for bound in (self.ge, self.gt, self.le, self.lt))

    @property
    def declared(self) -> bool:
        return bool(self.choices or self.bounded or self.pattern or self.length is not None or self.text)

    def accepts(self, value: Any) -> bool:
        if isinstance(value, list):
            if self.length is not None and len(value) != self.length:
                return False
            return all(self._accepts_one(v) for v in value)
        return self._accepts_one(value)

    def _accepts_one(self, value: Any) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False  # NaN passes every comparison below, and no key means infinity
        if self.choices and value not in self.options:
            return False
        if self.pattern and not (isinstance(value, str) and re.fullmatch(self.pattern, value)):
            return False
        if self.bounded:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
            return not ((self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt)
                        or (self.le is not None and value > self.le) or (self.lt is not None and value >= self.lt))
        return True

    def describe(self, integer: bool = False) -> str:
        """In words, for errors and docs; `integer` for fields of type int."""
        if self.text:
            return self.text
        if self.choices:
            return "one of " + " | ".join(repr(c) if c == "" else str(c) for c in self.options)
        bounds = [f"{op} {_number(bound)}" for op, bound in
                  ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)) if bound is not None]
        what = ("an integer" if integer else "a finite number") + (" " + " and ".join(bounds) if bounds else "")
        return f"a list of {self.length} numbers, each {what}" if self.length else what


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def doc(default: Any, help: str, *, choices: tuple | Callable[[], tuple] = (), ge: float | None = None,
        gt: float | None = None, le: float | None = None, lt: float | None = None, pattern: str = "",
        length: int | None = None, text: str = "", secret: bool = False, resumable: bool = False,
        **kw: Any) -> Any:
    """A dataclass field with its help text and allowed values (kept next to the default).
    `resumable`: the key may differ on `--resume` without changing the run's results (logging,
    evaluation, checkpoint cadence, the step count).
    Size: a field's default, help and each kind of bound as keywords, as dataclasses.field takes its own."""
    allowed = Allowed(choices if callable(choices) else tuple(choices), ge, gt, le, lt, pattern, length, text, secret)
    metadata = {"help": help, "allowed": allowed, "resumable": resumable}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


#: seeds go to random, numpy and torch; numpy refuses negative seeds, torch those of 64 bits and more
SEED = dict(ge=0, lt=2**32)


class ConfigError(ValueError):
    """A config key that does not exist, a value of the wrong type or range, or a config file that
    cannot be read. `key` is the dotted key at fault, when there is one."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key

    def at(self, where: str | None) -> "ConfigError":
        """The same error prefixed with where the value came from (file:line, or command line)."""
        return ConfigError(f"{where}: {self}", self.key) if where else self
