"""token_logprobs: log-probability of each chosen token under a temperature-scaled softmax, the
quantity paired replay scores twice (with and without the rubric) to form ORSD's delta."""

from __future__ import annotations

import torch

from . import _backend, _checks, reference


def _validate(logits, targets, mask, temperature):
    logits = _checks.tensor("logits", logits, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    device = logits.device
    targets = _checks.tensor(
        "targets", targets, dtypes=(torch.int64,), ndim=1, device=device, device_of="logits"
    )
    num_tokens, vocab_size = logits.shape
    if vocab_size == 0:
        raise ValueError("logits: has 0 vocabulary columns (shape (T, 0)); expected V >= 1")
    _checks.length("targets", targets, num_tokens, "one target per row of logits")
    if mask is not None:
        mask = _checks.tensor("mask", mask, dtypes=(torch.bool,), ndim=1, device=device, device_of="logits")
        _checks.length("mask", mask, num_tokens, "one flag per row of logits")
    temperature = _checks.temperature("temperature", temperature)
    return logits, targets, mask, temperature


PRESCALE_CHUNK_ELEMENTS = 4 * 2**20
"""Logits per row chunk (f32, 16 MiB) when the rows are divided by T before the kernel."""


def nan_where_scaled_max_overflows(lp: torch.Tensor, lse: torch.Tensor) -> None:
    """Make rows whose scaled max left the f32 range NaN, as the contract (and torch) has them.

    The kernels test max(x) for finiteness and then form max(x) / T; for |max(x)| > 3.4e38 * T
    (huge logits at T < 1) that quotient is +-inf, which torch.log_softmax(x / T) turns into NaN
    for the whole row, but the kernels into an infinite lse and a -inf or finite lp. An lse is
    otherwise finite or NaN (max / T plus a log of a sum in [1, V]), so an infinite lse marks
    exactly those rows. In place; no host sync.
    """
    overflow = torch.isinf(lse)
    lp.masked_fill_(overflow, float("nan"))
    lse.masked_fill_(overflow, float("nan"))


def differences_may_overflow(logits: torch.Tensor, temperature: float) -> torch.Tensor | None:
    """A 0-d bool on the device: True when the kernels' x - max (formed before the 1/T scaling)
    may overflow f32 while the reference's x / T - max / T does not. That takes T > 1 and a row
    whose finite logits span more than 3.4e38, so some |x| > 1.7e38 (or a -inf or NaN, which this
    one-pass test cannot tell apart). None when it cannot happen (T <= 1, f16 logits, no rows).
    """
    if temperature <= 1.0 or logits.dtype == torch.float16 or logits.numel() == 0:
        return None
    low, high = torch.aminmax(logits)
    half = _checks.F32_MAX / 2
    return ~((high <= half) & (low >= -half))  # a NaN compares False: flagged too


def _run_kernel(kind, logits, targets, mask, temperature, out, lse) -> None:
    num_tokens, vocab_size = logits.shape
    args = (
        logits.data_ptr(), _backend.DTYPE_CODES[logits.dtype], num_tokens, vocab_size,
        targets.data_ptr(), _backend.ptr(mask), temperature, out.data_ptr(), lse.data_ptr(),
    )  # fmt: skip
    if kind == "cpu":
        _backend._C.token_logprobs_cpu(*args, _backend.num_threads())
    else:
        _backend._C.token_logprobs_cuda(*args, *_backend.cuda_launch_args(logits))


def _run_prescaled(kind, logits, targets, mask, temperature, out, lse) -> None:
    """The kernel at T = 1 on f32 chunks of rows divided by T first, i.e. in the reference's
    order: a logit difference that overflows then overflows on both sides alike."""
    num_tokens, vocab_size = logits.shape
    rows = max(1, PRESCALE_CHUNK_ELEMENTS // vocab_size)
    for t0 in range(0, num_tokens, rows):
        t1 = min(num_tokens, t0 + rows)
        scaled = logits[t0:t1].float() / temperature
        chunk_mask = None if mask is None else mask[t0:t1]
        _run_kernel(kind, scaled, targets[t0:t1], chunk_mask, 1.0, out[t0:t1], lse[t0:t1])


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    return_lse: bool = False,
):
    """lp[t] = log_softmax(logits[t].float() / temperature)[targets[t]] where mask[t], else 0.0.

    logits [T, V] f32/f16/bf16, targets [T] int64 (any value on masked rows), mask [T] bool or None
    (all rows), temperature a number in [1e-6, 3e38]. Returns lp [T] f32, or (lp, lse) with
    lse[t] = logsumexp(logits[t] / temperature) when return_lse; a row whose scaled max is not
    finite gives NaN. No T x V tensor is allocated; not differentiable. One host sync on CUDA (the
    target range check). At T > 1 with bf16/f32 logits one more read of the logits checks that no
    logit difference can overflow before the scaling (else the rows are scaled first, in chunks).
    """
    logits, targets, mask, temperature = _validate(logits, targets, mask, temperature)
    return_lse = _checks.flag("return_lse", return_lse)
    num_tokens, vocab_size = logits.shape
    checks = _checks.ValueChecks()
    checks.out_of_range("targets", targets, 0, vocab_size, where=mask, note=" on every unmasked row")
    kind = _backend.native_kind(logits.device)
    risky = differences_may_overflow(logits, temperature) if kind is not None else None
    fetched = checks.run(fetch=[] if risky is None else [risky])  # on the same sync as the checks
    if kind is None:
        _backend.warn_reference("token_logprobs")
        return reference.token_logprobs(logits, targets, mask, temperature, return_lse=return_lse)

    out = torch.empty(num_tokens, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(out)  # always: it flags the rows nan_where_scaled_max_overflows fixes
    if num_tokens > 0:
        if fetched and fetched[0]:
            _run_prescaled(kind, logits, targets, mask, temperature, out, lse)
        else:
            _run_kernel(kind, logits, targets, mask, temperature, out, lse)
        nan_where_scaled_max_overflows(out, lse)
    return (out, lse) if return_lse else out
