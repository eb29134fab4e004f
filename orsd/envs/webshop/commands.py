"""What the generated shop and the real-WebShop adapter share: the env itself (`WebShopBase`: the
name "webshop", the train/dev/test splits and their check) and the command grammar,
`search[<query>]` and `click[<label>]`, case-insensitive verbs, the argument stripped."""

from __future__ import annotations

import re

from orsd.envs.base import Env

#: the shop's goal splits (WebShop's), the training split first
SPLITS = ("train", "dev", "test")

_COMMAND = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_ECHO_CHARS = 60


class WebShopBase(Env):
    """The env both backends are: named "webshop", with its three splits (training first)."""

    name = "webshop"
    splits = SPLITS

    @staticmethod
    def check_split(split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)} for webshop, got {split!r}")


def echo(text: str) -> str:
    """A bounded repr of a command for the observation that explains why it was refused."""
    return repr(text if len(text) <= _ECHO_CHARS else text[:_ECHO_CHARS] + "...")


def split_command(action: object) -> tuple[str, str] | tuple[None, str]:
    """(verb, argument) of a well-formed command, else (None, why it is invalid). Anything that is
    not a string (the protocol: `step` never raises on a bad action) is invalid too."""
    if action is None:
        return None, "the reply had no well-formed <action>...</action>."
    if not isinstance(action, str):
        return None, f"the action must be text, got {type(action).__name__}."
    match = _COMMAND.match(action)
    if match is None:
        return None, f"unknown command {echo(action)}; use search[...] or click[...]."
    return match.group(1).lower(), match.group(2).strip()
