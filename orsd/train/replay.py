"""Paired replay (paper §3.3): the response tokens' log-probs in their own contexts (the plain
pass, π_old) and with the rubric B* spliced in at each turn's slot (the rubric pass); their gap Δ
shapes the token advantage (Eq. 8–9, train/shaping.py). The forwards are forward.py's; the packing
and the splice packing.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from orsd.engines import frozen, prefill

from . import shaping
from .forward import replay_logprobs
from .packing import Packed, pack, splice_privileged
from .records import TurnRecord


@dataclass(frozen=True)
class ReplaySpec:
    """How the no-grad passes over a packing run: paired replay's two passes, the teacher's and, in
    the trainer, the reference's. `from_config` reads them from a run's config."""

    temperature: float  # rollout.temperature: log-probs of logits / T, as sampled
    token_budget: int  # replay.token_budget: tokens per forward
    fused: bool = True  # replay.fused: the native fused log-prob op where it serves
    lockstep: Callable[[int], int] | None = None  # ZeRO-3: the largest forward count of any rank
    share_prefix: bool = True  # replay.share_prefix: a prefix records share forwarded once
    reuse_frozen: bool = False  # replay.reuse_frozen: frozen bottom layers run once per record
    reuse_plain: bool = True  # replay.reuse_plain: the rubric pass continues from the plain pass

    @classmethod
    def from_config(cls, config, lockstep=None, reuse_frozen: bool = True) -> ReplaySpec:
        """`reuse_frozen=False` where the run cannot (under DeepSpeed, whose module holds the weights)."""
        rp = config.replay
        return cls(config.rollout.temperature, rp.token_budget, rp.fused, lockstep, rp.share_prefix,
                   rp.reuse_frozen and reuse_frozen, rp.reuse_plain)


@dataclass
class ReplayResult:
    packed: Packed
    old_logprobs: torch.Tensor | None  # [L] plain-context replay (π_old of the ratio by default); None: not run
    advantages: torch.Tensor  # [L] A_GRPO + α·e·Δ on response positions (Eq. 9)
    delta: torch.Tensor  # [L] Δ = lp_with − lp_without where valid, else 0 (Eq. 8)
    valid: torch.Tensor  # [L] e: response token of an eligible record with a finite Δ
    rollout_gap: float | None  # mean |replayed − rollout| log-prob over response tokens (None: not replayed)
    rollout_logprobs: torch.Tensor  # [L] the sampler's log-probs (π_old with optim.old_logprobs=rollout)
    # (split, per record the states entering layer `split`) from the plain pass, when the layers
    # below `split` are frozen (reuse_frozen): the reference pass and the update start from them
    frozen_states: tuple | None = None
    grpo_advantages: torch.Tensor | None = None  # [L] A_GRPO on response positions (Eq. 2, the turn's)
    eligible: torch.Tensor | None = None  # [S] the record had its rubric (and its control) spliced in
    delta_paper: torch.Tensor | None = None  # [L] with a control: the paper's Δ (lp with − lp plain) where valid


@dataclass
class PlainReplay:
    """The plain-context pass alone: what GRPO needs, and what the rubric pass adds Δ to."""

    packed: Packed
    old_logprobs: torch.Tensor | None  # [L]; None where plain_replay ran without `logprobs`
    frozen_states: tuple | None = None  # see ReplayResult
    # the keys/values of each record no other record extends, kept for the rubric pass
    # (plain_replay's keep_prefixes; paired_replay releases them)
    prefixes: prefill.PrefixCache | None = None


def plain_replay(model, records: list[TurnRecord], replay: ReplaySpec, keep_prefixes: bool = False,
                 logprobs: bool = True) -> PlainReplay:
    """Log-probs of the response tokens in their own contexts, with the weights that produced the
    rollout (π_old). `replay.reuse_frozen`, `keep_prefixes`: see paired_replay. Without `logprobs`
    (nothing will read them: no rubric pass, π_old from the rollout) only the frozen layers' states
    are computed, for the reference pass and the update; the layers above do not run."""
    token_budget, lockstep, share_prefix = replay.token_budget, replay.lockstep, replay.share_prefix
    packed = pack(records)
    states = None
    keeps = keep_prefixes and share_prefix and lockstep is None and prefill.serves(model)
    kept = prefill.PrefixCache() if keeps else None
    split = frozen.frozen_layers(model) if replay.reuse_frozen and share_prefix and lockstep is None else 0
    if split and prefill.serves(model) and frozen.serves(model, split):
        sequences = [packed.ids[int(packed.cu_seqlens[s]):int(packed.cu_seqlens[s + 1])].tolist()
                     for s in range(packed.num_sequences)]
        below = prefill.PrefixCache() if keeps else None  # the frozen layers' keys/values, joined below
        states = (split, prefill.bottom_states(model, sequences, split, token_budget, keep_into=below))
    old = None
    if logprobs:
        old = replay_logprobs(model, packed.ids, packed.cu_seqlens, packed.response_mask, replay.temperature,
                              token_budget, replay.fused, lockstep, share_prefix, states, keep_into=kept)
    if states is not None and kept is not None:
        kept = kept.under(below)
    return PlainReplay(packed, old, states, kept)


def paired_replay(model, records: list[TurnRecord], record_advantages: list[float],
                  record_rubrics: list[list[int] | None], alpha: float, replay: ReplaySpec,
                  plain: PlainReplay | None = None, record_controls: list | None = None,
                  record_keep: list | None = None, plain_logprobs: bool = True) -> ReplayResult:
    """Log-probs of the same response tokens without and with the rubric spliced in at each
    record's slot; their gap Δ shapes the token advantage (paper §3.3).

    `record_rubrics[s]` is the rubric message's token ids for record s, or None when its group has
    no selected bundle (or splicing is impossible for it); such records keep A_GRPO (e = 0).
    The plain pass runs with the weights that produced the rollout, so it doubles as π_old; `plain`
    is that pass when it already ran (plain_replay on the same records: the trainer runs it beside
    the bundle writing). `replay` (ReplaySpec) says how the passes run; its `share_prefix`: each pass
    along its own prefix tree (engines/prefill.py), so what records share (the system prompt, a
    group's task and first observation, the context up to each turn's slot) is forwarded once.
    The rubric pass is a separate tree, so the plain log-probs never depend on which records
    have a rubric (GRPO's replay is the same plain pass; ORSD at α = 0 gives its numbers bit for
    bit, in bf16 on a CPU only on the same thread count, which replay.overlap changes). Not under
    ZeRO-3 (`lockstep`), whose ranks must run equal forwards. `reuse_frozen` (with share_prefix):
    where the model's bottom layers are frozen, the plain pass runs them once per record
    (prefill.bottom_states) and the layers above from their output, which the result keeps
    (`frozen_states`) for the reference pass and the update.

    `reuse_plain` (with share_prefix): the rubric pass continues from the plain pass's keys and
    values instead of forwarding again what the two share. A record's rubric-conditioned sequence
    is its plain context up to the slot, then the rubric: those first positions are the plain
    pass's, same tokens, same weights. The plain pass keeps the keys/values of every record no
    other extends (prefill.PrefixCache), and each record's rubric, observation and response
    continue at its slot from the kept sequence sharing its longest prefix; only those are
    forwarded. Δ's two terms then read the same numbers for their shared context. `plain` when
    given must have run with keep_prefixes for this to apply.

    `record_controls[s]` (rubric.delta_baseline: train/delta.py, train/shaping.py): a control
    message exactly as long as record s's rubric; Δ = lp(with rubric) − lp(with control), both
    spliced at the slot and forwarded in one pass (each control row continues from the same kept
    keys/values as its rubric's row), e = 0 where either is None. `record_keep[s]`: per response
    token, False where e = 0 (rubric.delta_mask).

    `plain_logprobs=False`: the caller reads no plain log-probs (π_old comes from the rollout and
    the method has no teacher); where no record has a rubric either, the plain pass computes only
    the frozen layers' states (plain_replay), `old_logprobs` and `rollout_gap` are None and A = A_GRPO.
    """
    spliced_any = any(r is not None for r in record_rubrics) or any(c is not None for c in record_controls or [])
    if plain is None:
        plain = plain_replay(model, records, replay, keep_prefixes=replay.reuse_plain and spliced_any,
                             logprobs=plain_logprobs or spliced_any or replay.lockstep is not None)
    packed, old = plain.packed, plain.old_logprobs
    splices = [splice_privileged(packed, records, privileged)
               for privileged in (record_rubrics, record_controls) if privileged is not None]
    prefixes, plain.prefixes = (plain.prefixes if replay.reuse_plain else None), None  # held only until the rubric pass
    logprobs, bounds = None, []
    if any(spliced.eligible.any() for spliced in splices) or replay.lockstep:
        ids, cu, mask, bounds = shaping.joined(splices)
        logprobs = replay_logprobs(model, ids, cu, mask, replay.temperature, replay.token_budget, replay.fused,
                                   replay.lockstep, replay.share_prefix, prefixes=prefixes)
    shaped = shaping.shaped(packed, old if old is not None else torch.zeros(len(packed.ids)), splices, logprobs,
                            bounds, record_advantages, alpha, record_keep)
    rollout = torch.zeros(len(packed.ids))
    rollout[packed.response_mask] = torch.tensor([lp for r in records for lp in r.rollout_logprobs],
                                                 dtype=torch.float32)
    scored = packed.response_mask & (torch.arange(len(packed.ids)) > packed.cu_seqlens[packed.seq_ids])
    gap = None if old is None else float((old - rollout)[scored].abs().mean()) if scored.any() else 0.0
    return ReplayResult(packed, old, shaped.advantages, shaped.delta, shaped.valid, gap, rollout, plain.frozen_states,
                        shaped.grpo, shaped.eligible, shaped.delta_paper)
