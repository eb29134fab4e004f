"""Text environments for multi-turn agents: the protocol, `make`, action parsing and rewards.

`make("webshop" | "alfworld", split, seed, **options)` builds an env; `parse_action` turns a
policy reply into a command; `orsd.envs.rewards` holds the paper's Eq. 12/13 and
`orsd.envs.prompts` the chat prompts. Environment modules are imported lazily, so importing
`orsd.envs` needs neither the alfworld package nor the shop's catalog.
"""

from __future__ import annotations

from typing import Any

from orsd.envs.actions import parse_action
from orsd.envs.base import INFO_KEYS, Env, Task

#: the splits of each environment, training split first
SPLITS: dict[str, tuple[str, ...]] = {
    "webshop": ("train", "dev", "test"),
    "alfworld": ("train", "valid_seen", "valid_unseen"),
}

__all__ = ["INFO_KEYS", "SPLITS", "Env", "Task", "from_config", "make", "parse_action"]


def from_config(env) -> Env:
    """`make` from a run config's `env` section (name, split, seed, options, max_actions)."""
    options = dict(env.options)
    if env.max_actions:
        options.setdefault("max_actions", env.max_actions)
    return make(env.name, split=env.split, seed=env.seed, **options)


def make(name: str, split: str = "train", seed: int = 0, **options: Any) -> Env:
    """Build environment `name` on `split`, seeded with `seed`.

    `options` go to the env's constructor: for "webshop" those of `WebShopEnv` (or, with
    `backend="real"`, of `WebShopRealEnv`, an adapter for an installed WebShop); for "alfworld"
    those of `AlfworldEnv`.
    """
    if name not in SPLITS:
        raise ValueError(f"unknown environment name={name!r}; expected one of {sorted(SPLITS)}")
    if split not in SPLITS[name]:
        raise ValueError(
            f"unknown split={split!r} for environment {name!r}; "
            f"expected one of {list(SPLITS[name])}"
        )
    if name == "alfworld":
        from orsd.envs.alfworld import AlfworldEnv

        return AlfworldEnv(split=split, seed=seed, **options)
    backend = options.pop("backend", "generated")
    if backend == "generated":
        from orsd.envs.webshop import WebShopEnv

        return WebShopEnv(split=split, seed=seed, **options)
    if backend == "real":
        from orsd.envs.webshop.real import WebShopRealEnv

        return WebShopRealEnv(split=split, seed=seed, **options)
    raise ValueError(f"unknown webshop backend={backend!r}; expected 'generated' or 'real'")
