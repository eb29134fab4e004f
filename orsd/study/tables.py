"""The study report's tables, from summary.json's content: first the registered primary analysis
(the endpoint per arm; each arm against the baseline with its tests and decision), then the secondary
figures, every one of them labelled secondary (exploratory)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Table:
    title: str
    intro: str
    header: list[str]
    rows: list[list[str]]


def number(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def p_value(value) -> str:
    if value is None:
        return "–"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def interval(point: dict | None, digits: int = 3) -> str:
    """"mean [low, high]" of an interval dict: a t interval (mean) or an rliable estimate (point),
    marked "*" when the estimate's bootstrap rests on fewer than 10 runs (not a reliable 95 %)."""
    centre = None if not point else point.get("mean", point.get("point"))
    if centre is None:
        return "–"
    if point.get("low") is None:
        return f"{centre:.{digits}f} (n = {point.get('n', point.get('runs', 0))}, no interval)"
    form = "+." if point.get("signed") else "."
    text = f"{centre:{form}{digits}f} [{point['low']:{form}{digits}f}, {point['high']:{form}{digits}f}]"
    return text + ("*" if point.get("reliable") is False else "")


def signed(point: dict | None) -> dict | None:
    return {**point, "signed": True} if point else point


def primary_tables(primary: dict) -> list[Table]:
    when = ("chosen after the runs (post hoc: this study was recorded before orsd-study registered endpoints); "
            "read its decisions as exploratory" if primary["post_hoc"]
            else f"registered in study.json on {primary['registered']}, before the first run")
    family = ", ".join(primary["family"]) or "none"
    endpoint = Table(
        f"Primary endpoint: {primary['endpoint']}",
        f"{primary['description']} (end step {primary['end_step'] if primary['end_step'] is not None else '–'}); "
        f"{when}. Per arm over its finished seeds: the mean with a Student-t 95 % interval, and the interquartile "
        f"mean (IQM) with rliable's stratified-bootstrap 95 % interval over runs (strata named per arm; * marks an "
        f"interval from fewer than 10 runs, which a bootstrap makes too narrow: read the t interval).",
        ["arm", "role", "seeds", "per seed", "mean [t 95 %]", "IQM [stratified bootstrap 95 %]", "strata"],
        [[label, arm["role"], str(arm["n"]), ", ".join(number(v) for v in arm["per_seed"].values()) or "–",
          interval(arm["mean"]), interval(arm["iqm"]), arm["strata"]] for label, arm in primary["arms"].items()])
    comparisons = Table(
        f"Primary comparisons: each arm − {primary['baseline']}, paired by seed",
        f"The paired mean difference with its Student-t 95 % interval and two-sided p-value; p Holm-adjusted over "
        f"the primary arms ({family}; α = {primary['alpha']}); a paired TOST against ±{primary['margin']} "
        f"(statsmodels ttost_paired); the minimum detectable difference (MDD) at {primary['power']:.0%} power for "
        f"the observed paired SD and seed count at α / {max(1, len(primary['family']))}; rliable's probability of "
        f"improvement P(arm > baseline) with its stratified-bootstrap interval (* as above). Decision: better / worse only when "
        f"the (Holm-adjusted) test rejects, equivalent only when the TOST passes, otherwise not decided. "
        f"Exploratory arms: uncorrected p, outside the family.",
        ["arm", "role", "seeds", "difference [t 95 %]", "p", "p (Holm)", f"TOST ±{primary['margin']} p", "MDD",
         "P(improvement)", "decision"],
        [[label, c["role"], str(c["n"]), interval(signed(c["difference"])), p_value(c["difference"].get("p_value")),
          p_value(c["p_holm"]), p_value(c["tost"].get("p_value")), number(c["mdd"]),
          interval(c["probability_of_improvement"], 2), c["decision"]]
         for label, c in primary["comparisons"].items()])
    return [endpoint, comparisons] if comparisons.rows else [endpoint]


SECONDARY = "Secondary (exploratory)"


