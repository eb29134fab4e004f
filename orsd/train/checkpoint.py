"""Checkpoints that make a killed run resumable with the same results as an unbroken one.

checkpoints/step_<k>/ holds an HF-loadable policy (model + tokenizer) and `trainer_state.pt`:
optimizer, scheduler, task-sampler position, step, RNG states and the method's state (the
offline rubric's bundles).
Each is written into `step_<k>.tmp` and renamed into place, so a directory named `step_<k>`
is always complete; only the last `keep` are kept. The frozen reference (the policy as RL began)
is saved once as checkpoints/reference/ when it differs from `model.path` (after a warm start).

`kill_point` is a test hook for tests/train/test_kill_resume.py (see there).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / "checkpoints"
    found = []
    for path in root.glob("step_*") if root.exists() else []:
        match = STEP_DIR.match(path.name)
        if match and (path / "trainer_state.pt").exists():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest(run_dir: Path) -> Path | None:
    found = step_dirs(run_dir)
    return found[-1][1] if found else None


def step_of(path: Path) -> int:
    """The step a checkpoint directory holds (step_<k> -> k)."""
    return int(STEP_DIR.match(Path(path).name).group(1))


#: test hook: "<stage>:<step>" makes the process SIGKILL itself on reaching that point of that step
KILL_AT = "ORSD_TEST_KILL_AT"


def kill_point(stage: str, step: int) -> None:
    """TEST HOOK, the one reader of ORSD_TEST_KILL_AT (unset in real runs: a dictionary lookup).
    Stages are the trainer's timed no-grad stages (rollout, bundles, verifier, replay, ... as named
    in steps.jsonl "seconds"), `update`, and `checkpoint` (inside a checkpoint write: weights in
    step_<k>.tmp, the trainer state not yet); steps are numbered as in steps.jsonl and step_<k>.
    SIGKILL, like the OOM killer or a pre-empted node: no handler, finally block or atexit runs."""
    if os.environ.get(KILL_AT) == f"{stage}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class TrainState:
    """What a checkpoint holds beside the weights, as the live objects it saves and restores in place:
    the step, the optimizer and scheduler (None, or kept by DeepSpeed's own files where `ds_engine`
    is set), the rollout engine's state (vLLM's seed position), the task sampler and the method's
    state. `rank` 0 writes; `dist` (or None) holds the ranks together."""

    step: int
    optimizer: Any
    scheduler: Any
    engine: Any
    task_rng: random.Random
    method: Any
    ds_engine: Any = None
    rank: int = 0
    dist: Any = None

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()


def save(state: TrainState, save_policy: Callable[[Path], None], tokenizer, run_dir: Path, keep: int) -> Path:
    """Write checkpoints/step_<k> atomically (`save_policy(dir)` writes the weights), then drop all
    but the newest `keep`. Under DeepSpeed every rank calls this (gathering shards, writing its
    optimizer partition); rank 0 renames."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{state.step}"
    tmp = root / f"step_{state.step}.tmp"
    main = state.rank == 0
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    state.barrier()
    save_policy(tmp)
    kill_point("checkpoint", state.step)
    if state.ds_engine is not None:  # optimizer partitions and scheduler, one file per rank
        state.ds_engine.save_checkpoint(str(tmp / "deepspeed"), tag="state")
    if main:
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state(state), tmp / "trainer_state.pt")
    state.barrier()
    if main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for _, old in step_dirs(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    state.barrier()
    return final


def trainer_state(state: TrainState) -> dict:
    plain = state.ds_engine is None  # DeepSpeed keeps optimizer and scheduler in its own files
    return {
        "step": state.step,
        "optimizer": state.optimizer.state_dict() if plain and state.optimizer is not None else None,
        "scheduler": state.scheduler.state_dict() if plain and state.scheduler is not None else None,
        "engine": state.engine.state_dict() if hasattr(state.engine, "state_dict") else None,
        "task_rng": state.task_rng.getstate(),
        "method": state.method.state_dict(),  # e.g. the offline rubric's bundle per task
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
    }


def restore(state: TrainState, path: Path) -> int:
    """Load optimizer, scheduler, engine, sampler position, the method's state and the RNG states
    from `path` into `state`'s objects, and return the step (the policy weights were loaded from the
    same directory when the run was built)."""
    saved = torch.load(Path(path) / "trainer_state.pt", weights_only=False)
    if state.ds_engine is not None:
        state.ds_engine.load_checkpoint(str(Path(path) / "deepspeed"), tag="state", load_module_strict=True,
                                        load_optimizer_states=True, load_lr_scheduler_states=True)
    if saved.get("engine") is not None and hasattr(state.engine, "load_state_dict"):
        state.engine.load_state_dict(saved["engine"])
    if saved["optimizer"] is not None and state.optimizer is not None:
        state.optimizer.load_state_dict(saved["optimizer"])
    if saved["scheduler"] is not None and state.scheduler is not None:
        state.scheduler.load_state_dict(saved["scheduler"])
    state.task_rng.setstate(saved["task_rng"])
    state.method.load_state_dict(saved.get("method") or {})
    rng = saved["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return saved["step"]
