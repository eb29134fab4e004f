"""Training methods as plug-ins of one step: `make_method(config)` builds the object that decides
what the step does (see base.Method). Add a method by subclassing Method and listing it here."""

from __future__ import annotations

from .base import Advantages, BundleRequest, Candidates, Method
from .cripo import CriPO
from .gigpo import GiGPO
from .opsd import OPSD, GRPOOPSD
from .orsd import ORSD, OfflineRubric, RandomBundle, SingleBundle
from .sdar import SDAR
from .static_rubric import StaticRubric

#: method.name -> class; the one place a method's name is looked at
METHODS: dict[str, type[Method]] = {
    "orsd": ORSD,
    "grpo": Method,
    "offline_rubric": OfflineRubric,
    "single_bundle": SingleBundle,
    "random_bundle": RandomBundle,
    "gigpo": GiGPO,
    "static_rubric": StaticRubric,
    "opsd": OPSD,
    "grpo_opsd": GRPOOPSD,
    "sdar": SDAR,
    "cripo": CriPO,
}


def make_method(config) -> Method:
    try:
        cls = METHODS[config.method.name]
    except KeyError:
        raise ValueError(f"method.name={config.method.name!r} is unknown: expected one of {sorted(METHODS)}") from None
    return cls(config)


__all__ = ["METHODS", "Advantages", "BundleRequest", "Candidates", "Method", "make_method"]
