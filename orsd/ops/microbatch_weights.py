"""microbatch_weights: per-token loss weights that make sum(w * f) the paper's Eq. 14 loss, a
token mean inside each micro-batch averaged over all D*G micro-batches."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference


def microbatch_weights(
    mask: torch.Tensor, microbatch_ids: torch.Tensor, num_microbatches: int
) -> torch.Tensor:
    """w[p] = mask[p] / (num_microbatches * number of masked-in positions of p's micro-batch),
    0 in a micro-batch without any (paper Eq. 14, num_microbatches = D*G).

    mask [L] bool, microbatch_ids [L] int64 in [0, num_microbatches). Returns w [L] f32.
    One host sync on CUDA (range check).
    """
    mask = _checks.tensor("mask", mask, dtypes=(torch.bool,), ndim=1)
    device = mask.device
    microbatch_ids = _checks.tensor(
        "microbatch_ids", microbatch_ids, dtypes=(torch.int64,), ndim=1, device=device, device_of="mask"
    )
    length = mask.shape[0]
    _checks.length("microbatch_ids", microbatch_ids, length, "one micro-batch id per position of mask")
    num_microbatches = _checks.integer("num_microbatches", num_microbatches, minimum=1)
    checks = _checks.ValueChecks()
    checks.out_of_range(
        "microbatch_ids", microbatch_ids, 0, num_microbatches, note=" (num_microbatches = D*G)"
    )
    checks.run()

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
