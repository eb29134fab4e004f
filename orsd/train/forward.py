"""Response-token log-probs of a packing: the no-grad forwards of replay, the reference and the
teacher (`replay_logprobs`, `response_hidden`) and the update's differentiable one
(`train_logprobs`, imported by loss.py).

Log-probs are computed only where a response token is predicted: the decoder's hidden state at
position p-1 against the LM head gives log π(ids[p] | ids[<p]); with `fused` they come from
`fused_token_logprobs`, so no [tokens × vocab] tensor exists in replay.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from orsd.engines import frozen, prefill

from .head import chunk_logprobs, fused_head, fused_head_serves, head_logprobs
from .model import autocast, autocast_dtype, trim_heap
from .packing import batch_positions, budget_batches


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
    keep this pass's, with frozen_states those of the layers it ran (prefill.shared_prefix_hidden).
    Size: the packed inputs (ids, bounds, mask) and how to run the forward (the replay section's keys, which
    ReplaySpec gathers for the callers), each with the default of a plain forward."""
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
    Size: one micro-batch's inputs and the update's options (UpdateSpec's fields, the distillation term, the
    frozen layers' states), each off by default.
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
