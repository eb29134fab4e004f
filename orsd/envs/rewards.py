"""The paper's episode rewards: Eq. 12 (ALFWorld) and Eq. 13 (WebShop).

Evaluation reports the raw outcome (ALFWorld success; WebShop official score and success); these
shaped rewards are for training only.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from orsd.envs.base import Env

#: Eq. 13 weights: score term, success bonus, invalid-action and no-progress penalties
WEBSHOP_SCORE_WEIGHT = 0.5
WEBSHOP_SUCCESS_BONUS = 0.5
WEBSHOP_INVALID_PENALTY = 0.05
WEBSHOP_NO_PROGRESS_PENALTY = 0.025


def alfworld_reward(won: bool) -> float:
    """Eq. 12: 1.0 when the task was completed, else 0.0."""
    if not isinstance(won, (bool, Integral)) or won not in (0, 1):
        raise TypeError(f"won must be a bool, got {won!r}")
    return 1.0 if won else 0.0


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def webshop_reward(score: float, n_invalid: int, n_no_progress: int, n_actions: int) -> float:
    """Eq. 13: 0.5·score + 0.5·1[score = 1] − 0.05·n_invalid/max(T,1)
    − 0.025·n_no_progress/max(T,1).

    `score` is WebShop's official episode score in [0, 1] (0 when nothing was bought) and T =
    `n_actions` the attempted actions of the episode, invalid ones included. Each count lies in
    [0, T] independently (an action can be both invalid and no progress).
    """
    if isinstance(score, bool) or not isinstance(score, Real):
        raise TypeError(f"score must be a float in [0, 1], got {score!r}")
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise ValueError(f"score must be a finite float in [0, 1], got {score!r}")
    n_invalid = _count("n_invalid", n_invalid)
    n_no_progress = _count("n_no_progress", n_no_progress)
    n_actions = _count("n_actions", n_actions)
    # each count lies in [0, T] on its own: a repeated invalid action is both invalid and no progress
    for name, count in (("n_invalid", n_invalid), ("n_no_progress", n_no_progress)):
        if count > n_actions:
            raise ValueError(f"{name} must be <= n_actions (the attempted actions), got {count} > {n_actions}")
    horizon = max(n_actions, 1)
    return (
        WEBSHOP_SCORE_WEIGHT * float(score)
        + WEBSHOP_SUCCESS_BONUS * (1.0 if score == 1.0 else 0.0)
        - WEBSHOP_INVALID_PENALTY * n_invalid / horizon
        - WEBSHOP_NO_PROGRESS_PENALTY * n_no_progress / horizon
    )


def episode_reward(env: Env, info: dict[str, Any] | None = None) -> float:
    """The training reward of `env`'s finished episode: Eq. 12 for ALFWorld, Eq. 13 for WebShop.

    Reads the episode counters of `env` and `info` (default: `env.last_info`, the info of the
    episode's last step).
    """
    if not isinstance(env, Env):
        raise TypeError(f"env must be an orsd.envs.Env, got {type(env).__name__}")
    if not env.done:
        raise ValueError(f"the episode of env {env.name!r} is not finished (env.done is False)")
    info = env.last_info if info is None else info
    if not isinstance(info, dict) or not all(key in info for key in ("won", "score")):
        raise ValueError(
            f"info must be the last step's info dict with 'won' and 'score', got {info!r}"
        )
    if env.name == "alfworld":
        return alfworld_reward(bool(info["won"]))
    if env.name == "webshop":
        return webshop_reward(
            float(info["score"]), env.num_invalid, env.num_no_progress, env.num_actions
        )
    raise ValueError(
        f"no episode reward for env name {env.name!r}; expected 'alfworld' or 'webshop'"
    )
