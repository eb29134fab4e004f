"""Packing turn records and computing response-token log-probs: paired replay (paper §3.3).

Records are packed back to back (`ids[cu_seqlens[s]:cu_seqlens[s+1]]` = context + response of
record s). Log-probs are computed only where a response token is predicted: the decoder's hidden
state at position p-1 against the LM head gives log π(ids[p] | ids[<p]); with `fused` they come
from `fused_token_logprobs`, so no [tokens × vocab] tensor exists in replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from orsd import ops
from orsd.engines import frozen, prefill

from . import shaping
from .head import chunk_logprobs, fused_head, fused_head_serves, head_logprobs
from .model import autocast, autocast_dtype, trim_heap
from .records import TurnRecord


@dataclass
class Packed:
    ids: torch.Tensor  # [L] int64
    cu_seqlens: torch.Tensor  # [S+1] int64
    response_mask: torch.Tensor  # [L] bool: positions holding sampled response tokens
    seq_ids: torch.Tensor  # [L] int64: record index of each position

    @property
    def lengths(self) -> list[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    @property
    def num_sequences(self) -> int:
        return len(self.cu_seqlens) - 1


def pack(records: list[TurnRecord]) -> Packed:
    ids, mask, seq_ids, cu = [], [], [], [0]
    for s, record in enumerate(records):
        ids += record.context_ids + record.response_ids
        mask += [False] * len(record.context_ids) + [True] * len(record.response_ids)
        seq_ids += [s] * record.num_tokens
        cu.append(len(ids))
    return Packed(torch.tensor(ids, dtype=torch.long), torch.tensor(cu, dtype=torch.long),
                  torch.tensor(mask, dtype=torch.bool), torch.tensor(seq_ids, dtype=torch.long))


def spliced_response_mask(packed: Packed, length: int, pos_map: torch.Tensor,
                          eligible: torch.Tensor) -> torch.Tensor:
    """Response positions, in the spliced packing, of the sequences that received a rubric."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[pos_map[packed.response_mask & eligible[packed.seq_ids]]] = True
    return mask


@dataclass
class Spliced:
    """A packing with privileged context spliced at each eligible record's slot."""

    ids: torch.Tensor
    cu_seqlens: torch.Tensor
    pos_map: torch.Tensor  # [L] plain position -> position in the spliced packing
    eligible: torch.Tensor  # [S] bool: the record received its privileged ids
    response_mask: torch.Tensor  # spliced positions of the eligible records' response tokens


def splice_privileged(packed: Packed, records: list[TurnRecord], privileged: list[list[int] | None]) -> Spliced:
    """`context[:slot] + privileged[s] + context[slot:] + response` per record s with ids (the rubric
    B* for paired replay, a distillation teacher's context); identical ids are stored once."""
    index, table, table_cu = [], [], [0]
    seen: dict[tuple, int] = {}
    for ids in privileged:
        if ids is None:
            index.append(-1)
            continue
        key = tuple(ids)
        if key not in seen:
            seen[key] = len(seen)
            table += ids
            table_cu.append(len(table))
        index.append(seen[key])
    index_tensor = torch.tensor(index, dtype=torch.long)
    slots = torch.tensor([max(r.rubric_slot, 0) for r in records], dtype=torch.long)
    new_ids, new_cu, pos_map = ops.splice_rubric(packed.ids, packed.cu_seqlens, slots,
                                                 torch.tensor(table, dtype=torch.long),
                                                 torch.tensor(table_cu, dtype=torch.long), index_tensor)
    eligible = index_tensor >= 0
    return Spliced(new_ids, new_cu, pos_map, eligible, spliced_response_mask(packed, len(new_ids), pos_map, eligible))


