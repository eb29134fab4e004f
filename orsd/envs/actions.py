"""Turning the policy's reply into an environment command.

The policy answers `<think>...</think><action>...</action>` (the verl-agent protocol the paper
uses). `parse_action` returns the command inside the action tags, or None when the reply has no
single well-formed action; the env then records an invalid action and tells the agent nothing
happened.

Exact rules:

- tags are matched case-insensitively and may hold whitespace inside the angle brackets
  (`<action>`, `<ACTION>`, `< action >`, `</ action>` all count);
- the reply must hold exactly one opening and exactly one closing action tag, the opening first;
  zero, two or more of either (including an unclosed `<action>`) gives None;
- the command is the text between them with leading/trailing whitespace removed and every run of
  inner whitespace (newlines included) collapsed to one space; an empty command gives None;
- the case of the command is kept (environments decide whether case matters);
- everything outside the action tags (the `<think>` block, stray text) is ignored: a missing
  `<think>` block does not make the action invalid.
"""

from __future__ import annotations

import re

_OPEN_TAG = re.compile(r"<\s*action\s*>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"<\s*/\s*action\s*>", re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
# The answer format's scaffold (orsd/envs/prompts.py asks for <think>...</think><action>...</action>):
# its four tags spelled as parse_action accepts the action ones (any case, whitespace inside the
# brackets), with the whitespace around them
_SCAFFOLD = re.compile(r"\s*<\s*/?\s*(?:think|action)\s*>\s*", re.IGNORECASE)


def parse_action(text: str) -> str | None:
    """The command inside the reply's single `<action>...</action>`, or None (rules above)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (the policy's reply), got {type(text).__name__}")
    opens = list(_OPEN_TAG.finditer(text))
    closes = list(_CLOSE_TAG.finditer(text))
    if len(opens) != 1 or len(closes) != 1:
        return None
    start, end = opens[0].end(), closes[0].start()
    if end < start:
        return None
    command = _WHITESPACE.sub(" ", text[start:end]).strip()
    return command or None


def scaffold_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each stretch of the reply that the answer format fixes rather than the policy
    chooses: a think or action tag with the whitespace around it (rubric.delta_mask: format keeps
    the rubric's Δ off the tokens that spell them, orsd/train/delta.py)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str (the policy's reply), got {type(text).__name__}")
    return [match.span() for match in _SCAFFOLD.finditer(text)]


def format_answer(action: str, thought: str = "") -> str:
    """The exact reply text `<think>{thought}</think><action>{action}</action>`.

    Raises ValueError when `parse_action` would not give `action` back (so demonstrations built
    with it always parse to the intended command).
    """
    if not isinstance(action, str):
        raise TypeError(f"action must be a str, got {type(action).__name__}")
    if not isinstance(thought, str):
        raise TypeError(f"thought must be a str, got {type(thought).__name__}")
    if _OPEN_TAG.search(thought) or _CLOSE_TAG.search(thought):
        raise ValueError(f"thought must not contain action tags, got {thought!r}")
    answer = f"<think>{thought.strip()}</think><action>{action}</action>"
    if parse_action(answer) != action:
        raise ValueError(
            f"action={action!r} does not survive parse_action: it must be non-empty, without "
            "action tags, without leading/trailing whitespace or repeated inner whitespace"
        )
    return answer
