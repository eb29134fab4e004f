"""The HTML of report.html: one self-contained page (inline CSS, the curves embedded as base64, no
script, no network). Every piece of run text goes through html.escape: transcripts hold <think> and
<action> tags that must show as text, never as markup."""

from __future__ import annotations

import json
import math
import os
from html import escape
from pathlib import Path
from urllib.parse import quote

#: the compact per-step table: (steps.jsonl key, column title)
STEP_COLUMNS = (("step", "step"), ("reward_mean", "reward"), ("success_rate", "success"),
                ("score_mean", "score"), ("groups_rewards_differ", "groups: rewards differ"),
                ("groups_with_bundle", "groups: bundle"), ("rho_selected_mean", "ρ of B*"),
                ("delta_abs_mean", "|Δ| mean"), ("valid_token_fraction", "e = 1 tokens"),
                ("loss", "loss"), ("kl", "KL"), ("clip_fraction", "clipped"), ("entropy", "entropy"),
                ("grad_norm", "grad norm"), ("replay_rollout_gap", "replay gap"))
NEGATIVE_RGB = (214, 39, 40)  # Δ < 0: the rubric made the token less likely
POSITIVE_RGB = (31, 119, 180)  # Δ > 0: the rubric made the token more likely

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 1.8em; }
h3 { font-size: 1.1em; margin-bottom: .3em; }
table { border-collapse: collapse; margin: .5em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; vertical-align: top; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
.scroll { max-height: 28em; overflow: auto; display: inline-block; }
pre, .transcript { background: #f8f8f8; border: 1px solid #e4e4e4; padding: .5em; overflow-x: auto;
                   white-space: pre-wrap; font: 12px/1.4 ui-monospace, Menlo, Consolas, monospace; }
.note { color: #a04000; } .muted { color: #777; }
.group { border: 1px solid #ddd; border-radius: 6px; padding: .4em 1em 1em; margin: 1em 0; }
tr.bundle.chosen { background: #eaf6ea; } .mark { font-weight: bold; color: #1e7b1e; white-space: nowrap; }
ol.criteria { margin: 0; padding-left: 1.4em; text-align: left; }
.heatmap { font: 12px/1.9 ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; word-break: break-all;
           border: 1px solid #e4e4e4; padding: .5em; margin: .3em 0; }
.tok { border-radius: 2px; } .tok.invalid { background: #d5d5d5; color: #777; }
.tok.strong { color: #fff; } .turn-label { color: #777; font-size: 11px; }
img.curves { max-width: 100%; border: 1px solid #eee; }
.role { font-weight: bold; color: #555; }
"""


def render(*, title: str, out_dir: Path, run_dir: Path, curves_png: str, runs: list, notes: list[str],
           smoothing: float, config_text: str | None, environment_text: str | None, summary: dict | None,
           steps: list[dict], evals: list[dict], groups: list[dict]) -> str:
    """Size: the page's sections as keywords, each read by report/cli.py from the run directory."""
    sections = [
        section("summary", "Summary", summary_html(run_dir, summary, steps, runs)),
        section("config", "Config and environment",
                file_html("resolved config", "config.yaml", config_text, run_dir, out_dir)
                + file_html("environment", "environment.json", _pretty_json(environment_text), run_dir, out_dir)),
        section("curves", "Training curves", curves_html(curves_png, notes, smoothing, run_dir, out_dir)),
        section("eval", "Evaluation", eval_table(evals)),
        section("steps", "Per-step metrics", steps_table(steps)),
        section("groups", "Groups", groups_html(groups)),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n<h1>{escape(title)}</h1>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>\n{body}\n</section>'


def fmt(value) -> str:
    """A table cell: numbers to 4 significant digits, None as a dash, everything escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else escape(str(value))
    return escape(str(value))


def _link(run_dir: Path, name: str, out_dir: Path) -> str:
    return quote(Path(os.path.relpath(run_dir / name, out_dir)).as_posix())


def _pretty_json(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except json.JSONDecodeError:
        return text


def summary_html(run_dir: Path, summary: dict | None, steps: list[dict], runs: list) -> str:
    parts = [f'<p>run directory: <code>{escape(str(run_dir))}</code>; {len(steps)} steps recorded'
             + (f", last step {fmt(steps[-1].get('step'))}" if steps else "") + "</p>"]
    if summary:
        rows = "".join(f'<tr><th class="text">{escape(str(k))}</th><td class="text">{_value_html(v)}</td></tr>'
                       for k, v in summary.items())
        parts.append(f"<details><summary>summary.jsonl (last record)</summary><table>{rows}</table></details>")
    else:
        parts.append('<p class="muted">no summary.jsonl yet (the run has not finished).</p>')
    if len(runs) > 1:
        rows = "".join(f'<tr><td class="text">{escape(label)}</td><td class="text">{escape(env or "–")}</td>'
                       f'<td class="text"><code>{escape(str(path))}</code></td></tr>' for label, env, path in runs)
        parts.append('<p>runs on the curves:</p><table><tr><th class="text">label</th><th class="text">env</th>'
                     f'<th class="text">run directory</th></tr>{rows}</table>')
    return "\n".join(parts)


def _value_html(value) -> str:
    if isinstance(value, (dict, list)):
        return f"<code>{escape(json.dumps(value, ensure_ascii=False))}</code>"
    return fmt(value)


def file_html(what: str, name: str, text: str | None, run_dir: Path, out_dir: Path) -> str:
    if text is None:
        return f'<p class="muted">{escape(name)} not found.</p>'
    return (f'<details><summary>{escape(what)} (<a href="{_link(run_dir, name, out_dir)}">{escape(name)}</a>)'
            f"</summary><pre>{escape(text)}</pre></details>")


def curves_html(curves_png: str, notes: list[str], smoothing: float, run_dir: Path, out_dir: Path) -> str:
    note = "".join(f'<p class="note">{escape(n)}</p>' for n in notes)
    return (f'<p>Thin lines: per-step mean over the runs of a label; thick lines: their debiased exponential '
            f'moving average (weight {smoothing:g}); band: min–max of the runs\' own averages when a label has '
            f'several runs (seeds). File: <a href="{_link(run_dir, "curves.png", out_dir)}">curves.png</a>.</p>'
            f'{note}<img class="curves" alt="training curves" src="data:image/png;base64,{curves_png}">')


def eval_table(evals: list[dict]) -> str:
    if not evals:
        return '<p class="muted">no evaluation recorded (no eval.jsonl).</p>'
    kinds = sorted({str(k) for e in evals for k in (e.get("per_kind") or {})})
    head = "".join(f"<th>{escape(h)}</th>" for h in ("step", "split", "env", "episodes", "success", "score"))
    head += "".join(f"<th>{escape(k)}</th>" for k in kinds)
    rows = []
    for e in sorted(evals, key=lambda e: (e.get("step") or 0, str(e.get("split")))):
        per_kind = {str(k): v for k, v in (e.get("per_kind") or {}).items()}
        cells = [fmt(e.get(k)) for k in ("step", "split", "env", "num_episodes", "success_rate", "score_mean")]
        for kind in kinds:
            value = per_kind.get(kind)
            cells.append("–" if not isinstance(value, dict) else
                         f'{fmt(value.get("success_rate"))} '
                         f'<span class="muted">(n={fmt(value.get("episodes"))})</span>')
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f'<p>Per task kind: success rate (episodes).</p><div class="scroll"><table><tr>{head}</tr>'
            + "".join(rows) + "</table></div>")


def steps_table(steps: list[dict]) -> str:
    if not steps:
        return '<p class="note">steps.jsonl has no steps yet.</p>'
    columns = [(k, t) for k, t in STEP_COLUMNS if any(s.get(k) is not None for s in steps)]
    head = "".join(f"<th>{escape(t)}</th>" for _, t in columns) + "<th>seconds</th>"
    rows = []
    for s in steps:
        seconds = s.get("seconds") if isinstance(s.get("seconds"), dict) else {}
        total = sum(v for v in seconds.values() if isinstance(v, (int, float)))
        title = escape(", ".join(f"{k} {fmt(v)}" for k, v in seconds.items()), quote=True)
        rows.append("<tr>" + "".join(f"<td>{fmt(s.get(k))}</td>" for k, _ in columns)
                    + f'<td title="{title}">{fmt(float(total)) if seconds else "–"}</td></tr>')
    return (f'<p>Seconds: the step\'s total; hover for its stages.</p><div class="scroll"><table><tr>{head}</tr>'
            + "".join(rows) + "</table></div>")


def groups_html(groups: list[dict]) -> str:
    if not groups:
        return '<p class="muted">groups.jsonl has no groups yet.</p>'
    with_bundle = sum(g.get("selected") is not None for g in groups)
    intro = (f"<p>{len(groups)} groups, those with a selected bundle first, latest steps first.</p>" if with_bundle
             else '<p class="muted">no group had a selected bundle (a GRPO run, or no candidate bundle with a '
                  "finite ρ); showing the latest groups.</p>")
    return intro + "\n".join(group_html(g) for g in groups)


def group_html(group: dict) -> str:
    task = group.get("task") or {}
    step, number = group.get("step"), group.get("group")
    header = (f'<h3>step {fmt(step)}, group {fmt(number)}: task {fmt(task.get("id"))} '
              f'<span class="muted">({fmt(task.get("kind"))}, {fmt(task.get("split"))})</span></h3>')
    parts = [f'<div class="group" id="group-{fmt(step)}-{fmt(number)}">', header,
             f'<div class="transcript">{escape(str(task.get("description") or ""))}</div>',
             f'<p>selection: {fmt(group.get("reason") or "–")}</p>',
             trajectories_table(group), bundles_table(group)]
    errors, texts = group.get("bundle_errors") or [], group.get("bundle_texts") or []
    if errors or texts:
        items = "".join(f"<li>{escape(str(e))}</li>" for e in errors)
        parts.append(f"<details><summary>raw bundle generations ({len(texts)}; {len(errors)} discarded)</summary>"
                     f"<ul>{items}</ul>" + "".join(f"<pre>{escape(str(t))}</pre>" for t in texts) + "</details>")
    example = group.get("delta_example")
    if example:
        trajectory = example.get("trajectory")
        control = (group.get("control") or {}).get("kind")  # rubric.delta_baseline: against a control context
        against = f"log π with the {escape(control)} control" if control else "log π without"
        parts.append(f"<p>Per-token Δ of trajectory {fmt(trajectory)}'s responses "
                     f"(Δ = log π with B* − {against}):</p>" + delta_heatmap(example))
    elif group.get("selected") is not None:
        parts.append('<p class="muted">no Δ example stored for this group.</p>')
    parts.append(transcripts_html(group))
    events = group.get("verifier_events") or []
    if events:
        parts.append(f"<details><summary>{len(events)} verifier events</summary>"
                     f"<pre>{escape(json.dumps(events, indent=1, ensure_ascii=False))}</pre></details>")
    parts.append("</div>")
    return "\n".join(parts)


def trajectories_table(group: dict) -> str:
    rewards = group.get("rewards") or []
    advantages = group.get("advantages") or []
    transcripts = group.get("transcripts") or []
    selected = group.get("selected")
    satisfaction = group.get("satisfaction") or []
    chosen = satisfaction[selected] if selected is not None and selected < len(satisfaction) else []
    rows = []
    for i in range(max(len(rewards), len(transcripts))):
        t = transcripts[i] if i < len(transcripts) else {}
        cells = [fmt(i), fmt(_at(rewards, i)), fmt(_at(advantages, i)), fmt(t.get("won")), fmt(t.get("score")),
                 fmt(_at(chosen, i))]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells)
                    + f'<td class="text">{fmt(t.get("error") or "")}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("trajectory", "reward", "advantage", "won", "score",
                                             "satisfaction under B*")) + '<th class="text">error</th>'
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _at(values: list, i: int):
    return values[i] if i < len(values) else None


def bundles_table(group: dict) -> str:
    bundles = group.get("bundles") or []
    if not bundles:
        return '<p class="muted">no candidate bundle parsed for this group.</p>'
    rho, scores = group.get("rho") or [], group.get("scores") or []
    satisfaction = group.get("satisfaction") or []
    rows = []
    for b, criteria in enumerate(bundles):
        chosen = b == group.get("selected")
        mark = '<span class="mark">✔ chosen (B*)</span>' if chosen else ""
        items = "".join(f"<li>{escape(str(c))}</li>" for c in criteria)
        values = " ".join(fmt(v) for v in _at(satisfaction, b) or [])
        matrix = score_matrix(_at(scores, b))
        rows.append(f'<tr class="bundle{" chosen" if chosen else ""}"><td>{b}</td><td>{fmt(_at(rho, b))}</td>'
                    f'<td class="text">{mark}</td><td class="text"><ol class="criteria">{items}</ol>{matrix}</td>'
                    f"<td>{values or '–'}</td></tr>")
    head = ("<tr><th>bundle</th><th>ρ</th><th class=\"text\"></th><th class=\"text\">criteria</th>"
            "<th>satisfaction per trajectory</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def score_matrix(matrix) -> str:
    if not matrix:
        return ""
    width = max(len(row) for row in matrix)
    head = "<tr><th>traj.</th>" + "".join(f"<th>c{k + 1}</th>" for k in range(width)) + "</tr>"
    rows = "".join(f"<tr><td>{i}</td>" + "".join(f"<td>{fmt(v)}</td>" for v in row) + "</tr>"
                   for i, row in enumerate(matrix))
    return f"<details><summary>verifier scores (– = unscored)</summary><table>{head}{rows}</table></details>"


def transcripts_html(group: dict) -> str:
    transcripts = group.get("transcripts") or []
    if not transcripts:
        return ""
    rewards = group.get("rewards") or []
    parts = [f"<details><summary>transcripts ({len(transcripts)})</summary>"]
    for i, t in enumerate(transcripts):
        observations, actions = t.get("observations") or [], t.get("actions") or []
        responses = t.get("responses") or []
        lines = [f'<span class="role">observation:</span> {escape(str(observations[0]))}'] if observations else []
        for turn in range(max(len(actions), len(responses))):
            lines.append(f'<span class="role">response {turn}:</span> {escape(str(_at(responses, turn) or ""))}')
            action = _at(actions, turn)
            shown = escape(str(action)) if action is not None else "(invalid)"
            lines.append(f'<span class="role">action:</span> {shown}')
            if turn + 1 < len(observations):
                lines.append(f'<span class="role">observation:</span> {escape(str(observations[turn + 1]))}')
        parts.append(f"<details><summary>trajectory {i}: reward {fmt(_at(rewards, i))}, won {fmt(t.get('won'))}"
                     f'</summary><div class="transcript">{"<br>".join(lines)}</div></details>')
    parts.append("</details>")
    return "\n".join(parts)


def delta_colour(delta: float, scale: float) -> tuple[str, float]:
    """Background of a token: red for Δ < 0, blue for Δ > 0, opacity |Δ| / scale (the example's max |Δ|)."""
    alpha = min(1.0, abs(delta) / scale) if scale > 0 else 0.0
    r, g, b = NEGATIVE_RGB if delta < 0 else POSITIVE_RGB
    return f"rgba({r},{g},{b},{alpha:.3f})", alpha


def _token_span(token: str, delta, valid: bool, scale: float) -> str:
    text = escape(token)
    if delta is None or not isinstance(delta, (int, float)) or not math.isfinite(delta):
        return f'<span class="tok invalid" title="Δ = n/a (not finite; e = 0)">{text}</span>'
    if not valid:
        return f'<span class="tok invalid" title="Δ = {delta:+.4g} (not valid: e = 0)">{text}</span>'
    colour, alpha = delta_colour(delta, scale)
    strong = " strong" if alpha > 0.6 else ""
    return f'<span class="tok{strong}" style="background:{colour}" title="Δ = {delta:+.4g}">{text}</span>'


def delta_heatmap(example: dict) -> str:
    """One span per response token, coloured by Δ (scale: max |Δ| over the example's valid tokens)."""
    turns = example.get("turns") or []
    magnitudes = [abs(d) for turn in turns for d, ok in zip(turn.get("delta") or [], turn.get("valid") or [])
                  if ok and isinstance(d, (int, float)) and math.isfinite(d)]
    scale = max(magnitudes, default=0.0)
    legend = ('<p class="muted">colour scale: '
              + _token_span(f"−{scale:.3g}", -scale, True, scale) + " "
              + _token_span(f"−{scale / 2:.3g}", -scale / 2, True, scale) + " "
              + _token_span("0", 0.0, True, scale) + " "
              + _token_span(f"+{scale / 2:.3g}", scale / 2, True, scale) + " "
              + _token_span(f"+{scale:.3g}", scale, True, scale) + " "
              + '<span class="tok invalid">not valid (e = 0)</span></p>')
    blocks = []
    for number, turn in enumerate(turns):
        tokens = turn.get("tokens") or []
        deltas, valid = turn.get("delta") or [], turn.get("valid") or []
        spans = "".join(_token_span(str(token), _at(deltas, i), bool(_at(valid, i)), scale)
                        for i, token in enumerate(tokens))
        blocks.append(f'<div class="heatmap"><span class="turn-label">turn {number}</span>\n{spans}</div>')
    return legend + "".join(blocks)
