"""fused_token_logprobs: token_logprobs of hidden @ weight.T without ever holding the T x V
logits. The vocabulary (and, for long inputs, the tokens) is cut into chunks; each chunk's logits
come from one f32-output GEMM and are folded into a per-token online log-sum-exp by the native
kernel (running max from -inf, f64 running sum, the target's logit)."""

from __future__ import annotations

import torch

from . import _backend, _blas, _checks, reference
from .token_logprobs import nan_where_scaled_max_overflows

DEFAULT_CHUNK_SIZE = 8192
"""Vocabulary columns per chunk when chunk_size is None."""

CHUNK_ELEMENTS = {"cpu": 8 * 2**20, "cuda": 16 * 2**20}
"""Logits per chunk (f32): 32 MiB on CPU, 64 MiB on CUDA; token rows per chunk follow from it."""


def _validate(hidden, weight, targets, mask, temperature, chunk_size):
    hidden = _checks.tensor("hidden", hidden, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    device = hidden.device
    weight = _checks.tensor(
        "weight", weight, dtypes=(hidden.dtype,), ndim=2, device=device, device_of="hidden"
    )
    num_tokens, hidden_size = hidden.shape
    if weight.shape[1] != hidden_size:
        raise ValueError(
            f"weight: shape {tuple(weight.shape)} does not fit hidden {tuple(hidden.shape)}; "
            f"expected (V, {hidden_size})"
        )
    if weight.shape[0] == 0:
        raise ValueError("weight: has 0 rows (shape (0, H)); expected a vocabulary of V >= 1")
    targets = _checks.tensor(
        "targets", targets, dtypes=(torch.int64,), ndim=1, device=device, device_of="hidden"
    )
    _checks.length("targets", targets, num_tokens, "one target per row of hidden")
    if mask is not None:
        mask = _checks.tensor("mask", mask, dtypes=(torch.bool,), ndim=1, device=device, device_of="hidden")
        _checks.length("mask", mask, num_tokens, "one flag per row of hidden")
    temperature = _checks.temperature("temperature", temperature)
    if chunk_size is None:
        chunk_size = DEFAULT_CHUNK_SIZE
    chunk_size = _checks.integer("chunk_size", chunk_size, minimum=1)
    return hidden, weight, targets, mask, temperature, chunk_size


# ---- f32-output GEMM: out = a @ b.T with a [m, k], b [n, k] -------------------------------------
# Low-precision inputs must not be rounded back to bf16/f16 at the output (the contract is f32
# logits from the given values), so the GEMM needs an f32 output: MKL's (ops/_blas.py) on CPU,
# cuBLAS's through torch.mm's out_dtype on CUDA.

_cuda_out_dtype_cache: dict[torch.dtype, bool] = {}


def _cuda_has_f32_out(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch.mm(..., out_dtype=torch.float32) (cuBLAS, low-precision in, f32 out) works
    for `dtype`; probed once on tiny tensors so a real error (e.g. out of memory) is never mistaken
    for a missing feature."""
    if dtype not in _cuda_out_dtype_cache:
        a = torch.ones(2, 8, dtype=dtype, device=device)
        try:
            ok = torch.mm(a, a.T, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            ok = False
        _cuda_out_dtype_cache[dtype] = ok
    return _cuda_out_dtype_cache[dtype]


def _gemm_f32(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """a @ b.T in f32 (into `out` on CPU)."""
    if a.shape[1] == 0:
        # H = 0: every logit is an empty sum, 0 (as in the reference's f32 matmul). MKL would be
        # handed lda = 0, which it rejects without touching `out`, leaving it uninitialised.
        if out is None:
            return torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32, device=a.device)
        return out.zero_()
    if a.dtype == torch.float32:
        return torch.mm(a, b.T, out=out) if out is not None else torch.mm(a, b.T)
    if a.is_cuda:
        if _cuda_has_f32_out(a.dtype, a.device):
            return torch.mm(a, b.T, out_dtype=torch.float32)
        return torch.mm(a.float(), b.float().T)
    function = _blas.mkl_gemm(a.dtype)
    fits_cblas = max(a.shape[0], a.shape[1], b.shape[0]) <= _blas.CBLAS_INT_MAX
    if function is not None and out is not None and fits_cblas:
        _blas.call_mkl(function, a, b, out)
        return out
    return torch.mm(a.float(), b.float().T, out=out)


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
    """token_logprobs(hidden @ weight.T, targets, mask, temperature) with f32 logits, never
    allocating T x V.

    hidden [T, H] and weight [V, H] (the LM head) share one dtype of f32/f16/bf16; targets [T]
    int64; mask [T] bool or None. chunk_size: vocabulary columns per chunk (default 8192); token
    rows per chunk keep a chunk at CHUNK_ELEMENTS f32 values. Masked rows are still multiplied
    (pass only the rows you need). H = 0 is allowed (every logit 0: lp = -log V). temperature in
    [1e-6, 3e38]. Returns lp [T] f32, or (lp, lse) when return_lse.
    """
    hidden, weight, targets, mask, temperature, chunk_size = _validate(
        hidden, weight, targets, mask, temperature, chunk_size
    )
    return_lse = _checks.flag("return_lse", return_lse)
    num_tokens = hidden.shape[0]
    vocab_size = weight.shape[0]
    checks = _checks.ValueChecks()
    checks.out_of_range("targets", targets, 0, vocab_size, where=mask, note=" on every unmasked row")
    checks.run()

    kind = _backend.native_kind(hidden.device)
    if kind is None:
        _backend.warn_reference("fused_token_logprobs")
        return reference.fused_token_logprobs(
            hidden, weight, targets, mask, temperature, chunk_size, return_lse=return_lse
        )

    device = hidden.device
    out = torch.empty(num_tokens, dtype=torch.float32, device=device)
    lse = torch.empty_like(out)  # always: it flags the rows nan_where_scaled_max_overflows fixes
    if num_tokens > 0:
        with torch.no_grad():
            _run_chunks(kind, hidden, weight, targets, mask, temperature, chunk_size, out, lse)
        nan_where_scaled_max_overflows(out, lse)
    return (out, lse) if return_lse else out


def _run_chunks(kind, hidden, weight, targets, mask, temperature, chunk_size, out, lse) -> None:
    num_tokens, vocab_size = hidden.shape[0], weight.shape[0]
    cols = min(chunk_size, vocab_size)
    rows = max(1, min(num_tokens, CHUNK_ELEMENTS[kind] // cols))
    state_max = torch.full((num_tokens,), float("-inf"), dtype=torch.float32, device=hidden.device)
    state_sum = torch.zeros(num_tokens, dtype=torch.float64, device=hidden.device)
    state_target = torch.zeros(num_tokens, dtype=torch.float32, device=hidden.device)
    buffer = torch.empty(rows * cols, dtype=torch.float32) if kind == "cpu" else None
    C = _backend._C
    if kind == "cpu":
        launch = (_backend.num_threads(),)
        update, finalize = C.fused_lse_update_cpu, C.fused_lse_finalize_cpu
    else:
        launch = _backend.cuda_launch_args(hidden)
        update, finalize = C.fused_lse_update_cuda, C.fused_lse_finalize_cuda

    # At T > 1 the kernel's x - max (formed before the 1/T scaling) can overflow f32 where the
    # reference's x / T - max / T does not (logits beyond +-1.7e38): divide each chunk by T in
    # place instead (it is in cache, so nearly free) and run the kernel at T = 1, the reference's
    # order. At T <= 1 such a difference overflows in the reference too.
    prescale = temperature > 1.0
    kernel_temperature = 1.0 if prescale else temperature
    # Vocabulary outermost: each weight chunk is read once, the (smaller) hidden once per chunk.
    for v0 in range(0, vocab_size, cols):
        w = weight[v0 : v0 + cols]
        for t0 in range(0, num_tokens, rows):
            t1 = min(num_tokens, t0 + rows)
            target_buffer = (
                None if buffer is None else buffer[: (t1 - t0) * w.shape[0]].view(t1 - t0, w.shape[0])
            )
            logits = _gemm_f32(hidden[t0:t1], w, target_buffer)
            if prescale:
                logits.div_(temperature)
            update(
                logits.data_ptr(), t1 - t0, w.shape[0], v0, targets[t0:].data_ptr(),
                0 if mask is None else mask[t0:].data_ptr(), kernel_temperature,
                state_max[t0:].data_ptr(), state_sum[t0:].data_ptr(), state_target[t0:].data_ptr(), *launch,
            )  # fmt: skip
    finalize(
        num_tokens, _backend.ptr(mask), kernel_temperature, state_max.data_ptr(), state_sum.data_ptr(),
        state_target.data_ptr(), out.data_ptr(), _backend.ptr(lse), *launch,
    )  # fmt: skip
