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
#: how a shortened observation marks its cut (short: it may appear once per observation)
OBSERVATION_CUT = " [...] "


def format_transcript(
    observations: Sequence[str],
    actions: Sequence[str | None],
    max_chars: int | None = DEFAULT_MAX_TRANSCRIPT_CHARS,
    keep_actions: bool = False,
) -> str:
    """obs_0, then one "Action t" / "Observation t" pair per step; None is an invalid action.

    `observations` has one entry more than `actions` (the observation after every action), or the
    same number when the episode stopped without a last observation. Over `max_chars` the middle is
    cut and marked, keeping the start and the end (None: no budget); with `keep_actions` every
    action line stays whole and the observations are shortened instead (`keep_every_action`).
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

    seen = [obs.strip() for obs in observations]
    done = [INVALID_ACTION_TEXT if action is None else action.strip() or INVALID_ACTION_TEXT for action in actions]
    text = _join(seen, done)
    if max_chars is None or len(text) <= max_chars:
        return text
    return keep_every_action(seen, done, max_chars) if keep_actions else truncate_middle(text, max_chars)


def _join(observations: list[str], actions: list[str]) -> str:
    lines = [f"Observation 0: {observations[0]}"]
    for t, action in enumerate(actions, start=1):
        lines.append(f"Action {t}: {action}")
        if t < len(observations):
            lines.append(f"Observation {t}: {observations[t]}")
    return "\n".join(lines)


def keep_every_action(observations: list[str], actions: list[str], max_chars: int) -> str:
    """The transcript within `max_chars` with every action line whole: the characters left after
    the actions and the line labels are shared fairly among the observations (a short one stays
    whole, the long ones get equal shares, each keeping its start and end around a mark). A cut in
    the middle of the whole text can drop the very action a criterion asks about; this window never
    does, unless the actions alone exceed the budget (then the middle is cut as by default)."""
    frame = len(_join([""] * len(observations), actions))
    room = max_chars - frame
    if room < 0:
        return truncate_middle(_join(observations, actions), max_chars)
    shares = fair_shares([len(obs) for obs in observations], room)
    return _join([shorten(obs, share) for obs, share in zip(observations, shares)], actions)


def fair_shares(lengths: list[int], room: int) -> list[int]:
    """A max-min fair split of `room` characters: shortest first, each takes what it needs up to an
    equal share of what is left, so what short ones leave goes to the long ones."""
    shares = [0] * len(lengths)
    left = room
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for rank, i in enumerate(order):
        shares[i] = min(lengths[i], left // (len(order) - rank))
        left -= shares[i]
    return shares


def shorten(text: str, chars: int) -> str:
    """`text` within `chars`: its start and end around OBSERVATION_CUT (just its start when the
    budget is too small for the mark)."""
    if len(text) <= chars:
        return text
    room = chars - len(OBSERVATION_CUT)
    if room < 2:
        return text[:max(chars, 0)]
    head = int(room * HEAD_SHARE)
    return text[:head] + OBSERVATION_CUT + text[len(text) - (room - head):]


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
