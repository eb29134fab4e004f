"""Running the study: the shared initial policy first, then every unfinished run of the grid as an
orsd-train child process, `jobs` at a time on an even share of the cores, under one progress bar
over all steps of all runs (read from the runs' steps.jsonl)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .grid import Run, state, steps_done, train_command
from .plan import Plan, run_overrides, run_threads

#: lines of a failed run's train.log shown in the terminal
LOG_TAIL_LINES = 15


@dataclass
class Outcome:
    run: Run
    status: str  # finished (already, skipped) | done | failed
    returncode: int | None = None
    log_tail: str = ""


class InitialFailed(RuntimeError):
    """The shared initial policy could not be made; no run can start without it."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return "(no train.log)"
    text = path.read_text(encoding="utf-8", errors="replace").replace("\r", "\n")
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


def start(command: list[str], run_dir: Path, threads: int) -> subprocess.Popen:
    """orsd-train in its own process group (an interrupt reaches only the study, which stops its
    children itself), output appended to run_dir/train.log under a header naming the command."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "train.log").open("a", encoding="utf-8")
    log.write(f"== orsd-study {time.strftime('%Y-%m-%d %H:%M:%S')}: {shlex.join(command)}\n")
    log.flush()
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as orsd-train's own entry sets it (train/cli.py), for every child
    if threads:  # OpenMP reads it when torch loads, before model.threads is applied
        env["OMP_NUM_THREADS"] = str(threads)
    try:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    finally:
        log.close()  # the child holds its own descriptor


def stop(processes: list[subprocess.Popen], seconds: float = 30.0) -> None:
    """SIGTERM to each child's process group, then SIGKILL to those still running after `seconds`.
    A stopped run resumes from its last checkpoint on the next invocation."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def make_initial(plan: Plan, log=print, poll_seconds: float = 2.0) -> None:
    """Run the warm start once into OUT/initial (skipped when it is there); a half-made one is removed
    first, since a warm start does not resume."""
    initial = plan.initial
    if initial is None or initial.finished():
        return
    if initial.path.exists():
        shutil.rmtree(initial.path)
    command = train_command(plan.launcher, plan.config, initial.overrides, initial.path)
    log(f"orsd-study: the shared initial policy: warm start ({initial.method}'s) into {initial.path} "
        f"(log: {initial.path / 'train.log'})")
    began = time.monotonic()
    process = start(command, initial.path, run_threads(initial.overrides))
    try:
        while process.poll() is None:
            time.sleep(poll_seconds)
    except BaseException:
        stop([process])
        raise
    if process.returncode != 0 or not initial.finished():
        raise InitialFailed(f"the initial policy's run failed (exit status {process.returncode}); the end of "
                            f"{initial.path / 'train.log'}:\n{log_tail(initial.path / 'train.log')}")
    shutil.rmtree(initial.path / "checkpoints" / "step_0", ignore_errors=True)  # a copy of the policy beside it
    log(f"orsd-study: initial policy ready in {time.monotonic() - began:.0f} s: {initial.policy}")


def evaluation_command(plan: Plan, evaluation) -> list[str]:
    """orsd-eval of the initial policy at step 0 into the evaluation's directory."""
    from .plan import pinned_precision

    return [sys.executable, "-m", "orsd.train.evaluate", evaluation.policy,
            *(["--config", plan.config] if plan.config else []), "--step", "0", "--run-dir", str(evaluation.path),
            *evaluation.overrides, *pinned_precision(plan)]


