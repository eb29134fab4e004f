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

__all__ = ["INFO_KEYS", "SPLITS", "Env", "Task", "from_config", "make", "option_names", "parse_action"]


def env_class(name: str, backend: str = "generated") -> type[Env]:
    """The class `make(name, backend=...)` builds (its module imported, no data loaded)."""
    if name == "alfworld":
        from orsd.envs.alfworld import AlfworldEnv

        return AlfworldEnv
    if backend == "real":
        from orsd.envs.webshop.real import WebShopRealEnv

        return WebShopRealEnv
    from orsd.envs.webshop import WebShopEnv

    return WebShopEnv


def option_names(name: str, backend: str = "generated") -> tuple[str, ...]:
    """The keyword options `make(name, ...)` accepts: the env class's keyword-only constructor
    parameters (read from its signature, so the list cannot drift from the code), and the shop's
    `backend`. A run config's env.options is checked against these before anything is built."""
    import inspect

    parameters = inspect.signature(env_class(name, backend).__init__).parameters.values()
    names = tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY and not p.name.startswith("_"))
    return (*names, "backend") if name == "webshop" else names


def from_config(env, split: str | None = None) -> Env:
    """`make` from a run config's `env` section (name, split, seed, options, max_actions), on
    `split` when given (a held-out split)."""
    options = dict(env.options)
    if env.max_actions:
        options.setdefault("max_actions", env.max_actions)
    return make(env.name, split=split or env.split, seed=env.seed, **options)


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
    backend = options.pop("backend", "generated") if name == "webshop" else "generated"
    if backend not in ("generated", "real"):
        raise ValueError(f"unknown webshop backend={backend!r}; expected 'generated' or 'real'")
    return env_class(name, backend)(split=split, seed=seed, **options)
