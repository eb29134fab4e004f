"""Plain-text transcripts of one trajectory: what the agent saw and what it did, nothing else.

Rewards, success flags and scores are never part of a transcript (paper §3.2: bundles are written
from the trajectories alone); the signature cannot even take them.
"""

from __future__ import annotations

from collections.abc import Sequence

#: default character budget of one transcript; small local verifiers (135M on a CPU) have short
#: contexts and every prompt carries the transcript, so long episodes are cut in the middle
DEFAULT_MAX_TRANSCRIPT_CHARS = 3000
#: the smallest budget that still leaves room for the cut marker and some text on both sides
MIN_TRANSCRIPT_CHARS = 120
#: what an invalid action (None) looks like in a transcript
INVALID_ACTION_TEXT = "(invalid action: no well-formed command)"
#: share of the budget given to the start; the rest goes to the end, where the episode's outcome
#: and the agent's last moves are (our choice)
HEAD_SHARE = 0.4


def format_transcript(
    observations: Sequence[str],
    actions: Sequence[str | None],
    max_chars: int | None = DEFAULT_MAX_TRANSCRIPT_CHARS,
) -> str:
    """obs_0, then one "Action t" / "Observation t" pair per step; None is an invalid action.

    `observations` has one entry more than `actions` (the observation after every action), or the
    same number when the episode stopped without a last observation. Over `max_chars` the middle is
    cut and marked, keeping the start and the end (None: no budget).
    """
    if isinstance(observations, str) or not isinstance(observations, Sequence):
        raise TypeError(f"observations={observations!r}: expected a list of strings")
    if isinstance(actions, str) or not isinstance(actions, Sequence):
        raise TypeError(f"actions={actions!r}: expected a list of strings or None")
    if len(observations) not in (len(actions), len(actions) + 1) or not observations:
        raise ValueError(
            f"len(observations)={len(observations)}, len(actions)={len(actions)}: expected "
            "observations = [obs_0, obs_1, ...] with one more entry than actions (or as many)")
    for t, obs in enumerate(observations):
        if not isinstance(obs, str):
            raise TypeError(f"observations[{t}]={obs!r}: expected a string")
    for t, act in enumerate(actions):
        if act is not None and not isinstance(act, str):
            raise TypeError(f"actions[{t}]={act!r}: expected a string or None (invalid action)")
    if max_chars is not None and (not isinstance(max_chars, int) or max_chars < MIN_TRANSCRIPT_CHARS):
        raise ValueError(f"max_chars={max_chars!r}: expected None or an int >= {MIN_TRANSCRIPT_CHARS}")

    lines = [f"Observation 0: {observations[0].strip()}"]
    for t, action in enumerate(actions, start=1):
        shown = INVALID_ACTION_TEXT if action is None else action.strip() or INVALID_ACTION_TEXT
        lines.append(f"Action {t}: {shown}")
        if t < len(observations):
            lines.append(f"Observation {t}: {observations[t].strip()}")
    text = "\n".join(lines)
    return text if max_chars is None else truncate_middle(text, max_chars)


def truncate_middle(text: str, max_chars: int) -> str:
    """`text` if it fits in `max_chars`, else its start and end around a marked cut (same budget)."""
    if len(text) <= max_chars:
        return text
    # the marker's digits depend on how much is cut; size it for the worst case first
    marker_room = len(_marker(len(text)))
    room = max_chars - marker_room
    head = int(room * HEAD_SHARE)
    tail = room - head
    head_text = _snap_end(text[:head])
    tail_text = _snap_start(text[len(text) - tail:])
    omitted = len(text) - len(head_text) - len(tail_text)
    return head_text + _marker(omitted) + tail_text


def _marker(omitted: int) -> str:
    return f"\n[... {omitted} characters omitted ...]\n"


def _snap_end(head: str) -> str:
    """Cut the head at its last line break when that keeps most of it (cleaner to read)."""
    cut = head.rfind("\n")
    return head[:cut] if cut >= len(head) // 2 else head


def _snap_start(tail: str) -> str:
    cut = tail.find("\n")
    return tail[cut + 1:] if 0 <= cut <= len(tail) // 2 else tail
