"""curves.png: training reward, success rate and groups with a bundle per step, ORSD vs GRPO in the
style of the paper's Figure 3, from the runs' steps.jsonl (per-step mean over seeds, its debiased
EMA, and the min–max band of the seeds' EMAs). Styles come from plotting.py."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np

from .plotting import curve_styles, dodge, draw_curve, fit_limits
from .records import _existing_dir, read_jsonl, run_info

#: rows of curves.png: (steps.jsonl key, y-axis label); the first is the paper's Figure 3
CURVE_METRICS = (("reward_mean", "training reward"), ("success_rate", "success rate"),
                 ("groups_with_bundle", "groups with a bundle"))
#: rows of curves.png drawn on 0..1 (rates and fractions)
UNIT_INTERVAL = ("success_rate", "groups_with_bundle")


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
