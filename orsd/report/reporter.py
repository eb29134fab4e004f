"""Reporting of a run directory: TensorBoard/W&B scalars while training, and afterwards `curves.png`
(training reward per step, ORSD vs GRPO in the style of the paper's Figure 3) and `report.html`.

Everything here only reads the run directory (config.yaml, environment.json, steps.jsonl,
groups.jsonl, eval.jsonl, summary.jsonl); it never changes what the trainer wrote.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import heapq
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import yaml

from . import html as report_html
from .plotting import curve_styles, dodge, draw_curve, fit_limits

#: rows of curves.png: (steps.jsonl key, y-axis label); the first is the paper's Figure 3
CURVE_METRICS = (("reward_mean", "training reward"), ("success_rate", "success rate"),
                 ("groups_with_bundle", "groups with a bundle"))
#: rows of curves.png drawn on 0..1 (rates and fractions)
UNIT_INTERVAL = ("success_rate", "groups_with_bundle")


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


# ---------------------------------------------------------------------------------------------- reading


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


# ---------------------------------------------------------------------------------------------- curves


def ema(values, smoothing: float = 0.9) -> np.ndarray:
    """TensorBoard's debiased exponential moving average; missing values (None/NaN) stay NaN and do not
    move the average."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing: expected a float in [0, 1), got {smoothing!r}")
    out = np.full(len(values), np.nan)
    last, count = 0.0, 0
    for i, value in enumerate(values):
        if value is None or not math.isfinite(value):
            continue
        last = last * smoothing + (1.0 - smoothing) * value
        count += 1
        out[i] = last / (1.0 - smoothing ** count)
    return out


@dataclasses.dataclass
class Curve:
    """One label in one env: per-step mean over its runs (seeds), the EMA of that mean, and the
    min–max envelope of the runs' own EMAs when there are several runs."""

    label: str
    env: str
    runs: list[Path]
    steps: np.ndarray
    raw: dict[str, np.ndarray]
    smooth: dict[str, np.ndarray]
    low: dict[str, np.ndarray] | None = None
    high: dict[str, np.ndarray] | None = None


def _normalise_runs(runs) -> list[tuple[str | None, Path]]:
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    if isinstance(runs, dict):
        pairs = []
        for label, paths in runs.items():
            paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
            pairs += [(str(label), _existing_dir(p, f"runs[{label!r}]")) for p in paths]
        return pairs
    if isinstance(runs, (list, tuple)):
        return [(None, _existing_dir(p, "runs")) for p in runs]
    raise TypeError(f"runs: expected a dict {{label: run_dir or [run_dirs]}} or a list of run dirs, "
                    f"got {type(runs).__name__}")


def curve_data(runs, smoothing: float = 0.9) -> tuple[list[Curve], list[str]]:
    """The series plot_curves draws, and notes on runs that have nothing to draw yet."""
    grouped: dict[tuple[str, str], list[tuple[Path, list[dict]]]] = {}
    notes = []
    for label, path in _normalise_runs(runs):
        default_label, env = run_info(path)
        steps = [s for s in read_jsonl(path / "steps.jsonl") if isinstance(s.get("step"), int)]
        if not steps:
            notes.append(f"{path}: steps.jsonl has no steps yet")
            continue
        grouped.setdefault((env, label or default_label), []).append((path, steps))
    curves = []
    for (env, label), members in sorted(grouped.items()):
        axis = np.array(sorted({s["step"] for _, steps in members for s in steps}))
        position = {int(step): i for i, step in enumerate(axis)}
        curve = Curve(label, env, [p for p, _ in members], axis, {}, {})
        per_run_smooth = {}
        for key, _ in CURVE_METRICS:
            table = np.full((len(members), len(axis)), np.nan)
            for row, (_, steps) in enumerate(members):
                for s in steps:
                    value = s.get(key)
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        table[row, position[s["step"]]] = value
            counts = np.isfinite(table).sum(axis=0)
            sums = np.where(np.isfinite(table), table, 0.0).sum(axis=0)
            curve.raw[key] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
            curve.smooth[key] = ema(curve.raw[key], smoothing)
            per_run_smooth[key] = np.stack([ema(row, smoothing) for row in table])
        if len(members) > 1:
            curve.low, curve.high = {}, {}
            for key, table in per_run_smooth.items():
                several = np.isfinite(table).sum(axis=0) > 1
                filled_low = np.where(np.isfinite(table), table, np.inf).min(axis=0)
                filled_high = np.where(np.isfinite(table), table, -np.inf).max(axis=0)
                curve.low[key] = np.where(several, filled_low, np.nan)
                curve.high[key] = np.where(several, filled_high, np.nan)
        curves.append(curve)
    return curves, notes


