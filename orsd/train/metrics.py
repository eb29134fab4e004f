"""Step metrics that carry how ranks combine them, declared where each metric is made.

A stage returns `{name: Metric(value, reduce)}`; `values()` gives the plain numbers for
steps.jsonl, `combine()` merges the dicts of all data-parallel ranks:
  sum     counts (tokens, bundles, errors)
  tokens  per-token statistics, weighted by each rank's `response_tokens`
  mean    per-episode and per-group rates (every rank has as many groups and episodes)
  same    equal on every rank (step, lr, grad norm after the all-reduce)
  counters  the verifier's accounting: counts summed, latency percentiles the worst rank's
"""

from __future__ import annotations

from typing import Any, NamedTuple

REDUCTIONS = ("sum", "tokens", "mean", "same", "counters")


class Metric(NamedTuple):
    value: Any
    reduce: str


def tagged(reduce: str, **values: Any) -> dict[str, Metric]:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce={reduce!r}: expected one of {REDUCTIONS}")
    return {k: Metric(v, reduce) for k, v in values.items()}


def values(metrics: dict[str, Metric]) -> dict[str, Any]:
    return {k: m.value for k, m in metrics.items()}


def combine(per_rank: list[dict[str, Metric]]) -> dict[str, Any]:
    """One step's metrics over all ranks (plain values), each by its declared reduction."""
    out = {}
    weights = [(m["response_tokens"].value if "response_tokens" in m else 0) or 0 for m in per_rank]
    for key, first in per_rank[0].items():
        present = [(m[key].value, w) for m, w in zip(per_rank, weights) if key in m and m[key].value is not None]
        if first.reduce == "same" or not present:
            out[key] = first.value
        elif first.reduce == "counters":
            out[key] = _combine_counters([v for v, _ in present])
        elif first.reduce == "sum":
            out[key] = sum(v for v, _ in present)
        elif first.reduce == "tokens":
            total = sum(w for _, w in present)
            out[key] = sum(v * w for v, w in present) / total if total else 0.0
        else:
            out[key] = sum(v for v, _ in present) / len(present)
    return out


def _combine_counters(dicts: list[dict]) -> dict:
    out: dict = {}
    for key in dicts[0]:
        values_ = [d.get(key) for d in dicts]
        if isinstance(values_[0], dict):
            out[key] = {}
            for d in values_:
                for reason, count in (d or {}).items():
                    out[key][reason] = out[key].get(reason, 0) + count
        elif "latency" in key:  # percentiles cannot be merged exactly: the worst rank's
            finite = [v for v in values_ if v is not None]
            out[key] = max(finite) if finite else None
        else:
            out[key] = sum(v or 0 for v in values_)
    return out
