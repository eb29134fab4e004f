"""The study's figures. curves.png, the layout of the paper's Fig. 3: one panel per metric (training
reward, success rate, and the official score where recorded) against the training step; per arm the
mean over seeds as a line with a ±1 standard-error band, each seed faint behind it; below them, each
arm minus the baseline per step, paired by seed, which removes what the step's draw of tasks does to
every arm alike. heldout.png: the primary endpoint per seed and per arm with the mean's t interval,
and each arm − baseline per seed with the paired t interval and the ±margin band; axes fitted to the
data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orsd.report.plotting import curve_styles, dodge, draw_curve, fit_limits

from . import stats
from .summary import RunData

#: (steps.jsonl key, panel title, drawn on 0..1)
PANELS = (("reward_mean", "training reward", False), ("success_rate", "training success rate", False),
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


def plot_study(runs: dict[str, dict[int, RunData]], labels: list[str], out_png: Path,
               baseline: str | None = None) -> Path:
    """curves.png for the arms `labels` (in that order: their colours, styles and legend entries), with
    the row of paired differences against `baseline` when it has runs."""
    figure = study_figure(runs, labels, baseline)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png", metadata={"Software": None})
    return out_png


def paired_table(by_seed: dict[int, RunData], base: dict[int, RunData], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, arm − baseline [seeds, steps]) over the seeds and steps both have."""
    seeds = sorted(by_seed.keys() & base.keys())
    steps = np.array(sorted({s for seed in seeds for s in by_seed[seed].series(key)}), dtype=float)
    table = np.full((len(seeds), len(steps)), np.nan)
    for row, seed in enumerate(seeds):
        mine, theirs = by_seed[seed].series(key), base[seed].series(key)
        for column, step in enumerate(steps):
            if int(step) in mine and int(step) in theirs:
                table[row, column] = mine[int(step)] - theirs[int(step)]
    return steps, table


def study_figure(runs: dict[str, dict[int, RunData]], labels: list[str], baseline: str | None = None):
    from matplotlib.figure import Figure

    panels = [p for p in PANELS if any(run.series(p[0]) for by_seed in runs.values() for run in by_seed.values())]
    panels = panels or list(PANELS[:1])
    styles = curve_styles(labels)
    others = [label for label in labels if label != baseline and runs.get(label)] if runs.get(baseline) else []
    rows = 2 if others else 1
    figure = Figure(figsize=(4.8 * len(panels), (4.4 + 0.25 * (len(labels) // 4)) * (1.75 if rows == 2 else 1)),
                    dpi=100, layout="constrained")
    grid = figure.subplots(rows, len(panels), squeeze=False)
    if others:
        for axes, (key, title, _) in zip(grid[1], panels):
            paired_panel(axes, runs, others, baseline, key, title, styles, labels)
    grid = grid[0]
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


def paired_panel(axes, runs, others: list[str], baseline: str, key: str, title: str, styles, labels) -> None:
    """Each arm − baseline per step, paired by seed: the mean over seeds with a ±1 SE band."""
    drawn, xs = [], []
    for label in others:
        steps, table = paired_table(runs[label], runs[baseline], key)
        if not len(steps):
            continue
        xs += list(steps)
        steps = dodge(steps, labels.index(label), len(labels))
        mean, se = mean_and_se(table)
        if np.isfinite(se).any():
            axes.fill_between(steps, mean - se, mean + se, color=styles[label].colour, alpha=0.15, linewidth=0)
        draw_curve(axes, steps, mean, styles[label], label=label)
        drawn += [mean - np.nan_to_num(se), mean + np.nan_to_num(se), [0.0]]
    axes.axhline(0.0, color="black", linewidth=0.8)
    fit_limits(axes, xs, np.concatenate([np.asarray(d, dtype=float) for d in drawn]) if drawn else [0.0])
    axes.set_title(f"{title}: arm − {baseline}, paired by seed")
    axes.set_xlabel("training step")
    axes.grid(alpha=0.3)


def plot_heldout(primary: dict, labels: list[str], out_png: Path) -> Path:
    """heldout.png: left, the primary endpoint per seed (small marks) and per arm the mean with its t
    interval; right, each arm − baseline per seed with the paired t interval, 0 and the ±margin band."""
    from matplotlib.figure import Figure

    styles = curve_styles(labels)
    others = [label for label in labels if label in primary["comparisons"]]
    figure = Figure(figsize=(max(4.8, 0.9 * len(labels) + 2) + (max(4.0, 0.9 * len(others) + 2) if others else 0),
                             4.0), dpi=100, layout="constrained")
    panes = figure.subplots(1, 2 if others else 1, squeeze=False)[0]
    left = panes[0]
    values = []
    for i, label in enumerate(labels):
        arm = primary["arms"].get(label) or {}
        values += _points_with_interval(left, i, list((arm.get("per_seed") or {}).values()), arm.get("mean"),
                                        styles[label])
    _axis(left, labels, values, f"{primary['endpoint']} at step {primary['end_step']}",
          "per seed, mean with its t 95 % interval")
    if others:
        right, values = panes[1], [0.0, primary["margin"], -primary["margin"]]
        for i, label in enumerate(others):
            comparison = primary["comparisons"][label]
            values += _points_with_interval(right, i, list(comparison["difference"].get("differences") or []),
                                            comparison["difference"], styles[label])
        right.axhline(0.0, color="black", linewidth=0.8)
        right.axhspan(-primary["margin"], primary["margin"], color="grey", alpha=0.15, linewidth=0)
        _axis(right, others, values, f"arm − {primary['baseline']}, paired by seed",
              f"paired t 95 % interval; band ±{primary['margin']} (the equivalence margin)")
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, format="png", metadata={"Software": None})
    return out_png


def _points_with_interval(axes, x: int, points: list[float], interval: dict | None, style) -> list[float]:
    """Draws the per-seed points and the interval; returns every value drawn (for the axis limits)."""
    spread = np.linspace(-0.12, 0.12, len(points)) if len(points) > 1 else np.zeros(len(points))
    axes.scatter(x - 0.15 + spread, points, s=14, color=style.colour, alpha=0.5, marker=style.marker)
    if interval and interval.get("mean") is not None:
        low, high = interval.get("low"), interval.get("high")
        error = [[interval["mean"] - low], [high - interval["mean"]]] if low is not None else None
        axes.errorbar([x + 0.15], [interval["mean"]], yerr=error, fmt=style.marker, color=style.colour,
                      capsize=4, markersize=7)
        return [*points, interval["mean"], *([low, high] if low is not None else [])]
    return list(points)


def _axis(axes, labels: list[str], values: list[float], ylabel: str, title: str) -> None:
    axes.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 4 else 0,
                    ha="right" if len(labels) > 4 else "center")
    axes.set_xlim(-0.6, len(labels) - 0.4)
    finite = [v for v in values if v is not None and np.isfinite(v)]
    if finite:
        low, high = min(finite), max(finite)
        pad = max(0.05 * (high - low), 0.01)
        axes.set_ylim(low - pad, high + pad)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3, axis="y")
    axes.set_title(title, fontsize=9)
