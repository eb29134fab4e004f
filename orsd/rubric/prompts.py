"""The prompts of the rubric machinery, rendered from plain-text templates users can read and override.

Templates live in `orsd/rubric/templates/*.txt`. A placeholder is a lowercase name in braces
(`{task}`); every other brace is literal text, so JSON examples need no escaping. Values are
substituted in one pass (a transcript containing "{task}" stays as it is), and trailing
whitespace of a rendered template is dropped. Every prompt is a single user message.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from orsd.rubric.bundle import MAX_CRITERIA, MIN_CRITERIA, RubricBundle

TEMPLATE_DIR = Path(__file__).parent / "templates"

#: the placeholders each template may use, and (second set) those it must use
PLACEHOLDERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "generation": (frozenset({"task", "transcripts", "num_trajectories", "min_criteria",
                              "max_criteria"}), frozenset({"task", "transcripts"})),
    "verification_trajectory": (frozenset({"task", "transcript", "criteria", "num_criteria"}),
                                frozenset({"transcript", "criteria"})),
    "verification_group": (frozenset({"task", "transcripts", "criteria", "num_criteria",
                                      "num_trajectories"}), frozenset({"transcripts", "criteria"})),
    "yes_no": (frozenset({"task", "transcript", "criterion"}), frozenset({"transcript", "criterion"})),
    "rubric_context": (frozenset({"criteria", "num_criteria"}), frozenset({"criteria"})),
    "reask": (frozenset({"problem", "schema", "num_criteria"}), frozenset()),
}
MODES = ("per_trajectory", "per_group")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

TemplateLike = str | os.PathLike | None


def load_template(template: TemplateLike, name: str) -> str:
    """The text of template `name`: the built-in file (None), a file (a path, or a one-line string
    naming an existing file), or the template text itself (any other string)."""
    if name not in PLACEHOLDERS:
        raise ValueError(f"name={name!r}: expected one of {sorted(PLACEHOLDERS)}")
    if template is None:
        return _builtin(name)
    elif isinstance(template, os.PathLike):
        text = Path(template).read_text(encoding="utf-8")
        origin = f"file {os.fspath(template)!r}"
    elif isinstance(template, str):
        if "\n" not in template and "{" not in template and Path(template).is_file():
            text = Path(template).read_text(encoding="utf-8")
            origin = f"file {template!r}"
        else:
            text, origin = template, "string (not an existing file)"
    else:
        raise TypeError(f"template={template!r}: expected None, a path or the template text")
    used = set(_PLACEHOLDER.findall(text))
    allowed, required = PLACEHOLDERS[name]
    missing = sorted(required - used)
    if missing:
        raise ValueError(f"{name} template ({origin}) lacks placeholder(s) "
                         f"{', '.join('{' + m + '}' for m in missing)}; it may use {sorted(allowed)}")
    return text


@functools.lru_cache(maxsize=None)
def _builtin(name: str) -> str:
    return (TEMPLATE_DIR / f"{name}.txt").read_text(encoding="utf-8")


def render(text: str, name: str, **values: Any) -> str:
    """Substitute the known placeholders of template `name` in one pass; other braces stay."""
    allowed = PLACEHOLDERS[name][0]

    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        return str(values[key]) if key in allowed and key in values else match.group(0)

    return _PLACEHOLDER.sub(substitute, text).rstrip()


@dataclass(frozen=True)
class PromptTemplates:
    """One override per template (None = built-in); maps one-to-one onto a config section."""

    generation: TemplateLike = None
    verification_trajectory: TemplateLike = None
    verification_group: TemplateLike = None
    yes_no: TemplateLike = None
    rubric_context: TemplateLike = None
    reask: TemplateLike = None

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> "PromptTemplates":
        names = {f.name for f in fields(cls)}
        section = dict(section or {})
        unknown = sorted(set(section) - names)
        if unknown:
            raise ValueError(f"prompt templates {unknown}: unknown; expected keys among {sorted(names)}")
        templates = cls(**section)
        for name in names:  # fail at load time, not in the middle of a run
            load_template(getattr(templates, name), name)
        return templates


def label_transcripts(transcripts: Sequence[str]) -> str:
    """The transcripts as "Attempt 1:", "Attempt 2:", ... blocks in the order given."""
    return "\n\n".join(f"Attempt {i + 1}:\n{text}" for i, text in enumerate(transcripts))


def generation_messages(task: str, transcripts: Sequence[str], template: TemplateLike = None) -> list[dict]:
    """Ask the policy for one bundle of 5–8 observable process criteria (paper §3.2, App. B).

    Takes the task and the transcripts of all N trajectories of the group, in rollout order; it has
    no parameter for rewards, so neither rewards nor success can enter this prompt.
    """
    _check_task(task)
    _check_transcripts(transcripts, "transcripts")
    text = render(load_template(template, "generation"), "generation", task=task.strip(),
                  transcripts=label_transcripts(transcripts), num_trajectories=len(transcripts),
                  min_criteria=MIN_CRITERIA, max_criteria=MAX_CRITERIA)
    return [{"role": "user", "content": text}]


def verification_messages(task: str, transcripts: str | Sequence[str], bundle: RubricBundle,
                          mode: str = "per_trajectory", template: TemplateLike = None) -> list[dict]:
    """Ask the verifier to score every criterion of `bundle` in [0, 1], JSON only.

    per_trajectory: `transcripts` is one transcript, answer {"scores": [s_1, ..., s_K]};
    per_group: a list of N transcripts, answer {"scores": [[...K...], ... N lists]}.
    """
    _check_task(task)
    _check_bundle(bundle)
    if mode == "per_trajectory":
        if not isinstance(transcripts, str):
            raise TypeError(f"transcripts={transcripts!r}: mode 'per_trajectory' takes one transcript string")
        name = "verification_trajectory"
        values = {"transcript": transcripts}
    elif mode == "per_group":
        _check_transcripts(transcripts, "transcripts")
        name = "verification_group"
        values = {"transcripts": label_transcripts(transcripts), "num_trajectories": len(transcripts)}
    else:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    text = render(load_template(template, name), name, task=task.strip(), criteria=bundle.numbered(),
                  num_criteria=len(bundle), **values)
    return [{"role": "user", "content": text}]


def yes_no_messages(task: str, transcript: str, criterion: str, template: TemplateLike = None) -> list[dict]:
    """Ask whether one transcript meets one criterion; the answer's first token is read as yes/no.

    The criterion comes last so the prompts of all criteria of a trajectory share a long prefix
    (the local verifier runs that prefix once and reuses its KV cache).
    """
    _check_task(task)
    if not isinstance(transcript, str):
        raise TypeError(f"transcript={transcript!r}: expected a string")
    if not isinstance(criterion, str) or not criterion.strip():
        raise ValueError(f"criterion={criterion!r}: expected a non-empty string")
    text = render(load_template(template, "yes_no"), "yes_no", task=task.strip(),
                  transcript=transcript, criterion=criterion.strip())
    return [{"role": "user", "content": text}]


def rubric_context(bundle: RubricBundle, template: TemplateLike = None) -> str:
    """The privileged text the trainer splices into the policy's context for paired replay (§3.3)."""
    _check_bundle(bundle)
    return render(load_template(template, "rubric_context"), "rubric_context",
                  criteria=bundle.numbered(), num_criteria=len(bundle))


