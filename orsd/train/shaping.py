"""Eq. 8–9 on paired replay's passes: Δ against the plain pass (the paper) or against a control
context (rubric.delta_baseline, train/delta.py), e with the format mask, and the shaped advantage.

`joined` packs B*'s spliced sequences and the control's into one packing, so that one no-grad
replay pass forwards both (each control row continues from the same kept plain keys/values as its
B* row); `shaped` turns that pass's log-probs into Δ, e and A = A_GRPO + α·e·Δ through
ops.shape_advantages. Nothing here imports a model, a tokenizer or the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orsd import ops


def joined(splices: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """One packing of every splice's sequences (B*'s, then the control's), for one replay pass:
    (ids, cu_seqlens, response mask, where each splice's positions start)."""
    ids, cu, mask, bounds = [], [torch.zeros(1, dtype=torch.long)], [], [0]
    for spliced in splices:
        ids.append(spliced.ids)
        cu.append(spliced.cu_seqlens[1:] + bounds[-1])
        mask.append(spliced.response_mask)
        bounds.append(bounds[-1] + len(spliced.ids))
    return torch.cat(ids), torch.cat(cu), torch.cat(mask), bounds


@dataclass
class Shaped:
    advantages: torch.Tensor  # [L] A_GRPO + α·e·Δ on the response
    delta: torch.Tensor  # [L] Δ where e = 1, else 0
    valid: torch.Tensor  # [L] e
    grpo: torch.Tensor  # [L] A_GRPO on the response, 0 elsewhere
    eligible: torch.Tensor  # [S] the record had B* (and its control) spliced in
    delta_paper: torch.Tensor | None  # [L] with a control: lp with B* − lp plain where e = 1


def shaped(packed, old: torch.Tensor, splices: list, logprobs: torch.Tensor | None, bounds: list[int],
           record_advantages: list[float], alpha: float, keep: list | None) -> Shaped:
    """Eq. 8–9 through ops.shape_advantages, against the plain pass (one splice) or the control (two:
    B*'s, then the control's; `logprobs` of their joined packing, None when nothing was forwarded);
    then e = 0 on the tokens `keep` (per record, per response token) turns off."""
    seq_adv = torch.tensor(record_advantages, dtype=torch.float32)
    response, seq_ids = packed.response_mask, packed.seq_ids
    rubric_pass, eligible, base = splices[0], splices[0].eligible, old
    if logprobs is None:  # nothing spliced anywhere: A = A_GRPO
        with_rubric, pos_map = torch.zeros(len(packed.ids)), torch.arange(len(packed.ids))
        eligible = torch.zeros_like(eligible)
    else:
        with_rubric, pos_map = logprobs[bounds[0]:bounds[1]], rubric_pass.pos_map
        if len(splices) > 1:  # the control's log-probs at the plain positions (0 where it has none: e = 0)
            control = splices[1]
            base = logprobs[bounds[1]:bounds[2]][control.pos_map]
            eligible = eligible & control.eligible
    advantages, delta, valid = ops.shape_advantages(base, with_rubric, pos_map, response, seq_ids, seq_adv,
                                                    float(alpha), eligible)
    grpo = torch.where(response, seq_adv[seq_ids], torch.zeros(()))
    if keep is not None:
        kept = torch.ones(len(packed.ids), dtype=torch.bool)
        for s, flags in enumerate(keep):
            if flags is not None:
                end = int(packed.cu_seqlens[s + 1])
                kept[end - len(flags):end] = torch.tensor(flags, dtype=torch.bool)
        valid = valid & kept
        delta = torch.where(valid, delta, torch.zeros(()))
        advantages = torch.where(response & ~valid, grpo, advantages)
    paper = None
    if len(splices) > 1 and logprobs is not None:
        paper = torch.where(valid, with_rubric[pos_map] - old, torch.zeros(()))
    return Shaped(advantages, delta, valid, grpo, eligible, paper)
