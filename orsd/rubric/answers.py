"""Reading verifier answers: the JSON score object and the yes/no next-token distribution.

Tolerant where a model is sloppy (code fences, prose around the object, numbers as strings,
`<think>` blocks), strict where it matters: every criterion gets a finite score in [0, 1] or NaN,
and every NaN comes with a recorded reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_DECODER = json.JSONDecoder()

#: reasons recorded for a cell (or a whole answer) that ends unscored
MISSING_SCORE = "missing_score"
EXTRA_SCORE = "extra_score"  # recorded, but the K expected scores are kept
UNPARSABLE_SCORE = "unparsable_score"
MALFORMED_JSON = "malformed_json"
NO_YES_NO_TOKEN = "no_yes_no_token"
LOGPROBS_MISSING = "logprobs_missing"


@dataclass
class Problem:
    """Why a cell (trajectory, criterion) went unscored; None in a position means "all of them"."""

    trajectory: int | None
    criterion: int | None
    reason: str
    detail: str = ""


@dataclass
class ParsedScores:
    """A parsed answer: `scores` [K] or [N, K] with NaN where unscored, and what went wrong."""

    scores: np.ndarray
    problems: list[Problem] = field(default_factory=list)
    #: why no usable `{"scores": ...}` object was found (then `scores` is all NaN), else None
    malformed: str | None = None
    clamped: int = 0


def find_json_object(text: str) -> dict | None:
    """The first JSON object in `text` that has a "scores" key (else the first object), or None."""
    text = _THINK.sub("", text).strip()
    first: dict | None = None
    for start in [m.start() for m in re.finditer(r"\{", text)]:
        try:
            value, _ = _DECODER.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            if "scores" in value:
                return value
            if first is None:
                first = value
    return first


def parse_score_answer(text: str, num_criteria: int, trajectory: int | None = None) -> ParsedScores:
    """Per-trajectory answer {"scores": [s_1, ..., s_K]} → scores [K]."""
    _check_count(num_criteria, "num_criteria")
    scores = np.full(num_criteria, np.nan)
    raw, why = _scores_value(text)
    if why is not None:
        return ParsedScores(scores, [Problem(trajectory, None, MALFORMED_JSON, why)], malformed=why)
    result = ParsedScores(scores)
    if not _is_row(raw):
        why = f'"scores" is {type(raw).__name__}, expected a list of {num_criteria} numbers'
        result.malformed = why
        result.problems.append(Problem(trajectory, None, MALFORMED_JSON, why))
        return result
    _fill_row(raw, scores, trajectory, result)
    return result


def parse_group_answer(text: str, num_trajectories: int, num_criteria: int) -> ParsedScores:
    """Per-group answer {"scores": [[...K...], ... N lists]} → scores [N, K]."""
    _check_count(num_trajectories, "num_trajectories")
    _check_count(num_criteria, "num_criteria")
    scores = np.full((num_trajectories, num_criteria), np.nan)
    raw, why = _scores_value(text)
    if why is None and not (isinstance(raw, list) or _is_numbered_dict(raw)):
        why = f'"scores" is {type(raw).__name__}, expected a list of {num_trajectories} lists'
    if why is not None:
        return ParsedScores(scores, [Problem(None, None, MALFORMED_JSON, why)], malformed=why)
    result = ParsedScores(scores)
    rows, extra = _positions(raw, num_trajectories)
    if extra:
        result.problems.append(Problem(None, None, EXTRA_SCORE,
                                       f"{extra} lists beyond the {num_trajectories} attempts ignored"))
    for i, row in enumerate(rows):
        if row is _ABSENT:
            result.problems.append(Problem(i, None, MISSING_SCORE, "no score list for this attempt"))
        elif not _is_row(row):
            result.problems.append(Problem(i, None, UNPARSABLE_SCORE, f"score list is {row!r:.60}"))
        else:
            _fill_row(row, scores[i], i, result)
    return result


def yes_probability(top_logprobs: Sequence[tuple[str, float]]) -> tuple[float, str | None]:
    """P(yes) / (P(yes) + P(no)) from the first answer token's (token, logprob) candidates.

    A token counts as yes (no) when, stripped and lowercased, it reads "yes" ("no"). Returns
    (score, None), or (NaN, reason) when neither appears among the candidates.
    """
    p_yes = p_no = 0.0
    seen: set[str] = set()
    for token, logprob in top_logprobs:
        if token in seen or logprob is None or not math.isfinite(logprob):
            continue
        seen.add(token)
        word = token.strip().lower()
        if word == "yes":
            p_yes += math.exp(logprob)
        elif word == "no":
            p_no += math.exp(logprob)
    total = p_yes + p_no
    if total <= 0.0:
        shown = ", ".join(repr(t) for t, _ in list(top_logprobs)[:5])
        return math.nan, f"{NO_YES_NO_TOKEN}: neither yes nor no among the top tokens ({shown})"
    return p_yes / total, None


# -- helpers --------------------------------------------------------------------------------------
class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


def _check_count(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r}: expected a positive int")


def _scores_value(text: Any) -> tuple[Any, str | None]:
    if not isinstance(text, str) or not text.strip():
        return None, "empty answer"
    obj = find_json_object(text)
    if obj is None:
        return None, "no JSON object found"
    if "scores" not in obj:
        return None, f'JSON object without a "scores" key (keys: {sorted(obj)[:5]})'
    return obj["scores"], None


def _is_numbered_dict(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(str(k).strip().isdigit() for k in value)


def _is_row(value: Any) -> bool:
    return isinstance(value, list) or _is_numbered_dict(value)


def _positions(value: list | dict, length: int) -> tuple[list[Any], int]:
    """The entries for positions 0..length-1 (a list, or a dict keyed "1".."length"), and how many
    entries lie beyond."""
    if isinstance(value, list):
        entries = list(value[:length]) + [_ABSENT] * max(0, length - len(value))
        return entries, max(0, len(value) - length)
    entries = [_ABSENT] * length
    extra = 0
    for key, item in value.items():
        position = int(str(key).strip()) - 1
        if 0 <= position < length:
            entries[position] = item
        else:
            extra += 1
    return entries, extra


def _fill_row(raw: list | dict, out: np.ndarray, trajectory: int | None, result: ParsedScores) -> None:
    entries, extra = _positions(raw, len(out))
    if extra:
        result.problems.append(Problem(trajectory, None, EXTRA_SCORE,
                                       f"{extra} scores beyond the {len(out)} criteria ignored"))
    for k, entry in enumerate(entries):
        if entry is _ABSENT or entry is None:
            result.problems.append(Problem(trajectory, k, MISSING_SCORE, "no score for this criterion"))
            continue
        value = _as_number(entry)
        if value is None:
            result.problems.append(Problem(trajectory, k, UNPARSABLE_SCORE, f"score {entry!r:.60}"))
            continue
        if value < 0.0 or value > 1.0:
            result.clamped += 1
            value = min(1.0, max(0.0, value))
        out[k] = value


def _as_number(entry: Any) -> float | None:
    """A finite float from a JSON number or numeric string; booleans and the rest are unparsable."""
    if isinstance(entry, bool):
        return None
    if not isinstance(entry, (int, float, str)):
        return None
    try:
        value = float(entry.strip() if isinstance(entry, str) else entry)
    except (ValueError, OverflowError):  # "high", or an int too large for a float
        return None
    return value if math.isfinite(value) else None
