"""`orsd-report RUN_DIR [--compare OTHER_RUN ...]`: curves.png and a self-contained report.html for a
run directory (`write_report`, which orsd-train also calls when a run ends, and the console script's
`main`). Everything here only reads the run directory (config.yaml, environment.json, steps.jsonl,
groups.jsonl, eval.jsonl, summary.jsonl); it never changes what the trainer wrote.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from pathlib import Path

from . import html as report_html
from .curves import _draw, _normalise_runs, curve_data
from .records import _existing_dir, pick_groups, read_jsonl, run_info


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
