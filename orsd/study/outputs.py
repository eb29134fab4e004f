"""What a study leaves in OUT: summary.json (every number), curves.png and heldout.png, and the same
tables as study.md and a self-contained study.html, the Table-1 layout coming from orsd-compare."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from html import escape
from pathlib import Path

from orsd.report import compare
from orsd.report.html import CSS

from .figures import plot_heldout, plot_study
from .summary import MIN_SEEDS_FOR_SEED_BOOTSTRAP, default_baseline, read_runs, summarize


@dataclass
class Table:
    title: str
    intro: str
    header: list[str]
    rows: list[list[str]]


def number(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def interval(point: dict | None, digits: int = 3) -> str:
    """"mean [low, high]" of an Interval dict."""
    if not point or point.get("mean") is None:
        return "–"
    if point.get("low") is None:
        return f"{point['mean']:.{digits}f} (n = {point.get('n', 0)}, no interval)"
    return f"{point['mean']:.{digits}f} [{point['low']:.{digits}f}, {point['high']:.{digits}f}]"


def tables(summary: dict, window: int) -> list[Table]:
    arms, baseline = summary["arms"], summary["baseline"]
    learning = Table(
        f"Learning: mean training reward over the last {window} steps minus the first {window}",
        "Per seed, then over seeds: mean, standard error (SE), how many SEs the mean lies from 0, and the 95 % "
        "percentile bootstrap interval over seeds (scipy.stats.bootstrap), over the runs that have finished (seeds). "
        "With fewer than 2·window steps the two windows overlap.",
        ["arm", "method", "seeds", "per seed", "mean", "SE", "mean / SE", "95 % interval"],
        [[label, str(arm["method"]), str(len(arm["learning"]["per_seed"])),
          ", ".join(number(v) for v in arm["learning"]["per_seed"].values()), number(arm["learning"]["mean"]),
          number(arm["learning"]["se"]), number(arm["learning"]["n_se"], 1), interval(arm["learning"])]
         for label, arm in arms.items()])
    paired = Table(
        f"Against {baseline}, paired by seed",
        "Per seed, arm − baseline (the same seed draws the same tasks from the same initial policy); the mean "
        "over seeds with its 95 % bootstrap interval over seeds; and per seed how many steps from the first the arm "
        "sampled exactly the baseline's trajectories (groups.jsonl: same tasks, actions and rewards).",
        ["arm", "Δ learning statistic", "Δ held-out success at the end", "Δ held-out score at the end", "seeds",
         "identical steps per seed"],
        [[label, interval(arm["vs_baseline"]["learning"]), interval(arm["vs_baseline"]["heldout_end"]),
          interval(arm["vs_baseline"]["heldout_score_end"]),
          str(arm["vs_baseline"]["learning"]["n"]),
          ", ".join(f"{seed}: {'–' if k is None else k}"
                    for seed, k in arm["vs_baseline"]["identical_steps"].items()) or "–"]
         for label, arm in arms.items() if "vs_baseline" in arm])
    held = Table(
        f"Held-out success at step 0 and at step {summary['end_step'] if summary['end_step'] is not None else '–'}",
        f"From eval.jsonl (train.eval_before gives step 0; the end is the last step every run evaluated at). 95 % "
        f"bootstrap intervals over the per-seed success rates with {MIN_SEEDS_FOR_SEED_BOOTSTRAP} seeds or more "
        f"(end − start paired by seed), else over the episodes pooled across seeds (end − start as two "
        f"independent samples); the unit is named per arm.",
        ["arm", "start", "end", "end − start", "resampled"],
        [[label, interval(arm["heldout"].get("start")), interval(arm["heldout"].get("end")),
          interval(arm["heldout"].get("end_minus_start")), arm["heldout"]["unit"]] for label, arm in arms.items()])
    score = Table(
        f"Held-out score at step 0 and at step {summary['end_step'] if summary['end_step'] is not None else '–'}",
        "The env's partial credit per episode (score_mean of eval.jsonl: the shop's attribute, option and price "
        "match of what was bought, 0 without a purchase), per seed start → end; the mean over seeds and, with "
        f"{MIN_SEEDS_FOR_SEED_BOOTSTRAP} seeds or more, end − start paired by seed with its 95 % bootstrap interval "
        "over seeds.",
        ["arm", "per seed (start → end)", "start", "end", "end − start"],
        [[label, ", ".join(f"{number(v['start'])} → {number(v['end'])}"
                           for v in arm["heldout_score"]["per_seed"].values()),
          number(arm["heldout_score"]["start_mean"]), number(arm["heldout_score"]["end_mean"]),
          interval(arm["heldout_score"].get("end_minus_start"))] for label, arm in arms.items()])
    shaping = Table(
        "Shaping magnitude |α·e·Δ| / |A|",
        "How far the rubric moves a token's advantage against the advantage itself: the mean over steps and seeds "
        "of the shaping_ratio metrics of steps.jsonl, or where a run has none, α · (fraction of tokens with e = 1) "
        "· mean |Δ| / mean |A| from each step's metrics (0 for a method without a rubric).",
        ["arm", "source", "value"],
        [[label, arm["shaping"]["source"], ", ".join(f"{k} {number(v, 4)}" for k, v in arm["shaping"].items()
                                                     if k not in ("source", "steps"))]
         for label, arm in arms.items()])
    return [learning, paired, held, score, shaping] if paired.rows else [learning, held, score, shaping]


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def markdown(study: dict, summary: dict, runs_table: Table, window: int, table1: tuple) -> str:
    initial = study.get("initial") or {}
    lines = [f"# Study {study['out']}", "",
             f"- config: `{study['config'] or 'the embedded default'}`; --set: {' '.join(study['sets']) or 'none'}",
             f"- arms: {', '.join(f'`{a}`' for a in study['arms'])}; seeds: {' '.join(map(str, study['seeds']))}",
             f"- initial policy: `{initial.get('policy', 'model.path of the config')}`"
             + (f" (sha256 {initial['sha256'][:16]}…, the warm start of {initial.get('method')})"
                if initial.get("sha256") else ""),
             f"- orsd git sha: {study.get('git_sha') or 'unknown'}", "",
             "## Training curves", "", "![training curves](curves.png)", ""]
    for table in [*tables(summary, window), runs_table]:
        lines += [f"## {table.title}", "", table.intro, "", "| " + " | ".join(table.header) + " |",
                  "|" + "---|" * len(table.header)]
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
        lines.append("")
        if table.title.startswith("Held-out success"):
            lines += ["![held-out success](heldout.png)", ""]
    checkpoints, rows = table1
    lines += ["## Table 1 layout (orsd-compare)", "", *[f"- {line}" for line in compare.describe(checkpoints)], "",
              *compare.markdown_table(checkpoints, rows), ""]
    return "\n".join(lines)


def html_page(study: dict, summary: dict, runs_table: Table, window: int, table1: tuple, images: dict) -> str:
    def table_html(table: Table) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
        body = "".join("<tr>" + "".join(f'<td class="{"text" if i == 0 else ""}">{escape(str(c))}</td>'
                                        for i, c in enumerate(row)) + "</tr>" for row in table.rows)
        return f"<h2>{escape(table.title)}</h2><p>{escape(table.intro)}</p><table><tr>{head}</tr>{body}</table>"

    def image(name: str) -> str:
        data = base64.b64encode(images[name].read_bytes()).decode("ascii")
        return f'<img class="curves" alt="{escape(name)}" src="data:image/png;base64,{data}">'

    initial = study.get("initial") or {}
    facts = [f"config: {study['config'] or 'the embedded default'}; --set: {' '.join(study['sets']) or 'none'}",
             f"arms: {', '.join(study['arms'])}; seeds: {' '.join(map(str, study['seeds']))}",
             f"initial policy: {initial.get('policy', 'model.path of the config')}"
             + (f" (sha256 {initial['sha256']})" if initial.get("sha256") else ""),
             f"orsd git sha: {study.get('git_sha') or 'unknown'}"]
    parts = [f"<h1>Study {escape(str(study['out']))}</h1><ul>" + "".join(f"<li>{escape(f)}</li>" for f in facts)
             + "</ul>", "<h2>Training curves</h2>", image("curves.png")]
    for table in [*tables(summary, window), runs_table]:
        parts.append(table_html(table))
        if table.title.startswith("Held-out success"):
            parts.append(image("heldout.png"))
    checkpoints, rows = table1
    parts.append("<h2>Table 1 layout (orsd-compare)</h2><ul>"
                 + "".join(f"<li>{escape(line)}</li>" for line in compare.describe(checkpoints)) + "</ul>"
                 + compare.html_table(checkpoints, rows))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Study</title>"
            f"<style>{CSS}</style></head>\n<body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _status(run) -> str:
    """What the run directory says of a run this invocation did not launch: it cannot tell a run
    still going from one that was stopped, so an unfinished run says how far it got."""
    if run is None:
        return "not started"
    if run.finished:
        return "finished"
    of = f" of {run.wanted_steps}" if run.wanted_steps is not None else ""
    return f"unfinished ({run.last_step}{of} steps)"


def write_outputs(study: dict, statuses: dict[str, str] | None = None, baseline: str | None = None,
                  window: int = 5) -> list[Path]:
    """summary.json, curves.png, heldout.png, study.md and study.html in OUT for the study recorded in
    `study` (study.json's content); `statuses`: run name -> what this invocation saw (finished, failed...)."""
    out = Path(study["out"])
    labels, seeds = list(study["arms"]), list(study["seeds"])
    runs = read_runs(out, labels, seeds)
    methods = {label: str(next(iter(by_seed.values())).config.get("method", {}).get("name"))
               for label, by_seed in runs.items() if by_seed}
    if baseline is not None and baseline not in labels:
        raise ValueError(f"--baseline {baseline!r}: expected one of the arms {labels}")
    overrides = study.get("arm_overrides") or {}
    arm_methods = {label: next((o.split("=", 1)[1] for o in overrides.get(label, []) if o.startswith("method.name=")),
                               label) for label in labels}  # an arm named by its method has no override
    summary = summarize(runs, labels, baseline or default_baseline(labels, methods), window, arm_methods)
    summary["study"] = study
    summary["runs"] = {f"{label}/seed{seed}": (statuses or {}).get(f"{label}/seed{seed}")
                       or _status(runs.get(label, {}).get(seed)) for label in labels for seed in seeds}
    images = {"curves.png": plot_study(runs, labels, out / "curves.png"),
              "heldout.png": plot_heldout(summary["arms"], labels, out / "heldout.png")}
    # Table 1 from the finished runs only: one run still at its step-0 evaluation would pull every
    # arm's shared checkpoint back to step 0
    specs = [(label, str(run.path)) for label in labels for run in runs.get(label, {}).values() if run.finished]
    checkpoints = compare.shared_checkpoints(compare.read_runs(specs)) if specs else []
    table1 = (checkpoints, compare.table(checkpoints))
    runs_table = Table("Runs", "Each run's directory holds its config.yaml, steps.jsonl, groups.jsonl, eval.jsonl "
                       "and train.log.", ["run", "steps recorded", "status"],
                       [[f"{label}/seed{seed}", str(summary["arms"][label]["steps_recorded"].get(str(seed), 0)),
                         summary["runs"][f"{label}/seed{seed}"]] for label in labels for seed in seeds])
    paths = [out / "summary.json", out / "study.md", out / "study.html"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(markdown(study, summary, runs_table, window, table1), encoding="utf-8")
    paths[2].write_text(html_page(study, summary, runs_table, window, table1, images), encoding="utf-8")
    return [*paths, *images.values()]
