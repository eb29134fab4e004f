"""orsd.report.plotting, the curve drawing curves.png, orsd-compare and orsd-study share: a dozen
labels stay apart, one-step runs stay visible, equal values keep sensible axes."""

import numpy as np
from matplotlib.figure import Figure

from orsd.report.plotting import LABEL_COLOURS, curve_styles, dodge, draw_curve, fit_limits
from orsd.report.curves import curve_data, curves_figure, plot_curves
from orsd.report.run_dir import RunDir

METHODS = ["cripo", "gigpo", "GRPO", "grpo_opsd", "offline_rubric", "opsd", "ORSD", "random_bundle", "sdar",
           "single_bundle", "static_rubric"]


def test_a_dozen_labels_get_distinct_styles_and_orsd_grpo_keep_theirs():
    labels = METHODS + [f"extra{i}" for i in range(10)]
    styles = curve_styles(labels)
    assert len({(s.colour, s.line, s.marker) for s in styles.values()}) == len(labels)
    assert styles["ORSD"].colour == LABEL_COLOURS["ORSD"] and styles["GRPO"].colour == LABEL_COLOURS["GRPO"]
    assert curve_styles(["orsd"])["orsd"].colour == LABEL_COLOURS["ORSD"]  # a study's lower-case arm too
    # the first 8 other labels differ in colour alone, the next ones also in line style
    others = [styles[label] for label in labels if label.upper() not in LABEL_COLOURS]
    assert len({s.colour for s in others[:8]}) == 8 and {s.line for s in others[8:16]} == {"--"}


def test_one_point_is_drawn_with_a_marker_and_equal_values_keep_a_margin():
    axes = Figure().add_subplot()
    style = curve_styles(["a"])["a"]
    draw_curve(axes, [1], [1.0], style)
    draw_curve(axes, np.arange(100), np.zeros(100), style)
    short, long = axes.get_lines()
    assert short.get_marker() == style.marker and short.get_markevery() == 1
    assert long.get_markevery() == 10  # about 10 markers on a long line
    fit_limits(axes, [1], [1.0, 1.0])
    low, high = axes.get_ylim()
    assert low <= 0.95 and high >= 1.05 and axes.get_xlim() == (0.5, 1.5)
    fit_limits(axes, [1], [0.3], unit_interval=True)
    assert axes.get_ylim() == (-0.04, 1.04)


def test_dodge_moves_short_series_only():
    assert dodge([1], 0, 3).tolist() == [0.85] and dodge([1], 2, 3).tolist() == [1.15]
    assert dodge([1], 1, 3).tolist() == [1.0] and dodge([1], 0, 1).tolist() == [1.0]
    assert dodge([1, 2, 3, 4], 0, 3).tolist() == [1, 2, 3, 4]


def test_curves_png_of_eleven_one_step_methods(tmp_path):
    """benchmarks/results/compare_methods.png's case: 11 one-step runs once drew empty axes from
    0.945 to 1.05 with 11 methods in 6 colours."""
    runs = []
    for i, method in enumerate(METHODS):
        run = RunDir(tmp_path / method)
        run.write_config({"method": {"name": method.lower()}, "env": {"name": "webshop"}})
        run.append("steps.jsonl", {"step": 1, "reward_mean": -0.05 + 0.001 * i, "success_rate": 0.0,
                                   "groups_with_bundle": 0.5})
        runs.append(run.path)
    curves, notes = curve_data(runs)
    figure = curves_figure(curves, notes)
    legend = figure.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == sorted(c.label for c in curves)
    assert len({(line.get_color(), line.get_linestyle(), line.get_marker()) for line in legend.get_lines()}) == 11
    reward = figure.axes[0]
    low, high = reward.get_ylim()
    assert low < -0.05 and high > -0.04 and high - low < 0.05  # the data's range: not 0.945..1.05, not empty
    assert list(reward.get_xticks()) == [1.0]
    labelled = [line for line in reward.get_lines() if not line.get_label().startswith("_")]
    assert len(labelled) == 11 and all(line.get_marker() not in (None, "None", "") for line in labelled)
    assert plot_curves(runs, tmp_path / "c.png").stat().st_size > 10_000
