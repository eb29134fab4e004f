"""Reading a run directory's records: JSONL files (steps.jsonl, groups.jsonl, eval.jsonl,
summary.jsonl) one record at a time, a run's label and env from its config.yaml, and the groups
worth showing in a report. It only reads; it never changes what the trainer wrote."""

from __future__ import annotations

import heapq
import json
import os
from pathlib import Path

import yaml


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a JSONL file ([] when it does not exist yet)."""
    return list(iter_jsonl(path))


def iter_jsonl(path: str | Path):
    """Records one at a time; a line that is not JSON is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        return
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON object ({error.msg})") from error


def run_info(run_dir: str | Path) -> tuple[str, str]:
    """(label, env) of a run from its config.yaml: "ORSD"/"GRPO"/the method's name, and env.name."""
    run_dir = _existing_dir(run_dir, "run_dir")
    path = run_dir / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.exists() else None
    config = config if isinstance(config, dict) else {}
    mode = (config.get("method") or {}).get("name") or (config.get("rubric") or {}).get("mode")  # old runs
    env = (config.get("env") or {}).get("name") or ""
    label = {"orsd": "ORSD", "grpo": "GRPO"}.get(mode, mode or run_dir.name)
    return str(label), str(env)


def _existing_dir(path, name: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path to a run directory, got {type(path).__name__}")
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{name}: {str(path)!r} is not a directory (expected a run directory with steps.jsonl)")
    return path


def pick_groups(path: str | Path, limit: int = 5) -> list[dict]:
    """Up to `limit` groups, those with a selected bundle first, latest steps first; streams the file
    so a long run's groups.jsonl is never held in memory."""
    best: list[tuple] = []  # min-heap on the preference key: the worst kept group is popped first
    for number, group in enumerate(iter_jsonl(path)):
        key = (group.get("selected") is not None, group.get("step") or 0, -(group.get("group") or 0), -number)
        if len(best) < limit:
            heapq.heappush(best, (key, number, group))
        elif key > best[0][0]:
            heapq.heapreplace(best, (key, number, group))
    return [group for _, _, group in sorted(best, key=lambda item: item[0], reverse=True)]
