"""The study's grid: arms × seeds as orsd-train runs under OUT/<arm>/seed<S>/, the shared initial
policy under OUT/initial/, what state each run is in (to skip, resume or start it), and the
command that runs it."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

#: an arm's label names a directory: orsd-train's own rule for train.run_name
LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
#: a dot-path override as orsd-train takes it: section.key=value
OVERRIDE = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]\w*=")
#: OUT/initial holds the shared initial policy, so no arm may be called that
INITIAL = "initial"
#: keys the runner sets itself (per run) or that would give arms different initial policies
RESERVED = ("train.seed", "train.run_name", "model.path", "warm_start.")


class StudyError(ValueError):
    """A study cannot run as asked; the message (one line) names the argument and the expected form."""


@dataclass(frozen=True)
class Arm:
    label: str
    overrides: tuple[str, ...]


def split_overrides(text: str) -> list[str]:
    """`a.b=1,c.d=[x, y]` -> ["a.b=1", "c.d=[x, y]"]: commas separate overrides except inside
    brackets, braces or quotes, so a YAML list or mapping value keeps its commas."""
    parts, current, depth, quote = [], [], 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return parts


def parse_arm(text: str) -> Arm:
    """`NAME` (a method: method.name=NAME) or `LABEL=section.key=value,section.key=value,...`."""
    form = "expected METHOD or LABEL=section.key=value[,section.key=value...]"
    label, sep, rest = text.partition("=")
    if not LABEL.fullmatch(label):
        raise StudyError(f"--arms {text!r}: the label {label!r} is not a directory name "
                         f"(letters, digits, . _ -, not starting with . or -); {form}")
    if label == INITIAL:
        raise StudyError(f"--arms {text!r}: {INITIAL!r} is reserved for the shared initial policy (OUT/{INITIAL}); "
                         f"pick another label")
    if not sep:
        return Arm(label, (f"method.name={label}",))
    overrides = split_overrides(rest)
    for item in overrides:
        if not OVERRIDE.match(item):
            raise StudyError(f"--arms {text!r}: {item!r} is not section.key=value; {form} "
                             f"(a value with commas must be a bracketed list or quoted)")
        if reserved(item):
            raise StudyError(f"--arms {text!r}: {item.split('=')[0]} is set by orsd-study for every run "
                             f"(seeds, run names and the shared initial policy); set model.* or warm_start.* "
                             f"for all arms with --set")
    return Arm(label, tuple(overrides))


def reserved(override: str) -> bool:
    key = override.split("=", 1)[0]
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESERVED)


def parse_arms(texts: list[str]) -> list[Arm]:
    arms = [parse_arm(text) for text in texts]
    labels = [arm.label for arm in arms]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise StudyError(f"--arms: the label(s) {', '.join(repeated)} appear more than once; each arm needs "
                         f"its own directory (LABEL=...)")
    return arms


def parse_overrides(values: list[str], flag: str = "--set") -> list[str]:
    for item in values:
        if not OVERRIDE.match(item):
            raise StudyError(f"{flag} {item!r}: expected section.key=value (as orsd-train takes it)")
        key = item.split("=", 1)[0]
        if key in ("train.seed", "train.run_name"):
            raise StudyError(f"{flag} {item!r}: {key} is set by orsd-study for every run (--seeds, OUT/<arm>/seed<S>)")
    return list(values)


def parse_seeds(values: list[str]) -> list[int]:
    seeds = []
    for value in values:
        if not re.fullmatch(r"\d+", value):
            raise StudyError(f"--seeds {value!r}: expected non-negative integers, e.g. --seeds 0 1 2")
        seeds.append(int(value))
    if len(set(seeds)) != len(seeds):
        raise StudyError(f"--seeds {' '.join(values)}: a seed is repeated; each seed is one run per arm")
    return seeds


@dataclass
class Run:
    """One run of the grid; `steps` and `eval_every` are its resolved train.steps and train.eval_every."""

    arm: Arm
    seed: int
    path: Path
    steps: int
    eval_every: int
    overrides: list[str] = field(default_factory=list)  # everything after --config, run-specific keys included

    @property
    def name(self) -> str:
        return f"{self.arm.label}/seed{self.seed}"

    @property
    def run_name(self) -> str:
        return f"{self.arm.label}-seed{self.seed}"


def run_path(out: Path, label: str, seed: int) -> Path:
    return Path(out) / label / f"seed{seed}"


def steps_done(path: Path) -> int:
    """The last step in steps.jsonl (0 when none): a resumed run truncates what its checkpoint lacks,
    so steps are never counted twice."""
    last = 0
    steps = Path(path) / "steps.jsonl"
    for line in steps.read_text().splitlines() if steps.is_file() else []:
        try:
            last = max(last, int(json.loads(line).get("step") or 0))
        except (ValueError, AttributeError):
            continue  # a line being written right now
    return last


def has_eval(path: Path, step: int) -> bool:
    evals = Path(path) / "eval.jsonl"
    for line in evals.read_text().splitlines() if evals.is_file() else []:
        try:
            if json.loads(line).get("step") == step:
                return True
        except (ValueError, AttributeError):
            continue
    return False


def has_checkpoint(path: Path) -> bool:
    return any(Path(path).glob("checkpoints/step_*/trainer_state.pt"))


def state(run: Run) -> str:
    """finished (all train.steps recorded, and the evaluation at the last step when train.eval_every
    lands on it) | resume (a checkpoint to continue from) | restart (records but no checkpoint: orsd-train
    cannot continue it) | new."""
    final_eval = run.eval_every and run.steps % run.eval_every == 0
    if steps_done(run.path) >= run.steps and (not final_eval or has_eval(run.path, run.steps)):
        return "finished"
    if (run.path / "config.yaml").is_file() and has_checkpoint(run.path):
        return "resume"
    if (run.path / "config.yaml").is_file() or (run.path / "steps.jsonl").is_file():
        return "restart"
    return "new"


def train_command(launcher: list[str], config: str | None, overrides: list[str], run_dir: Path,
                  resume: bool = False) -> list[str]:
    """orsd-train as a child: `launcher -m orsd.train.cli ...` (python, or torchrun/deepspeed for a
    multi-GPU run, which take `-m module` too)."""
    return [*launcher, "-m", "orsd.train.cli", *(["--config", config] if config else []), *overrides,
            "--run-dir", str(run_dir), *(["--resume"] if resume else [])]


def launcher_argv(launcher: str | None) -> list[str]:
    if not launcher:
        return [sys.executable]
    argv = shlex.split(launcher)
    if not argv:
        raise StudyError("--launcher '': expected a command such as 'torchrun --nproc_per_node 4'")
    return argv


def cpu_cores() -> int:
    """Cores this process may use: its affinity, capped by a cgroup CPU quota (orsd.train.cpu_quota)."""
    from orsd.train.cpu_quota import cpu_quota, threads_for

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    return min(cores, threads_for(quota)) if quota is not None else cores


def saved_threads(path: Path) -> int | None:
    """model.threads of a run's own config.yaml: a resumed run keeps its thread count, since f32 sums
    round differently on another (and orsd-train refuses to resume with another)."""
    import yaml

    saved = Path(path) / "config.yaml"
    if not saved.is_file():
        return None
    config = yaml.safe_load(saved.read_text()) or {}
    threads = (config.get("model") or {}).get("threads")
    return int(threads) if isinstance(threads, int) else None


def directory_sha256(path: Path) -> str:
    """sha256 over the files of a policy directory (relative names and contents, in name order), so
    study.json pins the exact initial weights."""
    import hashlib

    digest = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
