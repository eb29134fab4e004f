"""`orsd-compare RUN [RUN ...]`: the paper's comparison from run directories.

Writes a markdown and a self-contained HTML table in the layout of the paper's Table 1/2 (ALFWorld
success per task type and overall; WebShop score and success; in %, one row per model and method)
and the overlaid training-reward curves of its Figure 3. Every number comes from the runs' plain
records: eval.jsonl for the table, steps.jsonl for the curves, config.yaml for labels.

The table compares runs at the same checkpoint: per environment, the last (step, split) for which
every run of that environment has an evaluation; the table says which. Runs with the same label,
environment and model are seeds: their values are averaged and the count is shown.
"""

from __future__ import annotations

import argparse
import base64
import sys
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import yaml

from .html import CSS
from .cli import _compare_arg
from .curves import plot_curves
from .records import _existing_dir, read_jsonl, run_info

#: eval.jsonl per_kind key -> the paper's Table 1 column; None = overall success
ALFWORLD_COLUMNS = (("pick_and_place_simple", "Pick"), ("look_at_obj_in_light", "Look"),
                    ("pick_clean_then_place_in_recep", "Clean"), ("pick_heat_then_place_in_recep", "Heat"),
                    ("pick_cool_then_place_in_recep", "Cool"), ("pick_two_obj_and_place", "Pick2"), (None, "All"))
#: eval.jsonl key -> the paper's WebShop column
WEBSHOP_COLUMNS = (("score_mean", "Score"), ("success_rate", "Succ."))
ENV_TITLES = {"alfworld": "ALFWorld", "webshop": "WebShop"}


@dataclass
class Run:
    label: str
    env: str
    model: str
    path: Path
    evals: list[dict]


@dataclass
class Checkpoint:
    """What the table reads for one environment: the shared (step, split), or why there is none."""

    env: str
    runs: list[Run]
    step: int | None = None
    split: str | None = None


@dataclass
class Row:
    model: str
    label: str
    runs: list[Path] = field(default_factory=list)
    seeds: dict[str, int] = field(default_factory=dict)  # env -> runs averaged
    cells: dict[str, float | None] = field(default_factory=dict)  # column title -> value in %


def read_runs(specs: list[tuple[str | None, str]]) -> list[Run]:
    """(label or None, run dir) pairs -> runs; the label defaults to the method's (run_info)."""
    runs = []
    for label, path in specs:
        path = _existing_dir(path, "run")
        default_label, env = run_info(path)
        config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").exists() else None
        model = str(((config or {}).get("model") or {}).get("path") or "")
        runs.append(Run(label or default_label, env, model, path, read_jsonl(path / "eval.jsonl")))
    return runs


def shared_checkpoints(runs: list[Run]) -> list[Checkpoint]:
    """Per environment (in the paper's order), the last (step, split) every run of it evaluated at."""
    out = []
    order = list(ENV_TITLES)
    for env in sorted({r.env for r in runs}, key=lambda e: (order.index(e) if e in order else len(order), e)):
        members = [r for r in runs if r.env == env]
        common = set.intersection(*({(e.get("step"), str(e.get("split") or "")) for e in r.evals
                                     if isinstance(e.get("step"), int)} for r in members))
        step, split = max(common) if common else (None, None)
        out.append(Checkpoint(env, members, step, split))
    return out


def cells_of(env: str, record: dict) -> dict[str, float | None]:
    """One eval.jsonl record as the paper's columns, in %."""
    def percent(value):
        return 100.0 * value if isinstance(value, (int, float)) else None

    if env == "alfworld":
        per_kind = record.get("per_kind") or {}
        return {title: percent(record.get("success_rate") if kind is None
                               else (per_kind.get(kind) or {}).get("success_rate"))
                for kind, title in ALFWORLD_COLUMNS}
    if env == "webshop":
        return {title: percent(record.get(key)) for key, title in WEBSHOP_COLUMNS}
    return {}


