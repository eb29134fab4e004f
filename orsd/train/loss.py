"""The policy update: PPO-clip on the shaped advantages with a k3 KL to the reference (Eq. 11),
reduced token-mean per micro-batch and averaged over micro-batches (Eq. 14)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from orsd import ops

from .forward import dummy_forward, train_logprobs
from .metrics import tagged
from .model import shares_prefixes, trim_heap
from .packing import Packed, batch_positions, budget_batches


@dataclass
class LossTerms:
    loss: torch.Tensor  # per token f_p = pg_p + η·kl_p
    pg: torch.Tensor
    kl: torch.Tensor
    clipped: torch.Tensor  # bool: the clipped branch was taken
    ratio: torch.Tensor


def per_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                   advantages: torch.Tensor, clip_eps: float = 0.2, dual_clip: float = 0.0,
                   log_ratio_clamp: float = 20.0, kl_coef: float = 1e-3) -> LossTerms:
    """PPO-clip (optionally dual-clip) + η·k3 KL, per token, as verl computes them.

    ratio = exp(clamp(lp − lp_old, ±log_ratio_clamp)); pg = max(−A·ratio, −A·clip(ratio, 1±ε)),
    capped at −A·c for A < 0 when dual-clip c is on; k3 = exp(x) − x − 1 with x = clamp(ref − lp,
    ±20), clamped to [−10, 10].
    """
    log_ratio = torch.clamp(logprobs - old_logprobs, -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    pg = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    if dual_clip:
        capped = torch.minimum(pg, -advantages * dual_clip)
        pg = torch.where(advantages < 0, capped, pg)
    x = torch.clamp(ref_logprobs - logprobs, -20.0, 20.0)
    kl = torch.clamp(torch.exp(x) - x - 1.0, -10.0, 10.0)
    return LossTerms(pg + kl_coef * kl, pg, kl, clipped, ratio)


def microbatches(packed: Packed, micro_batch_tokens: int, micro_batch_size: int = 0,
                 by_prefix: bool = False) -> list[list[int]]:
    """Record indices per micro-batch: `micro_batch_size` records in order (the paper's unit, Table 4),
    or, when it is 0, packed up to `micro_batch_tokens`: with `by_prefix` (the update forwards
    along the prefix tree) records that share a prefix together, counting the tokens forwarded (a
    shared prefix once); otherwise sorted by length, counting padded tokens."""
    if micro_batch_size:
        count = packed.num_sequences
        return [list(range(start, min(start + micro_batch_size, count))) for start in range(0, count, micro_batch_size)]
    if by_prefix:
        cu = packed.cu_seqlens.tolist()
        return shared_batches([packed.ids[cu[s]:cu[s + 1]].tolist() for s in range(packed.num_sequences)],
                              micro_batch_tokens)
    return budget_batches(packed.lengths, micro_batch_tokens)


def shared_batches(sequences: list[list[int]], token_budget: int) -> list[list[int]]:
    """Sequence indices in batches whose forward along their prefix tree takes about `token_budget`
    tokens or fewer: sorted by their tokens, so that sequences sharing a prefix are neighbours, a
    batch closes when the next sequence's tokens beyond what it shares with the one before would
    pass the budget (a single sequence over the budget is a batch alone)."""
    order = sorted(range(len(sequences)), key=lambda i: sequences[i])
    batches: list[list[int]] = []
    cost = 0
    for i in order:
        shared = len(os.path.commonprefix([sequences[batches[-1][-1]], sequences[i]])) if batches else 0
        if not batches or cost + len(sequences[i]) - shared > token_budget:
            batches.append([])
            cost, shared = 0, 0
        batches[-1].append(i)
        cost += len(sequences[i]) - shared
    return batches


@dataclass(frozen=True)
class UpdateSpec:
    """How the update runs: the `optim` section's loss and batching settings, the sampling
    temperature and the forwards' autocast dtype. `from_config` reads them from a run's config."""

    temperature: float  # rollout.temperature: log-probs of logits / T, as sampled
    micro_batch_tokens: int
    clip_eps: float
    dual_clip: float
    log_ratio_clamp: float
    kl_coef: float
    grad_clip: float
    micro_batch_size: int = 0
    precision: str = ""  # the forwards' autocast dtype ("": none); never the backward
    lm_head: str = "fused"  # optim.lm_head: "fused" | "chunked" (train_logprobs)
    share_prefix: bool = False  # a prefix the micro-batch's sequences share forwarded once
    packing: str = "length"  # optim.micro_batch_packing: "length" | "prefix"

    @classmethod
    def from_config(cls, config, share_prefix: bool = True) -> UpdateSpec:
        """`share_prefix=False` where the run cannot share (ZeRO-3: equal forwards on every rank)."""
        o = config.optim
        return cls(config.rollout.temperature, o.micro_batch_tokens, o.clip_eps, o.dual_clip, o.log_ratio_clamp,
                   o.kl_coef, o.grad_clip, o.micro_batch_size, config.model.autocast, o.lm_head,
                   o.share_prefix and share_prefix, o.micro_batch_packing)


def update(model, optimizer, packed: Packed, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
           advantages: torch.Tensor, spec: UpdateSpec, *, lockstep=None, backward=None, step=None, scheduler=None,
           distill=None, frozen_states: tuple | None = None) -> dict:
    """One optimizer step over all records: gradient accumulation across micro-batches.

    w = microbatch_weights(response mask, micro-batch ids, G) makes Σ_p w_p f_p equal Eq. 14 for
    one rank; each micro-batch backpropagates its share, so memory is one micro-batch's. With D
    ranks, `lockstep(n) -> G` gives the largest micro-batch count of any rank, this rank pads with
    zero-weight micro-batches, and DeepSpeed's gradient average over ranks supplies the 1/D.
    `backward(loss, last)`/`step()` let a DeepSpeed engine replace loss.backward() (told whether
    this is the accumulation boundary) and optimizer.step(). `distill` (orsd.train.teacher.DistillTerm)
    makes f_p = pg_coef·pg_p + η·k3_p + w_p·ℓ_p, ℓ computed in the same micro-batches and chunks.
    `spec` (UpdateSpec) holds the loss's coefficients and the batching; its `share_prefix`: see
    train_logprobs; its `packing="prefix"` (optim.micro_batch_packing), where the
    prefix is shared: micro-batches of records that share prefixes, budgeted by the tokens
    forwarded (see microbatches); Eq. 14's token mean is per micro-batch, so the packing sets its
    weights. "length": sorted by length, budgeted by padded tokens (the same with sharing on or off).
    `frozen_states`: per packed sequence, the states of the frozen layers below (see train_logprobs).
    Size: the update is one loop over micro-batches (gradient accumulation, Eq. 14); its keyword parameters
    are DeepSpeed's hooks and optional terms, each None without them.
    """
    temperature, kl_coef, packing, share_prefix = spec.temperature, spec.kl_coef, spec.packing, spec.share_prefix
    if packing not in ("prefix", "length"):
        raise ValueError(f"packing: {packing!r}; expected 'prefix' or 'length'")
    by_prefix = packing == "prefix" and share_prefix and shares_prefixes(model)
    batches = microbatches(packed, spec.micro_batch_tokens, spec.micro_batch_size, by_prefix)
    num_microbatches = lockstep(len(batches)) if lockstep else len(batches)
    mb_of_seq = torch.empty(packed.num_sequences, dtype=torch.long)
    for m, batch in enumerate(batches):
        mb_of_seq[batch] = m
    scored = packed.response_mask.clone()
    scored[packed.cu_seqlens[:-1]] = False  # a sequence's first token is never predicted
    weights = ops.microbatch_weights(scored, mb_of_seq[packed.seq_ids], max(num_microbatches, 1))
    model.train()
    lr = optimizer.param_groups[0]["lr"] if optimizer is not None else None  # the rate this step uses
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0, "ratio": 0.0}
    tokens = distill_tokens = 0
    distill_sum = 0.0
    device = next(model.parameters()).device
    backward = backward or (lambda loss, last: loss.backward())
    for index, batch in enumerate(batches):
        positions = batch_positions(scored, packed.cu_seqlens, batch)
        flat = torch.cat(positions)
        chunking = ({} if distill is None
                    else {"chunk_term": distill.chunk_term(flat), "chunk_tokens": distill.chunk_tokens})
        logprobs, entropy, chunk_values = train_logprobs(model, packed.ids, packed.cu_seqlens, batch, positions,
                                                         temperature, precision=spec.precision, lm_head=spec.lm_head,
                                                         share_prefix=share_prefix, frozen_states=frozen_states,
                                                         **chunking)
        terms = per_token_loss(logprobs, old_logprobs[flat].to(device), ref_logprobs[flat].to(device),
                               advantages[flat].to(device), spec.clip_eps, spec.dual_clip, spec.log_ratio_clamp,
                               kl_coef)
        f = terms.loss  # f_p of Eq. 14
        if distill is not None:
            weighted, divergence, active = distill.per_token(flat, logprobs, chunk_values)
            f = distill.pg_coef * terms.pg + kl_coef * terms.kl + weighted
            distill_sum += float(divergence.detach()[active].sum())
            distill_tokens += int(active.sum())
        loss = (weights[flat].to(device) * f).sum()
        backward(loss, index == num_microbatches - 1)
        n = len(flat)
        tokens += n
        sums["loss"] += float(loss.detach())
        sums["pg_loss"] += float(terms.pg.detach().sum())
        sums["kl"] += float(terms.kl.detach().sum())
        sums["clip_fraction"] += float(terms.clipped.sum())
        sums["entropy"] += float(entropy.sum())
        sums["ratio"] += float(terms.ratio.detach().sum())
        del logprobs, entropy, chunk_values, terms, f, loss
        trim_heap()  # the micro-batch's activations are freed: their pages go back before the next
    for index in range(len(batches), num_microbatches):  # zero-weight: same call count on every rank
        backward(dummy_forward(model).sum() * 0.0, index == num_microbatches - 1)
    grad_norm = 0.0
    if step is not None:
        grad_norm = step()
    else:
        if spec.grad_clip:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip))
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    per_token = {k: v / max(tokens, 1) for k, v in sums.items() if k != "loss"}
    counts = {"micro_batches": len(batches), "update_tokens": tokens}
    if distill is not None:  # mean ℓ over the tokens that have a teacher
        per_token["distill_loss"] = distill_sum / max(distill_tokens, 1)
        counts["distill_tokens"] = distill_tokens
    # the loss is this rank's share of Eq. 14; DeepSpeed averages gradients over ranks, so do we
    return {**tagged("mean", loss=sums["loss"]), **tagged("sum", **counts),
            **tagged("tokens", **per_token),
            **tagged("same", grad_norm=grad_norm, lr=lr)}
