"""splice_rubric: build the rubric-conditioned packing context[:slot] + rubric + context[slot:]
for every sequence of a packed batch, and map each old token to its new position."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference

_ID_DTYPES = (torch.int64, torch.int32)


def _check_offsets(
    checks: _checks.ValueChecks, name: str, offsets: torch.Tensor, total: int, what: str
) -> None:
    """offsets must start at 0, end at `total`, lie in [0, total] and never decrease.

    Everything compares values, never differences: offsets[i+1] - offsets[i] wraps around in
    int64 for offsets such as INT64_MAX followed by INT64_MIN, and a wrapped "positive" step once
    let a pointer far outside the buffer through to the kernel.
    """
    first_last = torch.stack([offsets[0], offsets[-1]])
    expected_ends = torch.tensor([0, total], device=offsets.device)
    bad_ends = first_last != expected_ends
    checks.add(
        bad_ends,
        lambda: f"{name}: starts at {int(offsets[0])} and ends at {int(offsets[-1])}; "
        f"expected 0 and {total} (the length of {what})",
    )
    decreasing = torch.zeros_like(offsets, dtype=torch.bool)
    torch.lt(offsets[1:], offsets[:-1], out=decreasing[1:])
    checks.add(
        decreasing,
        lambda: _checks.first_bad(
            name, offsets, decreasing, f"a non-decreasing sequence (>= {name}[i-1], the offset before it)"
        ),
    )
    # Implied by the two checks above; stated anyway so the bound the kernel relies on is explicit
    # (one min/max over S + 1 values).
    checks.out_of_range(name, offsets, 0, total + 1, note=f" (an offset into {what}, at most {total})")


def splice_rubric(
    ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    slots: torch.Tensor,
    rubric_ids: torch.Tensor,
    rubric_cu: torch.Tensor,
    rubric_index: torch.Tensor,
):
    """Insert rubric j = rubric_index[s] before local position slots[s] of each sequence s.

    ids [L] int64/int32 packed as ids[cu_seqlens[s]:cu_seqlens[s+1]]; cu_seqlens [S+1] int64;
    slots [S] int64 with 0 <= slot <= length (checked only where rubric_index >= 0);
    rubric_ids [R] (dtype of ids) packed by rubric_cu [J+1] int64; rubric_index [S] int64 in
    [-1, J) (-1: copy the sequence unchanged). Returns (new_ids, new_cu_seqlens, pos_map) with
    pos_map[p] [L] int64 the new global position of old token p. One host sync on CUDA.
    """
    ids = _checks.tensor("ids", ids, dtypes=_ID_DTYPES, ndim=1)
    device = ids.device

    def index_tensor(name, value):
        return _checks.tensor(name, value, dtypes=(torch.int64,), ndim=1, device=device, device_of="ids")

    cu_seqlens = index_tensor("cu_seqlens", cu_seqlens)
    slots = index_tensor("slots", slots)
    rubric_ids = _checks.tensor(
        "rubric_ids", rubric_ids, dtypes=(ids.dtype,), ndim=1, device=device, device_of="ids"
    )
    rubric_cu = index_tensor("rubric_cu", rubric_cu)
    rubric_index = index_tensor("rubric_index", rubric_index)
    if cu_seqlens.shape[0] < 1:
        raise ValueError("cu_seqlens: is empty; expected S + 1 >= 1 offsets starting at 0")
    if rubric_cu.shape[0] < 1:
        raise ValueError("rubric_cu: is empty; expected J + 1 >= 1 offsets starting at 0")
    num_seqs = cu_seqlens.shape[0] - 1
    num_rubrics = rubric_cu.shape[0] - 1
    _checks.length("slots", slots, num_seqs, "one slot per sequence, len(cu_seqlens) - 1")
    _checks.length(
        "rubric_index", rubric_index, num_seqs, "one rubric index per sequence, len(cu_seqlens) - 1"
    )

    checks = _checks.ValueChecks()
    _check_offsets(checks, "cu_seqlens", cu_seqlens, ids.shape[0], "ids")
    _check_offsets(checks, "rubric_cu", rubric_cu, rubric_ids.shape[0], "rubric_ids")
    checks.out_of_range("rubric_index", rubric_index, -1, num_rubrics, note=" (-1 for no rubric)")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    has_rubric = rubric_index >= 0
    bad_slot = has_rubric & ((slots < 0) | (slots > lengths))
    checks.add(
        bad_slot, lambda: _checks.first_bad("slots", slots, bad_slot, "0 <= slot <= that sequence's length")
    )
    rubric_lengths = rubric_cu[1:] - rubric_cu[:-1]
    if num_rubrics > 0:
        added = torch.where(has_rubric, rubric_lengths[rubric_index.clamp(0, num_rubrics - 1)], 0)
    else:
        added = torch.zeros_like(lengths)
    new_cu_seqlens = torch.zeros_like(cu_seqlens)
    torch.cumsum(lengths + added, dim=0, out=new_cu_seqlens[1:])
    (new_length,) = checks.run(fetch=[new_cu_seqlens[-1]])

    kind = _backend.native_kind(device)
    if kind is None:
        _backend.warn_reference("splice_rubric")
        return reference.splice_rubric(ids, cu_seqlens, slots, rubric_ids, rubric_cu, rubric_index)
    new_ids = torch.empty(new_length, dtype=ids.dtype, device=device)
    pos_map = torch.empty(ids.shape[0], dtype=torch.int64, device=device)
    if num_seqs > 0 and new_length > 0:
        args = (
            ids.data_ptr(), ids.element_size(), cu_seqlens.data_ptr(), num_seqs, slots.data_ptr(),
            rubric_ids.data_ptr(), rubric_cu.data_ptr(), rubric_index.data_ptr(), new_cu_seqlens.data_ptr(),
        )  # fmt: skip
        if kind == "cpu":
            _backend._C.splice_rubric_cpu(
                *args, new_ids.data_ptr(), pos_map.data_ptr(), _backend.num_threads()
            )
        else:
            _backend._C.splice_rubric_cuda(
                *args, new_length, new_ids.data_ptr(), pos_map.data_ptr(), *_backend.cuda_launch_args(ids)
            )
    return new_ids, new_cu_seqlens, pos_map