def budget_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Sequence indices grouped (sorted by length) so count × longest ≤ token_budget."""
    order = sorted(range(len(lengths)), key=lambda s: lengths[s])
    batches, current = [], []
    for s in order:
        if current and (len(current) + 1) * lengths[s] > token_budget:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


def _hidden_rows(model, ids: torch.Tensor, cu: torch.Tensor, batch: list[int], positions: list[torch.Tensor],
                 frozen_states: tuple | None = None):
    """Final hidden states predicting each position in `positions[i]` of sequence batch[i]; with
    `frozen_states` = (split, states per sequence s), from layer `split` up (engines/frozen.py)."""
    device = next(model.parameters()).device
    starts = [int(cu[s]) for s in batch]
    lengths = [int(cu[s + 1]) - int(cu[s]) for s in batch]
    width = max(lengths)
    input_ids = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (start, length) in enumerate(zip(starts, lengths)):
        input_ids[row, :length] = ids[start:start + length]
        attention[row, :length] = 1
    decoder = model.get_decoder()
    if frozen_states is None:
        hidden = decoder(input_ids=input_ids.to(device), attention_mask=attention.to(device)).last_hidden_state
    else:
        split, states = frozen_states
        inputs = states[batch[0]].new_zeros((len(batch), width, states[batch[0]].shape[-1]))
        for row, (s, length) in enumerate(zip(batch, lengths)):
            inputs[row, :length] = states[s]
        with frozen.layer_range(decoder, split, len(decoder.layers)):
            hidden = decoder(inputs_embeds=inputs.to(device), attention_mask=attention.to(device)).last_hidden_state
    return picked(hidden, [p - start - 1 for p, start in zip(positions, starts)])  # predicted from p-1


def _shared_hidden_rows(model, ids: torch.Tensor, cu: torch.Tensor, batch: list[int], positions: list[torch.Tensor],
                        token_budget: int = 0, frozen_states: tuple | None = None,
                        prefixes: prefill.PrefixCache | None = None, keep_into: prefill.PrefixCache | None = None):
    """_hidden_rows from a forward along the sequences' prefix tree (engines/prefill.py); `prefixes`,
    `keep_into`: see prefill.shared_prefix_hidden."""
    kept = [(s, p) for s, p in zip(batch, positions) if len(p)]
    if not kept:
        return _hidden_rows(model, ids, cu, batch, positions, frozen_states)
    sequences = [ids[int(cu[s]):int(cu[s + 1])].tolist() for s, _ in kept]
    needed = [(p - int(cu[s]) - 1).tolist() for s, p in kept]
    split, states = frozen_states if frozen_states is not None else (0, None)
    return torch.cat(prefill.shared_prefix_hidden(model, sequences, needed, token_budget,
                                                  None if states is None else [states[s] for s, _ in kept], split,
                                                  prefixes, keep_into))


def picked(hidden: torch.Tensor, columns: list[torch.Tensor]) -> torch.Tensor:
    """hidden[row, columns[row]] for every row, concatenated: [Σ len(columns[row]), H]."""
    rows = torch.cat([torch.full((len(cols),), row, dtype=torch.long) for row, cols in enumerate(columns)])
    return hidden[rows.to(hidden.device), torch.cat(columns).to(hidden.device)]


def batch_positions(packed_ids_mask: torch.Tensor, cu: torch.Tensor, batch: list[int]) -> list[torch.Tensor]:
    """Global positions of the response tokens of each sequence in `batch` (never a sequence's
    first token, which nothing predicts)."""
    out = []
    for s in batch:
        start, end = int(cu[s]), int(cu[s + 1])
        local = packed_ids_mask[start:end].nonzero().squeeze(-1)
        out.append(local[local > 0] + start)
    return out


def response_hidden(model, ids: torch.Tensor, cu: torch.Tensor, mask: torch.Tensor, token_budget: int,
                    lockstep=None):
    """Yields (positions, hidden) per no-grad forward: the final hidden states [n, H] predicting the
    packed positions where `mask` holds, sequences batched by `token_budget` (eval mode meanwhile).

    `lockstep(n) -> N` (ZeRO-3) returns the largest forward count of any rank; this rank then runs
    N − n dummy forwards so the collective parameter gathers line up."""
    was_training = model.training
    model.eval()
    lengths = (cu[1:] - cu[:-1]).tolist()
    seq_of = torch.repeat_interleave(torch.arange(len(lengths)), cu[1:] - cu[:-1])
    active = torch.zeros(len(lengths), dtype=torch.bool)
    active[seq_of[mask]] = True  # sequences with nothing to score are never forwarded
    active_ids = active.nonzero().squeeze(-1).tolist()
    batches = budget_batches([lengths[s] for s in active_ids], token_budget)
    try:
        for _ in range((lockstep(len(batches)) if lockstep else len(batches)) - len(batches)):
            dummy_forward(model)
        for sub in batches:
            batch = [active_ids[i] for i in sub]
            positions = batch_positions(mask, cu, batch)
            yield torch.cat(positions), _hidden_rows(model, ids, cu, batch, positions)
            trim_heap()
    finally:
        model.train(was_training)


@torch.no_grad()
def replay_logprobs(model, ids: torch.Tensor, cu: torch.Tensor, mask: torch.Tensor, temperature: float,
                    token_budget: int, fused: bool = True, lockstep=None, share_prefix: bool = False,
                    frozen_states: tuple | None = None, prefixes: prefill.PrefixCache | None = None,
                    keep_into: prefill.PrefixCache | None = None) -> torch.Tensor:
    """log π(ids[p] | ids[<p]) / temperature-scaled, at every position where `mask` holds; 0 elsewhere
    (`lockstep`: see response_hidden). `share_prefix`: what the sequences share (a group's system
    prompt, task and first observation) forwarded once (engines/prefill.py); not under `lockstep`,
    whose ranks must run equal forwards, nor for a cache that cannot be cut per row.
    `frozen_states` (with share_prefix): see train_logprobs. `prefixes` (with share_prefix, without
    frozen_states): continue from keys/values an earlier pass kept; `keep_into` (with share_prefix):
    keep this pass's, with frozen_states those of the layers it ran (prefill.shared_prefix_hidden)."""
    out = torch.zeros(len(ids), dtype=torch.float32)
    if share_prefix and lockstep is None and prefill.serves(model):
        batches = _shared_response_hidden(model, ids, cu, mask, token_budget, frozen_states, prefixes, keep_into)
    else:
        batches = response_hidden(model, ids, cu, mask, token_budget, lockstep)
    for flat, hidden in batches:
        out[flat] = head_logprobs(model, hidden, ids[flat], temperature, fused)
    return out


