"""Plain-torch implementations of every op in orsd.ops: the executable specification the native
kernels are tested against, and the fallback when orsd._C is missing. Readability over speed:
these allocate freely (token_logprobs materialises the full T x V log-softmax in f32).

Arguments are assumed valid; the public wrappers in orsd.ops validate before calling in here.
"""

from __future__ import annotations

import torch

__all__ = [
    "token_logprobs",
    "fused_token_logprobs",
    "grpo_advantages",
    "splice_rubric",
    "shape_advantages",
    "microbatch_weights",
]


def _all_rows(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bool, device=device)


@torch.no_grad()
def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    return_lse: bool = False,
):
    """out[t] = log_softmax(logits[t].float() / temperature)[targets[t]] where mask[t], else 0.0.

    With return_lse, also lse[t] = max + log(sum(exp(x - max))) of the scaled row (0.0 where
    masked); a row whose max is not finite gives NaN for both.
    """
    if mask is None:
        mask = _all_rows(logits.shape[0], logits.device)
    scaled = logits.float() / temperature
    safe_targets = torch.where(mask, targets, torch.zeros_like(targets))
    log_probs = torch.log_softmax(scaled, dim=-1).gather(-1, safe_targets[:, None]).squeeze(-1)
    out = torch.where(mask, log_probs, torch.zeros_like(log_probs))
    if not return_lse:
        return out
    if scaled.shape[0] == 0:
        return out, torch.zeros_like(out)
    row_max = scaled.max(dim=-1).values
    lse = row_max + (scaled - row_max[:, None]).exp().sum(dim=-1).log()
    lse = torch.where(torch.isfinite(row_max), lse, torch.full_like(lse, float("nan")))
    return out, torch.where(mask, lse, torch.zeros_like(lse))


@torch.no_grad()
def fused_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    *,
    return_lse: bool = False,
):
    """token_logprobs(hidden @ weight.T, ...) with the logits computed in f32 from the given
    (possibly bf16/f16) values, i.e. never rounded back to the low-precision dtype.
    chunk_size only matters to the native kernel."""
    logits = hidden.float() @ weight.float().T
    return token_logprobs(logits, targets, mask, temperature, return_lse=return_lse)


@torch.no_grad()
def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """Per group: (r - mean) / (sample std + eps), or r - mean; 0 for a group of one or a constant
    group. Statistics in f64, result f32."""
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=rewards.device)
    num_groups = int(group_ids.max()) + 1
    r = rewards.double()
    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, group_ids, torch.ones_like(r)
    )
    total = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, group_ids, r)
    mean = total / count.clamp(min=1)
    deviation = r - mean[group_ids]
    sq_dev = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, group_ids, deviation**2
    )
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
    advantage = deviation / (std[group_ids] + eps) if norm_by_std else deviation
    informative = (count[group_ids] >= 2) & (sq_dev[group_ids] > 0)
    return torch.where(informative, advantage, torch.zeros_like(advantage)).float()


@torch.no_grad()
def splice_rubric(
    ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slots: torch.Tensor,
    rubric_ids: torch.Tensor,
    rubric_cu: torch.Tensor,
    rubric_index: torch.Tensor,
):
    """Insert rubric rubric_index[s] before local position slots[s] of every sequence s with
    rubric_index[s] >= 0; returns (new_ids, new_cu_seqlens, pos_map) with pos_map[p] the new
    global position of old token p. A Python loop over sequences: the spec, not the fast path."""
    pieces: list[torch.Tensor] = []
    positions: list[torch.Tensor] = []
    new_cu = [0]
    bounds = cu_seqlens.tolist()
    rubric_bounds = rubric_cu.tolist()
    for s, j in enumerate(rubric_index.tolist()):
        sequence = ids[bounds[s] : bounds[s + 1]]
        local = torch.arange(sequence.shape[0], device=ids.device)
        added = 0
        if j >= 0:
            slot = int(slots[s])
            rubric = rubric_ids[rubric_bounds[j] : rubric_bounds[j + 1]]
            pieces += [sequence[:slot], rubric, sequence[slot:]]
            added = rubric.shape[0]
            local = local + (local >= slot).long() * added
        else:
            pieces.append(sequence)
        positions.append(new_cu[-1] + local)
        new_cu.append(new_cu[-1] + sequence.shape[0] + added)
    new_ids = torch.cat(pieces) if pieces else ids.new_empty(0)
    pos_map = torch.cat(positions) if positions else torch.zeros(0, dtype=torch.int64, device=ids.device)
    return new_ids, torch.tensor(new_cu, dtype=torch.int64, device=ids.device), pos_map


@torch.no_grad()
def shape_advantages(
    lp_plain: torch.Tensor,
    lp_rubric: torch.Tensor,
    pos_map: torch.Tensor,
    response_mask: torch.Tensor,
    seq_ids: torch.Tensor,
    seq_adv: torch.Tensor,
    alpha: float,
    eligible: torch.Tensor,
):
    """ORSD token advantage A = A_GRPO + alpha * e * delta with delta = lp_rubric[pos_map] - lp_plain
    and e = response_mask & eligible[seq] & isfinite(delta); returns (adv, delta, valid) with delta
    0 where not valid and adv 0 off the response."""
    delta = lp_rubric[pos_map] - lp_plain
    valid = response_mask & eligible[seq_ids] & torch.isfinite(delta)
    base = seq_adv[seq_ids]
    zero = torch.zeros_like(delta)
    adv = torch.where(valid, base + alpha * delta, torch.where(response_mask, base, zero))
    return adv, torch.where(valid, delta, zero), valid


@torch.no_grad()
def microbatch_weights(
    mask: torch.Tensor, microbatch_ids: torch.Tensor, num_microbatches: int
) -> torch.Tensor:
    """Paper Eq. 14 token weights: w[p] = mask[p] / (num_microbatches * #valid tokens in p's
    micro-batch), 0 in a micro-batch without valid tokens; sum(w * f) is the Eq. 14 loss."""
    counts = torch.zeros(num_microbatches, dtype=torch.int64, device=mask.device)
    counts.index_add_(0, microbatch_ids, mask.to(torch.int64))
    denominators = (num_microbatches * counts[microbatch_ids]).clamp(min=1).to(torch.float32)
    return torch.where(mask, 1.0 / denominators, torch.zeros_like(denominators))
