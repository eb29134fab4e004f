"""Every reply's per-token log-probs in its plain context and with each kind's rubric spliced in,
by training's own paired replay (orsd.train.replay.paired_replay: `ops.splice_rubric` at the
record's slot, the same prefix-shared passes, the same temperature), so the Δ measured here is the
Δ a training step would compute for that record and bundle (tests/probe/test_scoring.py).

The plain pass runs once per task and every kind's rubric pass continues from the keys/values it
kept (`replay.reuse_plain`), as training's single rubric pass does; paired replay hands a kept cache
to one rubric pass only (it releases it for memory), so it is handed back before each kind. Only the
rubric pass reads the cache (prefill.continue_from leaves it as it was), which the test above checks
by comparing every kind with a fresh paired replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from orsd.train.replay import ReplaySpec, paired_replay, plain_replay

from .states import Reply


@dataclass
class Scores:
    """Per reply: the response tokens' log-probs (temperature-scaled, as replay computes them) in
    the plain context and under each kind (None: that kind's rubric was not spliced for it)."""

    plain: list[np.ndarray] = field(default_factory=list)
    kinds: dict[str, list[np.ndarray | None]] = field(default_factory=dict)

    def lp(self, context: str, reply: int) -> np.ndarray | None:
        return self.plain[reply] if context == "plain" else self.kinds[context][reply]


def score_task(model, replies: list[Reply], rubric_ids: dict[str, list[int] | None], config) -> Scores:
    """One task's replies under the plain context and every kind in `rubric_ids` (kind -> ids)."""
    r, rp = config.rollout, config.replay
    records = [reply.record for reply in replies]
    reuse = rp.reuse_plain and rp.share_prefix
    spec = ReplaySpec(r.temperature, rp.token_budget, rp.fused, None, rp.share_prefix, reuse_plain=reuse)
    plain = plain_replay(model, records, spec, keep_prefixes=reuse)
    kept = plain.prefixes
    bounds = plain.packed.cu_seqlens.tolist()
    spans = [(bounds[s] + len(rec.context_ids), bounds[s + 1]) for s, rec in enumerate(records)]
    out = Scores(plain=[plain.old_logprobs[a:b].numpy().astype(np.float64) for a, b in spans])
    for kind, ids in rubric_ids.items():
        plain.prefixes = kept  # paired_replay releases it after its rubric pass
        spliced = [ids if rec.takes(ids, r.max_context_tokens) else None for rec in records]
        result = paired_replay(model, records, [0.0] * len(records), spliced, config.rubric.alpha, spec, plain=plain)
        column = []
        for (a, b), ids_of in zip(spans, spliced):
            valid = result.valid[a:b]
            # Δ = lp_with − lp_plain where valid (e = 1); a token without a finite Δ has no lp_with
            lp = (result.old_logprobs[a:b] + result.delta[a:b]).numpy().astype(np.float64)
            column.append(None if ids_of is None else np.where(valid.numpy(), lp, np.nan))
        out.kinds[kind] = column
    plain.prefixes = None
    return out


def score_all(model, replies: list[Reply], ids_per_task: list[dict[str, list[int] | None]], config,
              progress=None) -> Scores:
    """score_task for every task's replies, one task at a time (the kept keys/values of every
    task's records at once would not fit in memory)."""
    out = Scores(plain=[None] * len(replies), kinds={k: [None] * len(replies) for k in ids_per_task[0]})
    for task, ids in enumerate(ids_per_task):
        members = [i for i, reply in enumerate(replies) if reply.task == task]
        if not members:
            continue
        scored = score_task(model, [replies[i] for i in members], ids, config)
        for j, i in enumerate(members):
            out.plain[i] = scored.plain[j]
            for kind, column in scored.kinds.items():
                out.kinds[kind][i] = column[j]
        if progress is not None:
            progress()
    return out