def _shared_response_hidden(model, ids: torch.Tensor, cu: torch.Tensor, mask: torch.Tensor, token_budget: int,
                            frozen_states: tuple | None = None, prefixes=None, keep_into=None):
    """response_hidden's (positions, hidden), once for all sequences, from shared-prefix forwards."""
    positions = batch_positions(mask, cu, list(range(len(cu) - 1)))
    active = [s for s, p in enumerate(positions) if len(p)]  # sequences with nothing to score: no forward
    if not active:
        return []
    was_training = model.training
    model.eval()
    try:
        hidden = _shared_hidden_rows(model, ids, cu, active, [positions[s] for s in active], token_budget,
                                     frozen_states, prefixes, keep_into)
    finally:
        model.train(was_training)
    trim_heap()
    return [(torch.cat([positions[s] for s in active]), hidden)]


def dummy_forward(model):
    """A one-token forward whose output is used only to keep ranks in lockstep (see distributed)."""
    device = next(model.parameters()).device
    return model.get_decoder()(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device)).last_hidden_state


def train_logprobs(model, ids: torch.Tensor, cu: torch.Tensor, batch: list[int], positions: list[torch.Tensor],
                   temperature: float, chunk_tokens: int = 1024, precision: str = "",
                   chunk_term=None, lm_head: str = "fused", share_prefix: bool = False,
                   frozen_states: tuple | None = None,
                   hidden_rows=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Differentiable log-probs, detached entropies and, with `chunk_term`, a differentiable
    per-token term of the response tokens of one micro-batch.

    `lm_head="fused"`: ops.lm_head_logprobs takes the log-probs and entropies straight from the
    hidden states and the LM head, forward and backward, never holding a tokens × vocab tensor
    (the head's weight is read as the autocast dtype, as autocast would cast it for the matmul).
    `lm_head="chunked"` (the reference; also used whenever the fused op cannot serve: a
    `chunk_term`, a head with a bias, a ZeRO-3-partitioned head): the LM head and log-softmax run
    in checkpointed token chunks, so at most chunk_tokens × vocab logits are alive at once.
    `chunk_term = (fn, tensors)`: fn(log-softmax [c, V], *rows c of each tensor) -> [c] runs inside
    the same checkpointed chunk, for a term that needs the whole distribution (a distillation
    divergence) without a tokens × vocab tensor beyond the chunk. `precision` autocasts the forward
    only: autocast must not reach the backward or the optimizer step (seen here: with both under
    CPU bf16 autocast, SmolLM2's warm start stopped learning). `share_prefix`: a prefix that the
    micro-batch's sequences share forwarded once (engines/prefill.py), where the model serves it.
    `frozen_states` = (split, states): each sequence s's states entering layer `split`, from
    frozen layers below it computed once (engines/frozen.py); only the layers from `split` up run.
    `hidden_rows(model, ids, cu, batch, positions, frozen_states=...)`, when given, computes the final
    hidden states in place of the forwards above (the warm start's detached contexts).
    """
    if lm_head not in ("fused", "chunked"):
        raise ValueError(f"lm_head: {lm_head!r}; expected 'fused' or 'chunked'")
    fn, extra = chunk_term if chunk_term is not None else (None, ())
    with autocast(model, precision):
        if hidden_rows is None:
            hidden_rows = _shared_hidden_rows if share_prefix and prefill.serves(model) else _hidden_rows
        hidden = hidden_rows(model, ids, cu, batch, positions, frozen_states=frozen_states)
        targets = ids[torch.cat(positions)].to(hidden.device)
        head = model.get_output_embeddings()
        if lm_head == "fused" and fn is None and fused_head_serves(head):
            lp, entropy = fused_head(model, head, hidden, targets, temperature, autocast_dtype(model, precision))
            return lp, entropy.detach(), None
        lps, entropies, terms = [], [], []
        for start in range(0, len(targets), chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            lp, entropy, term = checkpoint(chunk_logprobs, model, head, hidden[rows], targets[rows], temperature, fn,
                                           *[x[rows].to(hidden.device) for x in extra], use_reentrant=False)
            lps.append(lp)
            entropies.append(entropy.detach())
            terms.append(term)
    return torch.cat(lps), torch.cat(entropies), (torch.cat(terms) if fn is not None else None)


@dataclass
class ReplayResult:
    packed: Packed
    old_logprobs: torch.Tensor  # [L] plain-context replay (π_old of the ratio by default)
    advantages: torch.Tensor  # [L] A_GRPO + α·e·Δ on response positions (Eq. 9)
    delta: torch.Tensor  # [L] Δ = lp_with − lp_without where valid, else 0 (Eq. 8)
    valid: torch.Tensor  # [L] e: response token of an eligible record with a finite Δ
    rollout_gap: float  # mean |replayed − rollout| log-prob over response tokens
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
    old_logprobs: torch.Tensor  # [L]
    frozen_states: tuple | None = None  # see ReplayResult
    # the keys/values of each record no other record extends, kept for the rubric pass
    # (plain_replay's keep_prefixes; paired_replay releases them)
    prefixes: prefill.PrefixCache | None = None


def plain_replay(model, records: list[TurnRecord], temperature: float, token_budget: int, fused: bool = True,
                 lockstep=None, share_prefix: bool = True, reuse_frozen: bool = False,
                 keep_prefixes: bool = False) -> PlainReplay:
    """Log-probs of the response tokens in their own contexts, with the weights that produced the
    rollout (π_old). `reuse_frozen`, `keep_prefixes`: see paired_replay."""
    packed = pack(records)
    states = None
    keeps = keep_prefixes and share_prefix and lockstep is None and prefill.serves(model)
    kept = prefill.PrefixCache() if keeps else None
    split = frozen.frozen_layers(model) if reuse_frozen and share_prefix and lockstep is None else 0
    if split and prefill.serves(model) and frozen.serves(model, split):
        sequences = [packed.ids[int(packed.cu_seqlens[s]):int(packed.cu_seqlens[s + 1])].tolist()
                     for s in range(packed.num_sequences)]
        below = prefill.PrefixCache() if keeps else None  # the frozen layers' keys/values, joined below
        states = (split, prefill.bottom_states(model, sequences, split, token_budget, keep_into=below))
    old = replay_logprobs(model, packed.ids, packed.cu_seqlens, packed.response_mask, temperature,
                          token_budget, fused, lockstep, share_prefix, states, keep_into=kept)
    if states is not None and kept is not None:
        kept = kept.under(below)
    return PlainReplay(packed, old, states, kept)


def paired_replay(model, records: list[TurnRecord], record_advantages: list[float],
                  record_rubrics: list[list[int] | None], alpha: float, temperature: float,
                  token_budget: int, fused: bool = True, lockstep=None, share_prefix: bool = True,
                  reuse_frozen: bool = False, plain: PlainReplay | None = None,
                  reuse_plain: bool = True, record_controls: list | None = None,
                  record_keep: list | None = None) -> ReplayResult:
    """Log-probs of the same response tokens without and with the rubric spliced in at each
    record's slot; their gap Δ shapes the token advantage (paper §3.3).

    `record_rubrics[s]` is the rubric message's token ids for record s, or None when its group has
    no selected bundle (or splicing is impossible for it); such records keep A_GRPO (e = 0).
    The plain pass runs with the weights that produced the rollout, so it doubles as π_old; `plain`
    is that pass when it already ran (plain_replay on the same records: the trainer runs it beside
    the bundle writing). `share_prefix`: each pass along its own prefix tree (engines/prefill.py), so
    what records share (the system prompt, a group's task and first observation, the context up to
    each turn's slot) is forwarded once: on the default shape 9,817 → 3,732 tokens for the plain
    pass. The rubric pass is a separate tree, so the plain log-probs never depend on which records
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
    """
    if plain is None:
        plain = plain_replay(model, records, temperature, token_budget, fused, lockstep, share_prefix, reuse_frozen,
                             keep_prefixes=reuse_plain and any(r is not None for r in record_rubrics))
    packed, old = plain.packed, plain.old_logprobs
    splices = [splice_privileged(packed, records, privileged)
               for privileged in (record_rubrics, record_controls) if privileged is not None]
    prefixes, plain.prefixes = (plain.prefixes if reuse_plain else None), None  # held only until the rubric pass
    logprobs, bounds = None, []
    if any(spliced.eligible.any() for spliced in splices) or lockstep:
        ids, cu, mask, bounds = shaping.joined(splices)
        logprobs = replay_logprobs(model, ids, cu, mask, temperature, token_budget, fused, lockstep, share_prefix,
                                   prefixes=prefixes)
    shaped = shaping.shaped(packed, old, splices, logprobs, bounds, record_advantages, alpha, record_keep)
    rollout = torch.zeros(len(packed.ids))
    rollout[packed.response_mask] = torch.tensor([lp for r in records for lp in r.rollout_logprobs],
                                                 dtype=torch.float32)
    scored = packed.response_mask & (torch.arange(len(packed.ids)) > packed.cu_seqlens[packed.seq_ids])
    gap = float((old - rollout)[scored].abs().mean()) if scored.any() else 0.0
    return ReplayResult(packed, old, shaped.advantages, shaped.delta, shaped.valid, gap, rollout, plain.frozen_states,
                        shaped.grpo, shaped.eligible, shaped.delta_paper)
