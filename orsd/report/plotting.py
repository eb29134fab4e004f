"""How every orsd figure draws a curve: one style per label that stays distinguishable for a dozen
labels (colour × line style × marker), markers that keep a one-step run visible, and axis limits
that do not collapse when every value is equal. Used by curves.png, orsd-compare and orsd-study."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: fixed colours so that ORSD and GRPO look the same in every figure (labels matched case-insensitively)
LABEL_COLOURS = {"ORSD": "#c0392b", "GRPO": "#5d6d7e"}
#: tab10 without its red and grey, which would be taken for ORSD and GRPO
OTHER_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22")
#: a label's line style changes each time the colours run out, so colour + style never repeat
LINE_STYLES = ("-", "--", ":", "-.")
#: 7 markers against 8 colours: colour and marker first repeat together after 56 labels
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
#: a series of at most this many points gets a marker at every point (one point draws no line)
SHORT = 3
#: a longer series gets about this many markers, enough to tell the lines apart without clutter
MARKS_PER_LINE = 10


@dataclass(frozen=True)
class Style:
    colour: str
    line: str
    marker: str


def curve_styles(labels) -> dict[str, Style]:
    """A distinct (colour, line style, marker) per label, assigned in the order given; ORSD and GRPO
    keep their fixed colours and solid lines."""
    styles, index = {}, 0
    for label in labels:
        if label in styles:
            continue
        fixed = LABEL_COLOURS.get(str(label).upper())
        if fixed is not None:
            styles[label] = Style(fixed, "-", "o" if str(label).upper() == "ORSD" else "s")
            continue
        styles[label] = Style(OTHER_COLOURS[index % len(OTHER_COLOURS)],
                              LINE_STYLES[(index // len(OTHER_COLOURS)) % len(LINE_STYLES)],
                              MARKERS[index % len(MARKERS)])
        index += 1
    return styles


def draw_curve(axes, steps, values, style: Style, label: str | None = None, linewidth: float = 2.0,
               alpha: float = 1.0, markers: bool = True) -> None:
    """One series: its line, and markers at every point of a short series (≤ SHORT points, where a
    line alone shows nothing) or about MARKS_PER_LINE of them on a long one."""
    values = np.asarray(values, dtype=float)
    points = int(np.isfinite(values).sum())
    short = points <= SHORT
    axes.plot(steps, values, color=style.colour, linestyle=style.line, linewidth=linewidth, alpha=alpha,
              label=label, marker=style.marker if markers else None,
              markevery=1 if short else max(1, len(values) // MARKS_PER_LINE),
              markersize=7 if short else 4.5)


def dodge(steps, index: int, count: int, width: float = 0.3) -> np.ndarray:
    """The x positions of the `index`-th of `count` series: a short one (≤ SHORT points) moved by up to
    ±width/2 of a step, so that several labels' equal points (every method at 0 after one step) stand
    side by side instead of hiding each other; a longer one is left where it is."""
    steps = np.asarray(steps, dtype=float)
    if len(steps) > SHORT or count < 2:
        return steps
    return steps + width * (index / (count - 1) - 0.5)


def fit_limits(axes, steps, values, unit_interval: bool = False) -> None:
    """Axis limits that show the data: a rate keeps 0..1; otherwise the data's range with a margin,
    and where every value is equal (a one-step run) a margin of its own around the value instead of
    matplotlib's ±5 % of it. The x-axis gets half a step either side of a single step."""
    steps = np.asarray([s for s in steps if s is not None], dtype=float)
    if len(steps):
        low, high = float(np.min(steps)), float(np.max(steps))
        pad = 0.5 if high - low < 1 else 0.02 * (high - low)
        axes.set_xlim(low - pad, high + pad)
        distinct = np.unique(steps)
        if len(distinct) <= MARKS_PER_LINE and np.all(distinct == np.round(distinct)):
            axes.set_xticks(distinct)  # a few steps: exactly those ticks, never "step 0.9"
        else:
            from matplotlib.ticker import MaxNLocator

            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if unit_interval:
        axes.set_ylim(-0.04, 1.04)
        return
    finite = np.asarray([v for v in np.ravel(np.asarray(values, dtype=float)) if math.isfinite(v)])
    if not len(finite):
        return
    low, high = float(finite.min()), float(finite.max())
    pad = 0.08 * (high - low) if high > low else max(0.05, 0.25 * abs(high))
    axes.set_ylim(low - pad, high + pad)