def secondary_tables(summary: dict, window: int) -> list[Table]:
    arms, baseline = summary["arms"], summary["baseline"]
    end = summary["end_step"] if summary["end_step"] is not None else "–"
    learning = Table(
        f"{SECONDARY}: training reward, mean of the last {window} steps minus the first {window}",
        "Per seed, then over the finished seeds: the mean, its standard error (SE), how many SEs it lies from 0 and "
        "its Student-t 95 % interval. Which of the training tasks fall in each window moves it; with fewer than "
        "2·window steps the windows overlap.",
        ["arm", "method", "seeds", "per seed", "mean", "SE", "mean / SE", "mean [t 95 %]"],
        [[label, str(arm["method"]), str(len(arm["learning"]["per_seed"])),
          ", ".join(number(v) for v in arm["learning"]["per_seed"].values()), number(arm["learning"]["mean"]),
          number(arm["learning"]["se"]), number(arm["learning"]["n_se"], 1), interval(arm["learning"])]
         for label, arm in arms.items()])
    paired = Table(
        f"{SECONDARY}: against {baseline}, paired by seed",
        "Per seed arm − baseline, the mean over seeds with its Student-t 95 % interval (uncorrected); and per seed "
        "how many steps from the first the arm sampled exactly the baseline's trajectories (groups.jsonl: same "
        "tasks, actions and rewards).",
        ["arm", "Δ learning", "Δ held-out success at the end", "Δ held-out score at the end", "seeds",
         "identical steps per seed"],
        [[label, interval(signed(arm["vs_baseline"]["learning"])), interval(signed(arm["vs_baseline"]["heldout_end"])),
          interval(signed(arm["vs_baseline"]["heldout_score_end"])), str(arm["vs_baseline"]["learning"]["n"]),
          ", ".join(f"{seed}: {'–' if k is None else k}"
                    for seed, k in arm["vs_baseline"]["identical_steps"].items()) or "–"]
         for label, arm in arms.items() if "vs_baseline" in arm])
    held = [Table(
        f"{SECONDARY}: held-out {what} at step 0 and at step {end}",
        f"From eval.jsonl (step 0: the run's own evaluation or its seed's shared start evaluation; the end: the last "
        f"step every run evaluated at), per seed start → end; the means over seeds and end − start paired by seed, "
        f"with Student-t 95 % intervals.{extra}",
        ["arm", "episodes per seed", "per seed (start → end)", "start", "end", "end − start"],
        [[label, number(arm[key]["episodes"], 0) if arm[key]["episodes"] is not None else "–",
          ", ".join(f"{number(v['start'])} → {number(v['end'])}" for v in arm[key]["per_seed"].values()),
          interval(arm[key]["start"]), interval(arm[key]["end"]), interval(signed(arm[key]["end_minus_start"]))]
         for label, arm in arms.items()])
        for key, what, extra in (("heldout_score", "score", " The score is the env's partial credit per episode "
                                  "(the shop's attribute, option and price match of what was bought; 0 without a "
                                  "purchase)."), ("heldout", "success", ""))]
    shaping = Table(
        f"{SECONDARY}: shaping magnitude |α·e·Δ| / |A|",
        "How far the rubric moves a token's advantage against the advantage itself: the mean over steps and seeds "
        "of the shaping_ratio metrics of steps.jsonl, or where a run has none, α · (fraction of tokens with e = 1) "
        "· mean |Δ| / mean |A| from each step's metrics (0 for a method without a rubric).",
        ["arm", "source", "value"],
        [[label, arm["shaping"]["source"], ", ".join(f"{k} {number(v, 4)}" for k, v in arm["shaping"].items()
                                                     if k not in ("source", "steps"))]
         for label, arm in arms.items()])
    return [learning, *([paired] if paired.rows else []), *held, shaping]


def tables(summary: dict, window: int) -> list[Table]:
    return [*primary_tables(summary["primary"]), *secondary_tables(summary, window)]
