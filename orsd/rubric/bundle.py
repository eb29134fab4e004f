"""Rubric bundles: a policy-written list of 5–8 process criteria (paper §3.2) and its parser.

The policy's free text is turned into a bundle by `RubricBundle.parse`; anything that is not a
numbered or bulleted list item is ignored, so stray prose, headings and code fences do no harm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: a bundle needs at least this many valid criteria, or it is discarded (paper §3.2: 5–8)
MIN_CRITERIA = 5
#: a bundle keeps at most this many criteria (the first ones, in the policy's order)
MAX_CRITERIA = 8
#: a criterion must have at least this many words (drops "1. ..." placeholders and headings)
MIN_CRITERION_WORDS = 3
#: a longer criterion is cut here (a run-on paragraph is not an observable criterion)
MAX_CRITERION_CHARS = 400

# A list item: "1.", "1)", "(1)", "Criterion 1:", "-", "*", "•", "+", with optional markdown bold
# around the marker ("**1.**"). Group "body" is the criterion text.
_ITEM = re.compile(
    r"""^\s{0,6}
        (?:\*\*|__)?
        (?: \(?\d{1,2}[.):]  |  [-*•+]  |  (?:criterion|rule|item)\s*\d{1,2}\s*[.):-]  )
        (?:\*\*|__)?
        \s+(?P<body>\S.*)$""",
    re.IGNORECASE | re.VERBOSE,
)
_FENCE = re.compile(r"^\s*(```|~~~)")
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_LABEL = re.compile(r"^(?:criterion|rule|item)\s*\d{1,2}\s*[.):-]\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Criterion:
    """One criterion of a bundle; `index` is 0-based (the prompts show `index + 1`)."""

    index: int
    text: str


@dataclass
class RubricBundle:
    """A bundle of process criteria (paper §3.2): what the verifier scores and the policy reads.

    `raw_text` is what the policy wrote (kept for groups.jsonl); `source` says where the bundle came
    from ("policy", "offline", "manual", ...).
    """

    criteria: list[str]
    raw_text: str = ""
    source: str = "policy"
    #: how many valid criteria the text had before the cut at MAX_CRITERIA (0 when built by hand)
    num_found: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.criteria, list) or not self.criteria:
            raise ValueError(f"criteria={self.criteria!r}: expected a non-empty list of strings")
        for i, text in enumerate(self.criteria):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"criteria[{i}]={text!r}: expected a non-empty string")
        if not isinstance(self.raw_text, str):
            raise TypeError(f"raw_text={self.raw_text!r}: expected a string")
        if not isinstance(self.source, str):
            raise TypeError(f"source={self.source!r}: expected a string")

    @property
    def items(self) -> list[Criterion]:
        return [Criterion(i, text) for i, text in enumerate(self.criteria)]

    def __len__(self) -> int:
        return len(self.criteria)

    def numbered(self) -> str:
        """The criteria as the prompts show them: "1. ...", one per line."""
        return "\n".join(f"{i + 1}. {text}" for i, text in enumerate(self.criteria))

    def to_dict(self) -> dict[str, Any]:
        return {"criteria": list(self.criteria), "raw_text": self.raw_text, "source": self.source,
                "num_found": self.num_found}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RubricBundle":
        if not isinstance(data, dict) or "criteria" not in data:
            raise ValueError(f"data={data!r}: expected a dict with a 'criteria' list")
        return cls(criteria=list(data["criteria"]), raw_text=data.get("raw_text", ""),
                   source=data.get("source", "policy"), num_found=int(data.get("num_found", 0)))

    @classmethod
    def parse(cls, text: str, source: str = "policy") -> "RubricBundle | None":
        """The bundle in `text`, or None when it has fewer than MIN_CRITERIA valid criteria."""
        return cls.parse_with_reason(text, source=source)[0]

    @classmethod
    def parse_with_reason(cls, text: str, source: str = "policy") -> tuple["RubricBundle | None", str]:
        """(bundle or None, reason): reason is "ok", "truncated: kept 8 of 11" or why it was discarded."""
        if not isinstance(text, str):
            raise TypeError(f"text={text!r}: expected the policy's generated string")
        criteria = extract_criteria(text)
        if len(criteria) < MIN_CRITERIA:
            if not criteria:
                return None, "no_criteria: no numbered or bulleted list items found"
            return None, (f"too_few_criteria: found {len(criteria)} valid criteria, "
                          f"need at least {MIN_CRITERIA}")
        bundle = cls(criteria=criteria[:MAX_CRITERIA], raw_text=text, source=source,
                     num_found=len(criteria))
        if len(criteria) > MAX_CRITERIA:
            return bundle, f"truncated: kept {MAX_CRITERIA} of {len(criteria)} criteria"
        return bundle, "ok"


def extract_criteria(text: str) -> list[str]:
    """All valid, deduplicated list items of `text`, in order (no count limits applied).

    An item is a numbered or bulleted line; an indented line right after it continues it. `<think>`
    blocks (drafts) and code-fence lines are dropped; everything else that is not an item is prose.
    """
    text = _THINK.sub("", text)
    items: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if _FENCE.match(line):
            current = None
            continue
        match = _ITEM.match(line)
        if match:
            current = [match.group("body")]
            items.append(current)  # type: ignore[arg-type]
        elif current is not None and line[:1].isspace() and line.strip():
            current.append(line.strip())
        else:
            current = None
    criteria: list[str] = []
    seen: set[str] = set()
    for parts in items:
        criterion = _clean(" ".join(parts))
        if criterion is None:
            continue
        key = _normalise(criterion)
        if key in seen:
            continue
        seen.add(key)
        criteria.append(criterion)
    return criteria


def _clean(text: str) -> str | None:
    """The criterion text without markdown and labels, or None when it is not a valid criterion."""
    text = re.sub(r"\s+", " ", text).strip()
    text = _LABEL.sub("", text)
    text = text.replace("**", "").replace("__", "").replace("`", "").strip()
    # a heading item such as "Exploration:" introduces sub-items; it is not a criterion itself
    if text.endswith(":"):
        return None
    if len(text.split()) < MIN_CRITERION_WORDS:
        return None
    if len(text) > MAX_CRITERION_CHARS:
        cut = text[:MAX_CRITERION_CHARS]
        text = cut[: cut.rfind(" ")] if " " in cut else cut
    return text


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()