def table(checkpoints: list[Checkpoint]) -> list[Row]:
    """One row per (model, label): each environment's columns at its shared checkpoint, averaged
    over the seeds that have it."""
    rows: dict[tuple[str, str], Row] = {}
    for point in checkpoints:
        values: dict[tuple[str, str], list[dict]] = {}
        for run in point.runs:
            row = rows.setdefault((run.model, run.label), Row(run.model, run.label))
            row.runs.append(run.path)
            row.seeds[point.env] = row.seeds.get(point.env, 0) + 1
            record = next((e for e in reversed(run.evals) if (e.get("step"), str(e.get("split") or ""))
                           == (point.step, point.split)), None)
            if record is not None:
                values.setdefault((run.model, run.label), []).append(cells_of(point.env, record))
        for key, seeds in values.items():
            for title in seeds[0]:
                present = [s[title] for s in seeds if s[title] is not None]
                rows[key].cells[title] = sum(present) / len(present) if present else None
    return sorted(rows.values(), key=lambda r: (r.model, r.label))


def columns(checkpoints: list[Checkpoint]) -> list[tuple[str, list[str]]]:
    """(environment title, column titles) for every environment present."""
    return [(ENV_TITLES.get(p.env, p.env), [t for _, t in ALFWORLD_COLUMNS] if p.env == "alfworld"
             else [t for _, t in WEBSHOP_COLUMNS] if p.env == "webshop" else []) for p in checkpoints]


def describe(checkpoints: list[Checkpoint]) -> list[str]:
    """Which checkpoint each environment's columns come from, or why they are empty."""
    lines = []
    for point in checkpoints:
        title = ENV_TITLES.get(point.env, point.env or "unknown env")
        if point.step is None:
            last = ", ".join(f"{r.path.name}: {_last_step(r)}" for r in point.runs)
            lines.append(f"{title}: no evaluation step shared by all {_runs(len(point.runs))} (last eval step per "
                         f"run: {last}); its columns are empty")
        else:
            lines.append(f"{title}: eval.jsonl at step {point.step}, split {point.split or '?'}, the last step "
                         f"evaluated by all {_runs(len(point.runs))}")
    return lines


def _last_step(run: Run) -> int | str:
    return max((e["step"] for e in run.evals if isinstance(e.get("step"), int)), default="none")


def _runs(count: int) -> str:
    return f"{count} run" + ("s" if count != 1 else "")


def _seeds(row: Row, checkpoints: list[Checkpoint]) -> str:
    """Runs averaged per environment, in column order ("2", or "1 / 3" for ALFWorld / WebShop)."""
    return " / ".join(str(row.seeds.get(p.env, 0)) for p in checkpoints)


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def markdown_table(checkpoints: list[Checkpoint], rows: list[Row]) -> list[str]:
    """The table's lines (a header row, then one row per model and method)."""
    groups = columns(checkpoints)
    titles = [f"{env} {t}" for env, ts in groups for t in ts]
    lines = ["| model | method | n | " + " | ".join(titles) + " |", "|---|---|---|" + "---|" * len(titles)]
    for row in rows:
        values = [_number(row.cells.get(t)) for _, ts in groups for t in ts]
        model, label = (text.replace("|", "\\|") for text in (row.model, row.label))  # a "|" would split the cell
        lines.append(f"| {model} | {label} | {_seeds(row, checkpoints)} | " + " | ".join(values) + " |")
    return lines


def markdown(checkpoints: list[Checkpoint], rows: list[Row], curves_name: str) -> str:
    lines = ["# Method comparison", "",
             "Success (%) per ALFWorld task type and overall; WebShop score and success (%) — the layout of the "
             "paper's Table 1/2. Seeds (runs with the same method, env and model) are averaged; n = runs averaged per "
             "environment, in column order.", ""]
    lines += [f"- {line}" for line in describe(checkpoints)]
    lines += ["", *markdown_table(checkpoints, rows)]
    lines += ["", f"Training reward per step (steps.jsonl), EMA-smoothed, one curve per method: `{curves_name}`",
              "", "Runs: " + ", ".join(f"`{p}`" for row in rows for p in row.runs), ""]
    return "\n".join(lines)