def answer_schema_text(mode: str, num_criteria: int) -> str:
    """The answer's shape as shown to the verifier when it is asked again."""
    row = "[" + ", ".join(f"s{k + 1}" for k in range(num_criteria)) + "]"
    if mode == "per_trajectory":
        return '{"scores": ' + row + "}"
    if mode == "per_group":
        return '{"scores": [' + row + ", " + row + ", ...]} (one list per attempt)"
    raise ValueError(f"mode={mode!r}: expected one of {MODES}")


def answer_json_schema(mode: str, num_criteria: int, num_trajectories: int = 1) -> dict:
    """The verifier answer as a JSON Schema (docs/rubrics.md; `response_format="json_schema"`)."""
    row = {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1},
           "minItems": num_criteria, "maxItems": num_criteria}
    if mode == "per_trajectory":
        scores = row
    elif mode == "per_group":
        scores = {"type": "array", "items": row, "minItems": num_trajectories, "maxItems": num_trajectories}
    else:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    return {"type": "object", "properties": {"scores": scores}, "required": ["scores"],
            "additionalProperties": False}


def reask_messages(messages: list[dict], answer: str, problem: str, mode: str, num_criteria: int,
                   template: TemplateLike = None) -> list[dict]:
    """The conversation for the one corrective re-ask after a malformed answer."""
    text = render(load_template(template, "reask"), "reask", problem=problem,
                  schema=answer_schema_text(mode, num_criteria), num_criteria=num_criteria)
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": text}]


def _check_task(task: Any) -> None:
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task={task!r}: expected the task description as a non-empty string")


def _check_transcripts(transcripts: Any, name: str) -> None:
    if isinstance(transcripts, str) or not isinstance(transcripts, Sequence) or not transcripts:
        raise TypeError(f"{name}={transcripts!r}: expected a non-empty list of transcript strings")
    for i, text in enumerate(transcripts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}]={text!r}: expected a transcript string (format_transcript)")


def _check_bundle(bundle: Any) -> None:
    if not isinstance(bundle, RubricBundle):
        raise TypeError(f"bundle={bundle!r}: expected a RubricBundle")
