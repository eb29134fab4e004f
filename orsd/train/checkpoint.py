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
from pathlib import Path

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


def save(trainer, run_dir: Path, keep: int) -> Path:
    """Write checkpoints/step_<k> atomically, then drop all but the newest `keep`. Under DeepSpeed
    every rank calls this (gathering shards, writing its optimizer partition); rank 0 renames."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{trainer.step_index}"
    tmp = root / f"step_{trainer.step_index}.tmp"
    main = trainer.rank == 0
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(trainer)
    trainer.save_policy(tmp)
    kill_point("checkpoint", trainer.step_index)
    if trainer.ds_engine is not None:  # optimizer partitions and scheduler, one file per rank
        trainer.ds_engine.save_checkpoint(str(tmp / "deepspeed"), tag="state")
    if main:
        trainer.tokenizer.save_pretrained(tmp)
        torch.save(trainer_state(trainer), tmp / "trainer_state.pt")
    _barrier(trainer)
    if main:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for _, old in step_dirs(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier(trainer)
    return final


def _barrier(trainer) -> None:
    if trainer.dist is not None:
        trainer.dist.barrier()


def trainer_state(trainer) -> dict:
    plain = trainer.ds_engine is None  # DeepSpeed keeps optimizer and scheduler in its own files
    return {
        "step": trainer.step_index,
        "optimizer": trainer.optimizer.state_dict() if plain and trainer.optimizer is not None else None,
        "scheduler": trainer.scheduler.state_dict() if plain and trainer.scheduler is not None else None,
        "engine": trainer.engine.state_dict() if hasattr(trainer.engine, "state_dict") else None,
        "task_rng": trainer.task_rng.getstate(),
        "method": trainer.method.state_dict(),  # e.g. the offline rubric's bundle per task
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
    }


def restore(trainer, path: Path) -> None:
    """Load optimizer, scheduler, sampler position and step from `path` (the policy weights were
    loaded from the same directory when the trainer was built)."""
    state = torch.load(Path(path) / "trainer_state.pt", weights_only=False)
    trainer.step_index = state["step"]
    if trainer.ds_engine is not None:
        trainer.ds_engine.load_checkpoint(str(Path(path) / "deepspeed"), tag="state", load_module_strict=True,
                                          load_optimizer_states=True, load_lr_scheduler_states=True)
    if state.get("engine") is not None and hasattr(trainer.engine, "load_state_dict"):
        trainer.engine.load_state_dict(state["engine"])
    if state["optimizer"] is not None and trainer.optimizer is not None:
        trainer.optimizer.load_state_dict(state["optimizer"])
    if state["scheduler"] is not None and trainer.scheduler is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.task_rng.setstate(state["task_rng"])
    trainer.method.load_state_dict(state.get("method") or {})
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