def html_table(checkpoints: list[Checkpoint], rows: list[Row]) -> str:
    """The table as one HTML <table> (environments as column groups)."""
    groups = columns(checkpoints)
    top = ('<tr><th class="text" rowspan="2">model</th><th class="text" rowspan="2">method</th>'
           '<th rowspan="2">n</th>' + "".join(f'<th colspan="{len(ts)}">{escape(env)}</th>' for env, ts in groups)
           + "</tr>")
    second = "<tr>" + "".join(f"<th>{escape(t)}</th>" for _, ts in groups for t in ts) + "</tr>"
    body = "".join(
        f'<tr><td class="text">{escape(row.model)}</td><td class="text">{escape(row.label)}</td>'
        f"<td>{_seeds(row, checkpoints)}</td>"
        + "".join(f"<td>{_number(row.cells.get(t))}</td>" for _, ts in groups for t in ts) + "</tr>"
        for row in rows)
    return f"<table>{top}{second}{body}</table>"


def html_page(checkpoints: list[Checkpoint], rows: list[Row], curves_png: bytes, notes: list[str]) -> str:
    items = "".join(f"<li>{escape(line)}</li>" for line in describe(checkpoints))
    note_html = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    image = base64.b64encode(curves_png).decode("ascii")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Method comparison</title>"
            f"<style>{CSS}</style></head>\n<body>\n<h1>Method comparison</h1>\n"
            "<p>Success (%) per ALFWorld task type and overall; WebShop score and success (%), in the layout of "
            "the paper's Table 1/2. Seeds are averaged; n = runs averaged per environment, in column order.</p>"
            f"<ul>{items}</ul>{html_table(checkpoints, rows)}\n"
            "<h2>Training reward</h2><p>Per step from steps.jsonl; thin line the mean over seeds, thick its EMA "
            "(the paper's Figure 3).</p>"
            f'{note_html}<img class="curves" alt="training curves" src="data:image/png;base64,{image}">\n'
            "</body></html>\n")


def write_comparison(specs: list[tuple[str | None, str]], out_md: str | Path,
                     smoothing: float = 0.9) -> tuple[Path, Path, Path]:
    """OUT.md, OUT.html and OUT.png (the curves) for the runs `specs` ((label or None, dir) pairs)."""
    out_md = Path(out_md)
    if out_md.suffix != ".md":
        raise ValueError(f"out={str(out_md)!r}: expected a path ending in .md (the .html and .png go next to it)")
    runs = read_runs(specs)
    if not runs:
        raise ValueError("no run directories given")
    checkpoints = shared_checkpoints(runs)
    rows = table(checkpoints)
    out_png = plot_curves({label: [r.path for r in runs if r.label == label] for label in {r.label for r in runs}},
                          out_md.with_suffix(".png"), smoothing)
    notes = [f"{r.path}: no eval.jsonl records" for r in runs if not r.evals]
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(markdown(checkpoints, rows, out_png.name), encoding="utf-8")
    out_html = out_md.with_suffix(".html")
    out_html.write_text(html_page(checkpoints, rows, out_png.read_bytes(), notes), encoding="utf-8")
    return out_md, out_html, out_png


def main(argv: list[str] | None = None) -> int:
    """`orsd-compare RUN [RUN ...] [--out FILE.md]`."""
    parser = argparse.ArgumentParser(
        prog="orsd-compare",
        description="Compare run directories: a markdown and an HTML table in the layout of the paper's "
                    "Table 1/2 (from eval.jsonl at the last step all runs share) and overlaid training reward "
                    "curves (Figure 3, from steps.jsonl).")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories; LABEL=DIR names the row "
                        "(default: the method of each run's config.yaml; same label = seeds, averaged)")
    parser.add_argument("--out", default="compare.md", help="the markdown file; .html and .png are written next "
                        "to it (default compare.md)")
    parser.add_argument("--smoothing", type=float, default=0.9, help="EMA weight of the curves (default 0.9)")
    args = parser.parse_args(argv)
    try:
        written = write_comparison([_compare_arg(value) for value in args.runs], args.out, args.smoothing)
    except (ValueError, TypeError) as error:
        print(f"orsd-compare: {error}", file=sys.stderr)
        return 2
    print("\n".join(str(path) for path in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
