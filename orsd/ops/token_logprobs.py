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
    temperature = _checks.real("temperature", temperature, positive=True)
    return logits, targets, mask, temperature


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
    (all rows). Returns lp [T] f32, or (lp, lse) with lse[t] = logsumexp(logits[t] / temperature)
    when return_lse. No T x V tensor is allocated; not differentiable. One host sync on CUDA (the
    target range check).
    """
    logits, targets, mask, temperature = _validate(logits, targets, mask, temperature)
    num_tokens, vocab_size = logits.shape
    checks = _checks.ValueChecks()
    checks.out_of_range("targets", targets, 0, vocab_size, where=mask, note=" on every unmasked row")
    checks.run()

    kind = _backend.native_kind(logits.device)
    if kind is None:
        _backend.warn_reference("token_logprobs")
        return reference.token_logprobs(logits, targets, mask, temperature, return_lse=return_lse)

    out = torch.empty(num_tokens, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(out) if return_lse else None
    if num_tokens > 0:
        args = (
            logits.data_ptr(), _backend.DTYPE_CODES[logits.dtype], num_tokens, vocab_size,
            targets.data_ptr(), _backend.ptr(mask), temperature, out.data_ptr(), _backend.ptr(lse),
        )  # fmt: skip
        if kind == "cpu":
            _backend._C.token_logprobs_cpu(*args, _backend.num_threads())
        else:
            _backend._C.token_logprobs_cuda(*args, *_backend.cuda_launch_args(logits))
    return (out, lse) if return_lse else out
