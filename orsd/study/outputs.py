"""What a study leaves in OUT: summary.json (every number), curves.png and heldout.png, and the same
tables as study.md and a self-contained study.html, the Table-1 layout coming from orsd-compare."""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path

from orsd.report import compare
from orsd.report.html import CSS

from .figures import plot_heldout, plot_study
from .registration import post_hoc
from .summary import default_baseline, read_runs, summarize
from .tables import Table, tables


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def facts(study: dict) -> list[str]:
    """The study's header lines: config, arms, seeds, every initial policy and the code."""
    initial = study.get("initial") or {}
    policies = study.get("initial_policies") or ([{"sha256": initial["sha256"]}] if initial.get("sha256") else [])
    origins = study.get("runs") or {}
    lines = [f"config: {study['config'] or 'the embedded default'}; --set: {' '.join(study['sets']) or 'none'}",
             f"arms: {', '.join(study['arms'])}; seeds: {' '.join(map(str, study['seeds']))}",
             f"initial policy: {initial.get('policy', 'model.path of the config')}"
             + (f", the warm start of {initial.get('method')}" if initial.get("method") else "")]
    for policy in policies:
        used = sorted(name for name, origin in origins.items() if origin.get("initial_sha256") == policy["sha256"])
        where = (policy.get("machine") or {}).get("cpu")
        lines.append(f"initial policy sha256 {policy['sha256'][:16]}…" + (f" (made on {where})" if where else "")
                     + (f": {len(used)} run(s), {', '.join(used)}" if used else ""))
    lines.append(f"orsd git sha: {study.get('git_sha') or 'unknown'}")
    return lines


def markdown(study: dict, summary: dict, runs_table: Table, window: int, table1: tuple) -> str:
    lines = [f"# Study {study['out']}", "", *[f"- {fact}" for fact in facts(study)], "",
             "## Training curves", "", "![training curves](curves.png)", ""]
    for table in [*tables(summary, window), runs_table]:
        lines += [f"## {table.title}", "", table.intro, "", "| " + " | ".join(table.header) + " |",
                  "|" + "---|" * len(table.header)]
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
        lines.append("")
        if table.title.startswith("Primary comparisons"):
            lines += ["![the primary endpoint per seed and the paired differences](heldout.png)", ""]
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

    parts = [f"<h1>Study {escape(str(study['out']))}</h1><ul>"
             + "".join(f"<li>{escape(f)}</li>" for f in facts(study))
             + "</ul>", "<h2>Training curves</h2>", image("curves.png")]
    for table in [*tables(summary, window), runs_table]:
        parts.append(table_html(table))
        if table.title.startswith("Primary comparisons"):
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
    registration = study.get("registration") or post_hoc(labels, baseline or default_baseline(labels, methods))
    summary = summarize(runs, labels, registration, window, arm_methods)
    summary["study"] = study
    summary["runs"] = {f"{label}/seed{seed}": (statuses or {}).get(f"{label}/seed{seed}")
                       or _status(runs.get(label, {}).get(seed)) for label in labels for seed in seeds}
    images = {"curves.png": plot_study(runs, labels, out / "curves.png", registration["baseline"]),
              "heldout.png": plot_heldout(summary["primary"], labels, out / "heldout.png")}
    # Table 1 from the finished runs only: one run still at its step-0 evaluation would pull every
    # arm's shared checkpoint back to step 0
    specs = [(label, str(run.path)) for label in labels for run in runs.get(label, {}).values() if run.finished]
    checkpoints = compare.shared_checkpoints(compare.read_runs(specs)) if specs else []
    table1 = (checkpoints, compare.table(checkpoints))
    origins = study.get("runs") or {}
    runs_table = Table("Runs", "Each run's directory holds its config.yaml, steps.jsonl, groups.jsonl, eval.jsonl "
                       "and train.log; the initial policy it started from (sha256, study.json's initial_policies) "
                       "and the CPU it started on.", ["run", "steps recorded", "status", "initial policy", "CPU"],
                       [[f"{label}/seed{seed}", str(summary["arms"][label]["steps_recorded"].get(str(seed), 0)),
                         summary["runs"][f"{label}/seed{seed}"],
                         ((origins.get(f"{label}/seed{seed}") or {}).get("initial_sha256") or "–")[:12],
                         ((origins.get(f"{label}/seed{seed}") or {}).get("machine") or {}).get("cpu", "–")]
                        for label in labels for seed in seeds])
    paths = [out / "summary.json", out / "study.md", out / "study.html"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(markdown(study, summary, runs_table, window, table1), encoding="utf-8")
    paths[2].write_text(html_page(study, summary, runs_table, window, table1, images), encoding="utf-8")
    return [*paths, *images.values()]
