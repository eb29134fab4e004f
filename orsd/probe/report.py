"""probe.md (the tables) and probe.html (per-token Δ heat maps, drawn as report.html draws Δ)."""

from __future__ import annotations

import math
from html import escape

import numpy as np

from orsd.report import html as run_html

from .kinds import KINDS
from .stats import SCORES, TOKEN_CLASSES
from .summary import token_values


PAGES = ("search", "results", "item", "detail")


def page_order(page: str) -> tuple:
    return (PAGES.index(page) if page in PAGES else len(PAGES), page)


def num(value, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def with_ci(figure: dict | None, digits: int = 2) -> str:
    if not figure or figure.get("value") is None:
        return "–"
    ci = figure.get("ci")
    return num(figure["value"], digits) + (f" [{num(ci[0], digits)}, {num(ci[1], digits)}]" if ci else "")


def markdown(result: dict) -> str:
    c, p = result["counts"], result["prediction"]
    pages = sorted(c["states_by_page"], key=page_order)
    lines = [f"# Δ probe of `{result['checkpoint']}`", "",
             f"Command: `{result['command']}`  ", f"Wall time: {result['seconds']['total']:.0f} s on "
             f"{result['machine']['cpu']} ({result['machine']['threads']} threads, {result['precision']})  ",
             f"Tasks: {len(result['tasks'])} of split `{result['split']}`; {c['states']} expert states "
             f"({', '.join(f'{k} {v}' for k, v in sorted(c['states_by_page'].items(), key=lambda kv: page_order(kv[0])))}), {c['expert_replies']} "
             f"expert and {c['wrong_replies']} wrong replies; {c['policy_replies']} policy turns, "
             f"{c['policy_matching_expert']} of them the expert's command.", "",
             f"Prediction (issue 57): (a) oracle AUC clearly above 0.5: **{'holds' if p['a_oracle_above_half'] else 'fails'}** "
             f"({with_ci(p['oracle_auc'])}); (b) misleading at or below 0.5: "
             f"**{'holds' if p['b_misleading_not_above_half'] else 'fails'}** ({with_ci(p['misleading_auc'])}).", "",
             "## Expert vs wrong replies at the same state", "",
             "Score of a reply: the sum over its tokens of lp(context) − lp(baseline). AUC: P(score_expert > "
             "score_wrong) at a state, ties half, mean over states, 95 % bootstrap interval over states. "
             "Policy AUC: the policy's own turns, expert-matching against the others.", "",
             "| score | paired AUC | AUC per token | mean expert | mean wrong | mean difference | r with plain log π "
             "| policy AUC |", "|---" * 8 + "|"]
    for name, _, _ in SCORES:
        f = result["scores"][name]
        e = f["expert_vs_wrong"]
        lines.append(f"| {name} | {with_ci(e['auc'])} | {with_ci(f['auc_per_token'])} | {with_ci(e['expert_mean'])} "
                     f"| {with_ci(e['wrong_mean'])} | {with_ci(e['difference_mean'])} | "
                     f"{with_ci(f.get('corr_with_plain'))} | {with_ci(f['policy_auc'])} |")
    lines += ["", "## Paired AUC by page", "", "| score | " + " | ".join(f"{q} ({c['states_by_page'][q]} states)"
                                                                         for q in pages) + " |",
              "|---" * (1 + len(pages)) + "|"]
    for name, _, _ in SCORES:
        by_page = result["scores"][name]["auc_by_page"]
        lines.append(f"| {name} | " + " | ".join(with_ci(by_page.get(q)) for q in pages) + " |")
    lines += ["", "## Δ per token class (expert and wrong replies; policy turns' first token last)", "",
              "Mean over replies of the reply's mean over that class's tokens; scaffold: tokens overlapping "
              "`<think>`, `</think>`, `<action>`, `</action>`; eos: the end-of-turn token.", "",
              "| score | " + " | ".join(TOKEN_CLASSES) + " | policy first token |", "|---" * (len(TOKEN_CLASSES) + 2) + "|"]
    for name, _, baseline in SCORES:
        t = result["scores"][name].get("tokens")
        if t is not None:
            lines.append(f"| {name} | " + " | ".join(with_ci(t["scripted"][w], 3) for w in TOKEN_CLASSES)
                         + f" | {with_ci(t['policy']['first'], 3)} |")
    lines += ["", "## Tasks", "", "| task | B* | ρ of the candidates | why no B* |", "|---|---|---|---|"]
    for task in result["tasks"]:
        a = task["alignment"] or {}
        lines.append(f"| {task['id']} | {'index ' + str(a['index']) if a.get('index') is not None else '–'} | "
                     f"{', '.join(num(r) for r in a.get('rho') or []) or '–'} | {task['notes'].get('selected', '')} |")
    return "\n".join(lines) + "\n"


def heatmap_page(result: dict, states, replies, scores, tokens: list[list[str]], count: int) -> str:
    """Per shown state and kind, one line per reply (the expert's first) coloured by Δ_kind per token;
    one colour scale per state (its largest |Δ| under any kind), so kinds compare at a glance."""
    shown = pick_states(states, count)
    blocks = []
    for s in shown:
        state = states[s]
        rows = {k: [(j, token_values(scores, j, k, "plain")) for j in state.replies] for k in KINDS}
        finite = [abs(v) for k in rows for _, d in rows[k] if d is not None for v in d if np.isfinite(v)]
        scale = max(finite, default=0.0)
        parts = [f"<h3>task {escape(result['tasks'][state.task]['id'])}, turn {state.turn} ({escape(state.page)} "
                 f"page): expert <code>{escape(state.expert)}</code></h3>",
                 f'<p class="muted">colour scale ±{scale:.3g} nats (red: the rubric made the token less likely)</p>']
        for kind in KINDS:
            lines = []
            for j, delta in rows[kind]:
                label = f"{replies[j].role}: {replies[j].action}"
                if delta is None:
                    lines.append(f'<div class="heatmap"><span class="turn-label">{escape(label)}</span> '
                                 f'<span class="muted">(no {escape(kind)} rubric for this task)</span></div>')
                    continue
                spans = "".join(run_html._token_span(tok, float(d), bool(np.isfinite(d)), scale)
                                for tok, d in zip(tokens[j], delta))
                lines.append(f'<div class="heatmap"><span class="turn-label">{escape(label)}: ΣΔ = '
                             f"{np.nansum(delta):+.2f}</span>\n{spans}</div>")
            parts.append(f"<details open><summary>{escape(kind)}</summary>{''.join(lines)}</details>")
        blocks.append('<div class="group">' + "\n".join(parts) + "</div>")
    title = f"Δ probe: {result['checkpoint']}"
    body = (run_html.section("heatmaps", "Per-token Δ = log π(with the rubric) − log π(plain)", "\n".join(blocks))
            + run_html.section("tables", "Tables", f"<pre>{escape(markdown(result))}</pre>"))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{run_html.CSS}</style></head>\n<body>\n<h1>{escape(title)}</h1>\n{body}\n</body></html>\n")


def pick_states(states, count: int) -> list[int]:
    """Up to `count` states with wrong replies, taking the pages in turn (search, results, item, ...)."""
    by_page: dict[str, list[int]] = {}
    for i, s in enumerate(states):
        if len(s.replies) > 1:
            by_page.setdefault(s.page, []).append(i)
    out, queues = [], [by_page[p] for p in sorted(by_page, key=page_order)]
    while len(out) < count and any(queues):
        for queue in queues:
            if queue and len(out) < count:
                out.append(queue.pop(0))
    return sorted(out)
