"""shape_advantages: ORSD's token advantage A = A_GRPO + alpha * e * delta, where delta is the
gap between the response token's log-prob with and without the rubric in context."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference


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
    """Per position p of the plain packing: delta = lp_rubric[pos_map[p]] - lp_plain[p];
    valid = response_mask[p] & eligible[seq_ids[p]] & isfinite(delta);
    adv = seq_adv[seq] + alpha * delta where valid, seq_adv[seq] on other response positions,
    0 off the response; delta is 0 where not valid.

    lp_plain [L] f32, lp_rubric [L'] f32, pos_map [L] int64 in [0, L'), response_mask [L] bool,
    seq_ids [L] int64 in [0, S), seq_adv [S] f32, alpha finite as an f32 (|alpha| <= 3.4e38),
    eligible [S] bool.
    Returns (adv [L] f32, delta [L] f32, valid [L] bool). One host sync on CUDA (range checks).
    """
    lp_plain = _checks.tensor("lp_plain", lp_plain, dtypes=(torch.float32,), ndim=1)
    device = lp_plain.device

    def same_device(name, value, dtype):
        return _checks.tensor(name, value, dtypes=(dtype,), ndim=1, device=device, device_of="lp_plain")

    lp_rubric = same_device("lp_rubric", lp_rubric, torch.float32)
    pos_map = same_device("pos_map", pos_map, torch.int64)
    response_mask = same_device("response_mask", response_mask, torch.bool)
    seq_ids = same_device("seq_ids", seq_ids, torch.int64)
    seq_adv = same_device("seq_adv", seq_adv, torch.float32)
    eligible = same_device("eligible", eligible, torch.bool)
    alpha = _checks.real("alpha", alpha, f32=True)  # the kernels take alpha as an f32
    length = lp_plain.shape[0]
    for name, value in (("pos_map", pos_map), ("response_mask", response_mask), ("seq_ids", seq_ids)):
        _checks.length(name, value, length, "one entry per position of lp_plain")
    _checks.length("eligible", eligible, seq_adv.shape[0], "one flag per sequence, len(seq_adv)")

    checks = _checks.ValueChecks()
    checks.out_of_range("pos_map", pos_map, 0, lp_rubric.shape[0], note=" (a position in lp_rubric)")
    checks.out_of_range("seq_ids", seq_ids, 0, seq_adv.shape[0], note=" (a sequence of seq_adv)")
    checks.run()

    kind = _backend.native_kind(device)
    if kind is None:
        _backend.warn_reference("shape_advantages")
        return reference.shape_advantages(
            lp_plain, lp_rubric, pos_map, response_mask, seq_ids, seq_adv, alpha, eligible
        )
    adv = torch.empty(length, dtype=torch.float32, device=device)
    delta = torch.empty_like(adv)
    valid = torch.empty(length, dtype=torch.bool, device=device)
    if length > 0:
        args = (
            lp_plain.data_ptr(), lp_rubric.data_ptr(), pos_map.data_ptr(), response_mask.data_ptr(),
            seq_ids.data_ptr(), seq_adv.data_ptr(), alpha, eligible.data_ptr(), length,
            adv.data_ptr(), delta.data_ptr(), valid.data_ptr(),
        )  # fmt: skip
        if kind == "cpu":
            _backend._C.shape_advantages_cpu(*args, _backend.num_threads())
        else:
            _backend._C.shape_advantages_cuda(*args, *_backend.cuda_launch_args(lp_plain))
    return adv, delta, valid
