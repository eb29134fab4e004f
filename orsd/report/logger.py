"""The training-time logger: streams each step's metrics (what the trainer also writes to steps.jsonl)
and each eval.jsonl record as scalars to TensorBoard event files under `run_dir/tensorboard/` and,
when asked, to Weights & Biases. It writes nothing else into the run directory."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import yaml


def flatten(metrics: dict, prefix: str = "") -> dict[str, float]:
    """Finite numeric leaves of a nested dict as {"a/b": float}; None, NaN, strings and lists are skipped
    (JSON has no NaN, so the run directory holds them as null too)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
            continue
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            value = value.item()  # numpy / torch scalars
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[name] = float(value)
    return out


class Reporter:
    """Streams step and evaluation metrics to TensorBoard event files under `run_dir/tensorboard/`
    and, when asked, to Weights & Biases. `purge_step` (on resume) hides events at or after it."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, wandb: bool = False, config=None,
                 wandb_project: str = "orsd", purge_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.writer = None
        self.wandb_run = None
        config_dict = _config_dict(config)
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as error:
                raise ImportError("Reporter(wandb=True) needs the `wandb` package, which is not installed: "
                                  "`pip install wandb`, or pass wandb=False (TensorBoard still works)") from error
            self.wandb_run = wandb_module.init(project=wandb_project, name=self.run_dir.name, dir=str(self.run_dir),
                                               config=config_dict)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=purge_step)
            if config_dict is not None:
                text = yaml.safe_dump(config_dict, sort_keys=False)
                # four-space indent: TensorBoard renders text as markdown, this keeps it a code block
                self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def log_step(self, metrics: dict) -> dict[str, float]:
        """One training step (the trainer's metrics + `seconds`); returns the scalars written."""
        step = _step_of(metrics, "metrics")
        scalars = {k: v for k, v in flatten(metrics).items() if k != "step"}
        self._write(scalars, step)
        return scalars

    def log_eval(self, record: dict) -> dict[str, float]:
        """One eval.jsonl record as `eval/<split>/...` scalars at its training step."""
        step = _step_of(record, "record")
        split = str(record.get("split") or "eval")
        body = {k: v for k, v in record.items() if k not in ("step", "split", "env")}
        scalars = flatten(body, f"eval/{split}/")
        self._write(scalars, step)
        return scalars

    def _write(self, scalars: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()  # a killed run keeps every step it logged
        if self.wandb_run is not None:
            self.wandb_run.log(dict(scalars), step=step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _config_dict(config) -> dict | None:
    if config is None or isinstance(config, dict):
        return config
    if dataclasses.is_dataclass(config):
        return dataclasses.asdict(config)
    raise TypeError(f"config: expected a Config dataclass, a dict or None, got {type(config).__name__}")


def _step_of(record: dict, name: str) -> int:
    if not isinstance(record, dict):
        raise TypeError(f"{name}: expected a dict, got {type(record).__name__}")
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"{name}['step']: expected an int training step, got {step!r}")
    return step