def run_start_evaluations(plan: Plan, log=print, poll_seconds: float = 2.0) -> None:
    """The start evaluation of every seed on the shared initial policy, `plan.jobs` at a time, each
    once: a finished one (its eval.jsonl holds step 0) is kept, a killed one starts over."""
    pending = [e for e in plan.start_evaluations if not e.finished()]
    if not pending:
        return
    log(f"orsd-study: the start evaluation of the initial policy for seed(s) {' '.join(str(e.seed) for e in pending)}"
        f" (shared by every arm that evaluates as the base config does)")
    running: list[tuple[object, subprocess.Popen]] = []
    try:
        while pending or running:
            while pending and len(running) < plan.jobs:
                evaluation = pending.pop(0)
                shutil.rmtree(evaluation.path, ignore_errors=True)
                running.append((evaluation, start(evaluation_command(plan, evaluation), evaluation.path,
                                                  run_threads(evaluation.overrides))))
            time.sleep(poll_seconds)
            for item in [r for r in running if r[1].poll() is not None]:
                running.remove(item)
                evaluation, process = item
                if process.returncode != 0 or not evaluation.finished():
                    raise InitialFailed(f"the start evaluation of seed {evaluation.seed} failed (exit status "
                                        f"{process.returncode}); the end of {evaluation.path / 'train.log'}:\n"
                                        f"{log_tail(evaluation.path / 'train.log')}")
    except BaseException:
        stop([process for _, process in running])
        raise


def launch(plan: Plan, run: Run) -> subprocess.Popen:
    what = state(run)
    if what == "restart":  # records without a checkpoint: kept aside for inspection, the run starts over
        aside = run.path.with_name(run.path.name + ".incomplete")
        shutil.rmtree(aside, ignore_errors=True)
        run.path.rename(aside)
    overrides = run_overrides(plan, run, resume=what == "resume")
    command = train_command(plan.launcher, plan.config, overrides, run.path, resume=what == "resume")
    return start(command, run.path, run_threads(overrides))


def run_grid(plan: Plan, log=print, poll_seconds: float = 2.0, progress: bool = True,
             on_start=None) -> list[Outcome]:
    """Every run of the grid: finished ones skipped, unfinished ones resumed (or restarted), `plan.jobs`
    at a time. A failed run is reported with the end of its log and the grid goes on. `on_start(run)`
    is called when a run starts from scratch (not when it resumes)."""
    from tqdm import tqdm

    outcomes = {id(run): Outcome(run, "finished") for run in plan.runs if state(run) == "finished"}
    pending = [run for run in plan.runs if id(run) not in outcomes]
    if outcomes:
        log(f"orsd-study: {len(outcomes)} of {len(plan.runs)} runs already finished (skipped)")
    running: dict[int, tuple[Run, subprocess.Popen]] = {}
    total = sum(run.steps for run in plan.runs)

    def recorded() -> int:
        return sum(min(steps_done(run.path), run.steps) for run in plan.runs)

    bar = tqdm(total=total, initial=recorded(), unit="step", desc="orsd-study", disable=not progress,
               dynamic_ncols=True)
    try:
        while pending or running:
            while pending and len(running) < plan.jobs:
                run = pending.pop(0)
                if on_start is not None and state(run) != "resume":
                    on_start(run)
                running[id(run)] = (run, launch(plan, run))
            time.sleep(poll_seconds)
            for key, (run, process) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[key]
                if process.returncode == 0:
                    outcomes[key] = Outcome(run, "done", 0)
                    bar.write(f"orsd-study: {run.name} done ({steps_done(run.path)} steps)")
                else:
                    tail = log_tail(run.path / "train.log")
                    outcomes[key] = Outcome(run, "failed", process.returncode, tail)
                    bar.write(f"orsd-study: {run.name} FAILED (exit status {process.returncode}); the end of "
                              f"{run.path / 'train.log'}:\n{tail}", file=sys.stderr)
            bar.update(recorded() - bar.n)
            failed = sum(o.status == "failed" for o in outcomes.values())
            bar.set_postfix_str(f"runs {len(outcomes) - failed}/{len(plan.runs)} done, {failed} failed, "
                                f"{len(running)} running")
    except BaseException:  # Ctrl-C or a kill: the children stop with the study, and resume with it
        stop([process for _, process in running.values()])
        raise
    finally:
        bar.close()
    return [outcomes[id(run)] for run in plan.runs]
