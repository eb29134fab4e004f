"""The study's figures. curves.png, the layout of the paper's Fig. 3: one panel per metric (training
reward, success rate, and the official score where recorded) against the training step; per arm the
mean over seeds as a line with a ±1 standard-error band, each seed faint behind it. heldout.png:
held-out success at the start and the end per arm with 95 % bootstrap intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orsd.report.plotting import curve_styles, dodge, draw_curve, fit_limits

from . import stats
from .summary import RunData

#: (steps.jsonl key, panel title, drawn on 0..1)
PANELS = (("reward_mean", "training reward", False), ("success_rate", "training success rate", True),
          ("score_mean", "training score", True))


def seed_table(by_seed: dict[int, RunData], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values [seeds, steps]) with NaN where a seed has no value at a step."""
    steps = np.array(sorted({s for run in by_seed.values() for s in run.series(key)}), dtype=float)
    position = {int(step): i for i, step in enumerate(steps)}
    table = np.full((len(by_seed), len(steps)), np.nan)
    for row, run in enumerate(by_seed.values()):
        for step, value in run.series(key).items():
            table[row, position[step]] = value
    return steps, table


def mean_and_se(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the mean over the seeds that have it, and its standard error (NaN below 2 seeds)."""
    columns = [column[np.isfinite(column)] for column in table.T]
    mean = np.array([column.mean() if len(column) else np.nan for column in columns])
    return mean, np.array([stats.standard_error(column) for column in columns])


def plot_study(runs: dict[str, dict[int, RunData]], labels: list[str], out_png: Path) -> Path:
    """curves.png for the arms `labels` (in that order: their colours, styles and legend entries)."""
    figure = study_figure(runs, labels)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png", metadata={"Software": None})
    return out_png


def study_figure(runs: dict[str, dict[int, RunData]], labels: list[str]):
    from matplotlib.figure import Figure

    panels = [p for p in PANELS if any(run.series(p[0]) for by_seed in runs.values() for run in by_seed.values())]
    panels = panels or list(PANELS[:1])
    styles = curve_styles(labels)
    figure = Figure(figsize=(4.8 * len(panels), 4.4 + 0.25 * (len(labels) // 4)), dpi=100, layout="constrained")
    grid = figure.subplots(1, len(panels), squeeze=False)[0]
    for axes, (key, title, unit) in zip(grid, panels):
        drawn, xs = [], []
        for index, label in enumerate(labels):
            by_seed = runs.get(label, {})
            steps, table = seed_table(by_seed, key)
            if not len(steps):
                continue
            xs += list(steps)
            steps = dodge(steps, index, len(labels))
            style = styles[label]
            for row in table:  # each seed, faint, behind the mean
                draw_curve(axes, steps, row, style, linewidth=0.8, alpha=0.3, markers=len(steps) <= 3)
            mean, se = mean_and_se(table)
            if np.isfinite(se).any():
                axes.fill_between(steps, mean - se, mean + se, color=style.colour, alpha=0.15, linewidth=0)
            draw_curve(axes, steps, mean, style, label=f"{label} ({len(by_seed)} seed{'s' * (len(by_seed) != 1)})")
            drawn += [table.ravel(), mean - np.nan_to_num(se), mean + np.nan_to_num(se)]
        fit_limits(axes, xs, np.concatenate(drawn) if drawn else [], unit_interval=unit)
        axes.set_title(title)
        axes.set_xlabel("training step")
        axes.grid(alpha=0.3)
    handles, names = grid[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, names, loc="outside lower center", ncols=min(4, len(names)), fontsize=8)
    figure.suptitle("mean over seeds, band ±1 standard error, each seed faint", fontsize=9)
    return figure


def plot_heldout(arms: dict[str, dict], labels: list[str], out_png: Path) -> Path:
    """heldout.png: per arm, success at the start (hollow) and at the end (filled) with their intervals."""
    from matplotlib.figure import Figure

    styles = curve_styles(labels)
    figure = Figure(figsize=(max(4.8, 0.9 * len(labels) + 2), 3.8), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for i, label in enumerate(labels):
        held = arms[label]["heldout"]
        for offset, which, fill in ((-0.12, "start", "none"), (0.12, "end", styles[label].colour)):
            point = held.get(which) or {}
            if point.get("mean") is None:
                continue
            low, high = point.get("low"), point.get("high")
            error = ([[point["mean"] - low], [high - point["mean"]]] if low is not None and high is not None else None)
            axes.errorbar([i + offset], [point["mean"]], yerr=error, fmt=styles[label].marker,
                          color=styles[label].colour, markerfacecolor=fill, capsize=4, markersize=7)
    axes.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0, ha="right" if len(labels) > 4
                    else "center")
    axes.set_xlim(-0.6, len(labels) - 0.4)
    axes.set_ylim(-0.04, 1.04)
    axes.set_ylabel("held-out success")
    axes.grid(alpha=0.3, axis="y")
    axes.set_title("held-out success with 95 % bootstrap intervals\nstart (hollow), end (filled)", fontsize=9)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png", metadata={"Software": None})
    return out_png
