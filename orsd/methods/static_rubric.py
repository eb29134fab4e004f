"""A user-written rubric spliced exactly where ORSD splices B* (the "human rubric" ablation).

`method.rubric_file` (YAML or JSON) holds either a list of criteria, used for every task, or a
mapping task id -> list of criteria. The rubric goes through the same path as a selected bundle:
it is the group's one candidate, selected as a single bundle, rendered by the rubric context
template and spliced at the record's rubric slot; A = A_GRPO + α·e·Δ with α = rubric.alpha
(paper Eq. 8–9). The policy writes no bundle and no verifier is called. A task the file has no
rubric for gets e = 0, and its groups.jsonl record says why.

Because the rubric needs no model to write it, this also runs the rubric-conditioned replay with
any model, random weights included (configs/gpu_smoke_qwen3_1p7b.yaml uses it for that).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from orsd.rubric import RubricBundle

from .base import BundleRequest, Candidates, Method


class RubricFileError(ValueError):
    """method.rubric_file is missing, unreadable or not of the documented shape."""


def load_rubric_file(path: str | Path) -> RubricBundle | dict[str, RubricBundle]:
    """One bundle (a list of criteria in the file) or {task id: bundle} (a mapping); any other
    shape is an error naming the file and the offending entry."""
    path = Path(path)
    if not path.is_file():
        raise RubricFileError(f"method.rubric_file={str(path)!r}: no such file (expected a YAML/JSON list of "
                              f"criteria, or a mapping task id -> list of criteria)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))  # JSON is YAML too
    except yaml.YAMLError as error:
        raise RubricFileError(f"{path}: not valid YAML/JSON ({error})") from None
    if isinstance(data, list):
        return _bundle(data, f"{path}")
    if isinstance(data, dict) and data:
        return {str(task): _bundle(criteria, f"{path}: task {task!r}") for task, criteria in data.items()}
    raise RubricFileError(f"{path}: expected a non-empty list of criteria, or a mapping task id -> list of "
                          f"criteria; got {type(data).__name__} {data!r:.80}")


def _bundle(criteria, where: str) -> RubricBundle:
    if not isinstance(criteria, list) or not criteria:
        raise RubricFileError(f"{where}: expected a non-empty list of criteria, got {criteria!r:.80}")
    for index, text in enumerate(criteria):
        if not isinstance(text, str) or not text.strip():
            raise RubricFileError(f"{where}: criterion {index + 1} is {text!r}: expected a non-empty string")
    criteria = [text.strip() for text in criteria]
    return RubricBundle(criteria, raw_text="\n".join(f"{i + 1}. {c}" for i, c in enumerate(criteria)),
                        source="manual")


class StaticRubric(Method):
    name = "static_rubric"
    # the file's rubric is each group's one candidate, "selected" as the single-bundle ablation
    # selects its bundle: the records, metrics and Δ examples then read exactly as for B*
    num_bundles = 1
    selection = "single"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.alpha = config.rubric.alpha
        self.path = config.method.rubric_file
        if not self.path:
            raise RubricFileError("method.name=static_rubric needs method.rubric_file: a YAML/JSON list of "
                                  "criteria, or a mapping task id -> list of criteria")
        self.rubrics = load_rubric_file(self.path)

    def bundle_request(self, groups: Sequence) -> BundleRequest | None:
        return None  # nothing is generated: the file holds every group's one candidate

    def candidates(self, groups: Sequence, request: BundleRequest | None, written: list) -> list[Candidates]:
        """The file's rubric for each group's task."""
        out = []
        for group in groups:
            bundle = self.rubrics if isinstance(self.rubrics, RubricBundle) else self.rubrics.get(group.task.id)
            out.append(Candidates([bundle], [bundle.raw_text]) if bundle is not None else
                       Candidates(reason=f"no rubric for task {group.task.id!r} in {self.path}: e = 0"))
        return out
