"""microbatch_weights: per-token loss weights that make sum(w * f) the paper's Eq. 14 loss, a
token mean inside each micro-batch averaged over all D*G micro-batches."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference

_DENSE_COUNTERS = 2**16
"""Up to this many micro-batches the kernel's one counter per micro-batch (512 KiB) is fine even
when most are empty; beyond it, and beyond one per position, _sparse_weights counts instead."""


def microbatch_weights(
    mask: torch.Tensor, microbatch_ids: torch.Tensor, num_microbatches: int
) -> torch.Tensor:
    """w[p] = mask[p] / (num_microbatches * number of masked-in positions of p's micro-batch),
    0 in a micro-batch without any (paper Eq. 14, num_microbatches = D*G).

    mask [L] bool, microbatch_ids [L] int64 in [0, num_microbatches), num_microbatches an int
    >= 1 with num_microbatches * max(L, 1) < 2^63 (the exact int64 product num_microbatches *
    count must not wrap). Returns w [L] f32. One host sync on CUDA (range check).
    """
    mask = _checks.tensor("mask", mask, dtypes=(torch.bool,), ndim=1)
    device = mask.device
    microbatch_ids = _checks.tensor(
        "microbatch_ids", microbatch_ids, dtypes=(torch.int64,), ndim=1, device=device, device_of="mask"
    )
    length = mask.shape[0]
    _checks.length("microbatch_ids", microbatch_ids, length, "one micro-batch id per position of mask")
    # The denominator num_microbatches * count is an exact int64 and count <= L: bound the product.
    num_microbatches = _checks.integer(
        "num_microbatches", num_microbatches, minimum=1, maximum=(2**63 - 1) // max(length, 1)
    )
    checks = _checks.ValueChecks()
    checks.out_of_range(
        "microbatch_ids", microbatch_ids, 0, num_microbatches, note=" (num_microbatches = D*G)"
    )
    checks.run()

    if num_microbatches > max(length, _DENSE_COUNTERS):
        return _sparse_weights(mask, microbatch_ids, num_microbatches)
    kind = _backend.native_kind(device)
    if kind is None:
        _backend.warn_reference("microbatch_weights")
        return reference.microbatch_weights(mask, microbatch_ids, num_microbatches)
    out = torch.empty(length, dtype=torch.float32, device=device)
    if length > 0:
        counts = torch.empty(num_microbatches, dtype=torch.int64, device=device)
        args = (
            mask.data_ptr(),
            microbatch_ids.data_ptr(),
            length,
            num_microbatches,
            counts.data_ptr(),
            out.data_ptr(),
        )
        if kind == "cpu":
            _backend._C.microbatch_weights_cpu(*args, _backend.num_threads())
        else:
            _backend._C.microbatch_weights_cuda(*args, *_backend.cuda_launch_args(mask))
    return out


def _sparse_weights(mask: torch.Tensor, microbatch_ids: torch.Tensor, num_microbatches: int) -> torch.Tensor:
    """The same formula for many more micro-batches than positions: the kernels (and the
    reference) keep a counter per micro-batch, terabytes for num_microbatches near 2^40, while at
    most L of them can hold a position. Counts over the ids present instead; integer counts and one f32
    division, as in the kernels, so the weights are the same bits. Rare, so plain torch."""
    present, dense_ids = torch.unique(microbatch_ids, return_inverse=True)
    counts = torch.zeros(present.shape[0], dtype=torch.int64, device=mask.device)
    counts.index_add_(0, dense_ids, mask.to(torch.int64))
    denominators = (num_microbatches * counts[dense_ids]).clamp(min=1).to(torch.float32)
    return torch.where(mask, 1.0 / denominators, torch.zeros_like(denominators))
