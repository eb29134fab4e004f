"""The study's pre-registration: what it will be judged on, fixed in study.json before the first run.

A reviewer trusts a comparison over few seeds only when the test was chosen before the data
(Henderson et al. 2018; Agarwal et al. 2021). So `orsd-study` writes, at its first invocation and
before the initial policy or any run exists, the primary endpoint, the baseline arm, the equivalence
margin and the tests' α, and which arms are primary (they form the family the Holm correction runs
over) and which exploratory. A later invocation that asks for another endpoint, baseline, margin or α
is refused; an arm that appears only after the first run is recorded as added later and is never
part of the primary family. A study whose study.json predates registration gets one marked
`post_hoc`: its report says the endpoint was chosen after the runs.
"""

from __future__ import annotations

import math
import time

from .grid import StudyError

#: endpoint name -> what it measures, as the report prints it
ENDPOINTS = {
    "heldout_score": "held-out score (the env's partial credit per episode, eval.jsonl score_mean) at the last "
                     "evaluation every run shares, paired by seed against the baseline",
    "heldout_success": "held-out success rate at the last evaluation every run shares, paired by seed against "
                       "the baseline",
    "learning": "training reward, mean of the last K steps minus the first K, paired by seed against the baseline",
}
DEFAULT_ENDPOINT = "heldout_score"
DEFAULT_MARGIN = 0.05
DEFAULT_ALPHA = 0.05
#: the fields a resumed study may not change
FIXED = ("endpoint", "baseline", "margin", "alpha")


def check_values(endpoint: str | None, margin: float | None, alpha: float | None) -> None:
    """One-line errors for values no registration can hold."""
    if endpoint is not None and endpoint not in ENDPOINTS:
        raise StudyError(f"--endpoint {endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
    if margin is not None and not (math.isfinite(margin) and margin > 0):
        raise StudyError(f"--margin {margin}: expected a positive number (the equivalence margin in the endpoint's "
                         f"units, e.g. 0.05)")
    if alpha is not None and not (math.isfinite(alpha) and 0 < alpha < 1):
        raise StudyError(f"--alpha {alpha}: expected a number between 0 and 1 (e.g. 0.05)")


def register(recorded: dict | None, labels: list[str], exploratory: list[str], baseline: str, *,
             endpoint: str | None, margin: float | None, alpha: float | None, started: bool) -> dict:
    """study.json's "registration" after this invocation.

    `recorded`: the registration already in study.json (None: none yet). `labels`: this invocation's arms;
    `exploratory`: those of them declared exploratory; `baseline`: the resolved baseline label; `started`:
    whether any run or the initial policy exists (then a study without a registration is post hoc, and a
    new arm is added later). Values given as None take the recorded ones, else the defaults.
    """
    check_values(endpoint, margin, alpha)
    unknown = sorted(set(exploratory) - set(labels))
    if unknown:
        raise StudyError(f"--exploratory {' '.join(unknown)}: expected labels of --arms ({', '.join(labels)})")
    if baseline in exploratory:
        raise StudyError(f"--exploratory {baseline}: the baseline arm cannot be exploratory")
    asked = {"endpoint": endpoint, "baseline": baseline, "margin": margin, "alpha": alpha}
    if recorded is None:
        registration = {"endpoint": endpoint or DEFAULT_ENDPOINT, "baseline": baseline,
                        "margin": DEFAULT_MARGIN if margin is None else margin,
                        "alpha": DEFAULT_ALPHA if alpha is None else alpha,
                        "registered": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "post_hoc": started, "arms": {}}
    else:
        registration = {**recorded, "arms": dict(recorded.get("arms") or {})}
        for key in FIXED:
            if asked[key] is not None and asked[key] != recorded.get(key):
                flag = "--baseline" if key == "baseline" else f"--{key}"
                raise StudyError(f"{flag} {asked[key]}: this study was registered with {key} {recorded.get(key)!r} "
                                 f"before its first run (study.json); changing it after seeing results would let "
                                 f"the data choose the test: keep it, or start a new --out")
    for label in labels:
        if label not in registration["arms"]:
            registration["arms"][label] = {"role": "exploratory" if label in exploratory else "primary",
                                           "added_later": bool(recorded is not None and started)}
        elif label in exploratory and registration["arms"][label]["role"] != "exploratory":
            raise StudyError(f"--exploratory {label}: the arm was registered as primary; its role is fixed "
                             f"with the registration")
    if registration["baseline"] not in registration["arms"]:
        raise StudyError(f"--baseline {registration['baseline']}: not an arm of this study")
    return registration


def post_hoc(labels: list[str], baseline: str, *, endpoint: str | None = None, margin: float | None = None,
             alpha: float | None = None) -> dict:
    """A registration for a study recorded without one (its report labels the endpoint as chosen after
    the runs): the defaults, or what the report asks for."""
    check_values(endpoint, margin, alpha)
    return {"endpoint": endpoint or DEFAULT_ENDPOINT, "baseline": baseline,
            "margin": DEFAULT_MARGIN if margin is None else margin, "alpha": DEFAULT_ALPHA if alpha is None else alpha,
            "registered": None, "post_hoc": True,
            "arms": {label: {"role": "primary", "added_later": False} for label in labels}}


def family(registration: dict) -> list[str]:
    """The primary comparisons (arm labels against the baseline) the Holm correction runs over:
    registered primary arms, never one added later."""
    return [label for label, arm in registration["arms"].items()
            if label != registration["baseline"] and arm["role"] == "primary" and not arm["added_later"]]


def role(registration: dict, label: str) -> str:
    arm = registration["arms"].get(label) or {"role": "exploratory", "added_later": True}
    if label == registration["baseline"]:
        return "baseline"
    return "exploratory (added later)" if arm["added_later"] else arm["role"]