def plot_curves(runs, out_png: str | Path, smoothing: float = 0.9) -> Path:
    """curves.png: per env one column; rows training reward, success rate, groups with a bundle.
    Thin line: per-step mean (over seeds); thick: its debiased EMA (`smoothing`); band: min–max of
    the seeds' EMAs. Runs with no steps yet are named in a note instead of failing."""
    curves, notes = curve_data(runs, smoothing)
    return _draw(curves, notes, Path(out_png))


def _draw(curves: list[Curve], notes: list[str], out_png: Path) -> Path:
    figure = curves_figure(curves, notes)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png", metadata={"Software": None})
    return out_png


def curves_figure(curves: list[Curve], notes: list[str]):
    """The figure of curves.png: one column per env, one row per CURVE_METRICS entry, a legend below."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state, Agg canvas

    envs = sorted({c.env for c in curves})
    styles = curve_styles(sorted({c.label for c in curves}))
    if not curves:
        figure = Figure(figsize=(6.4, 3.2), dpi=100)
        axes = figure.add_subplot()
        axes.set_axis_off()
        axes.text(0.5, 0.5, "nothing to plot yet\n" + "\n".join(notes), ha="center", va="center",
                  wrap=True, fontsize=9)
    else:
        figure = Figure(figsize=(5.2 * len(envs), 8.2 + 0.25 * len(notes) + 0.2 * (len(styles) // 4)), dpi=100,
                        layout="constrained")
        grid = figure.subplots(len(CURVE_METRICS), len(envs), squeeze=False, sharex="col")
        legend = {}
        for column, env in enumerate(envs):
            for row, (key, ylabel) in enumerate(CURVE_METRICS):
                axes = grid[row, column]
                shown = []
                members = [c for c in curves if c.env == env]
                for index, curve in enumerate(members):
                    style = styles[curve.label]
                    seeds = f" ({len(curve.runs)} runs)" if len(curve.runs) > 1 else ""
                    steps = dodge(curve.steps, index, len(members))
                    if curve.low is not None:
                        axes.fill_between(steps, curve.low[key], curve.high[key], color=style.colour,
                                          alpha=0.18, linewidth=0)
                        shown += [curve.low[key], curve.high[key]]
                    draw_curve(axes, steps, curve.raw[key], style, linewidth=0.8, alpha=0.35, markers=False)
                    draw_curve(axes, steps, curve.smooth[key], style, label=f"{curve.label}{seeds}")
                    shown += [curve.raw[key], curve.smooth[key]]
                fit_limits(axes, [s for c in curves if c.env == env for s in c.steps],
                           np.concatenate(shown) if shown else [], unit_interval=key in UNIT_INTERVAL)
                axes.set_ylabel(ylabel)
                axes.grid(alpha=0.3)
                if row == 0:
                    axes.set_title(env or "training")
                    for handle, text in zip(*axes.get_legend_handles_labels()):
                        legend.setdefault(text, handle)
                if row == len(CURVE_METRICS) - 1:
                    axes.set_xlabel("training step")
        # below the plots, where a dozen labels cover no curve
        figure.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(4, len(legend)),
                      fontsize=8)
        if notes:
            figure.suptitle("\n".join(notes), fontsize=8, color="#a04000")
    return figure


# ---------------------------------------------------------------------------------------------- report


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


def write_report(run_dir: str | Path, compare=None, out: str | Path | None = None, max_groups: int = 5,
                 smoothing: float = 0.9) -> Path:
    """report.html (self-contained) for `run_dir`, with `curves.png` written next to it in the run
    directory; `compare`: other run dirs (a list, or {label: dir}) drawn on the same curves."""
    run_dir = _existing_dir(run_dir, "run_dir")
    out = Path(out) if out is not None else run_dir / "report.html"
    label, env = run_info(run_dir)
    runs: dict[str, list[Path]] = {}
    for item_label, path in [(label, run_dir)] + _normalise_runs(compare or []):
        runs.setdefault(item_label or run_info(path)[0], []).append(path)
    curves, notes = curve_data(runs, smoothing)
    curves_png = _draw(curves, notes, run_dir / "curves.png")
    compared = [(name, run_info(p)[1], p) for name, paths in runs.items() for p in paths]
    summaries = read_jsonl(run_dir / "summary.jsonl")
    html = report_html.render(
        title=f"{label} run {run_dir.name}" + (f" on {env}" if env else ""),
        out_dir=out.parent.resolve(),
        run_dir=run_dir.resolve(),
        curves_png=base64.b64encode(curves_png.read_bytes()).decode("ascii"),
        runs=[(name, run_env, p.resolve()) for name, run_env, p in compared],
        notes=notes,
        smoothing=smoothing,
        config_text=_text(run_dir / "config.yaml"),
        environment_text=_text(run_dir / "environment.json"),
        summary=summaries[-1] if summaries else None,
        steps=read_jsonl(run_dir / "steps.jsonl"),
        evals=read_jsonl(run_dir / "eval.jsonl"),
        groups=pick_groups(run_dir / "groups.jsonl", max_groups),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out


def _text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else None


def _compare_arg(value: str) -> tuple[str | None, str]:
    """`DIR` or `LABEL=DIR` (a path that exists as given wins over the LABEL= reading)."""
    if "=" in value and not Path(value).exists():
        label, path = value.split("=", 1)
        return label, path
    return None, value


def main(argv: list[str] | None = None) -> int:
    """`orsd-report RUN_DIR [--compare OTHER_RUN ...] [--out FILE]`."""
    parser = argparse.ArgumentParser(
        prog="orsd-report",
        description="Write curves.png and report.html for an orsd run directory (self-contained HTML: "
                    "config, curves, eval table, step metrics, groups with their chosen bundle and a Δ heat-map).")
    parser.add_argument("run_dir", help="the run directory (runs/<name>)")
    parser.add_argument("--compare", nargs="+", action="extend", default=[], metavar="RUN",
                        help="other run dirs drawn on the same curves, e.g. the GRPO twin; LABEL=DIR names "
                             "the curve (default: ORSD/GRPO from each config; same label = seeds, drawn as a band)")
    parser.add_argument("--out", help="where to write the HTML (default RUN_DIR/report.html)")
    parser.add_argument("--groups", type=int, default=5, help="how many groups to show (default 5)")
    parser.add_argument("--smoothing", type=float, default=0.9, help="EMA weight of the smoothed curves (default 0.9)")
    args = parser.parse_args(argv)
    try:
        compare: dict[str, list[str]] = {}
        for value in args.compare:
            label, path = _compare_arg(value)
            compare.setdefault(label or run_info(path)[0], []).append(path)
        report = write_report(args.run_dir, compare or None, args.out, args.groups, args.smoothing)
    except (ValueError, TypeError) as error:
        print(f"orsd-report: {error}", file=sys.stderr)
        return 2
    print(Path(args.run_dir) / "curves.png")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
