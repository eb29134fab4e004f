"""lm_head_logprobs: differentiable log-probs (and entropies) of the target tokens straight from the
final hidden states and the LM head, never holding the T x V logits, in the forward or the backward.

The native forward walks the vocabulary in blocks (one GEMM per block, an online log-sum-exp and
entropy per token); the native backward recomputes each block's logits and turns them into
grad_hidden and grad_weight (csrc/include/orsd/lm_head_logprobs.h has the math). One
torch.autograd.Function ties the two together.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from . import _backend, _blas, _checks

FALLBACK_CHUNK_TOKENS = 1024
"""Tokens per checkpointed chunk in the pure-torch fallback (bounds its memory to chunk x V)."""


def lm_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    softcap: float = 0.0,
    logit_scale: float = 1.0,
    return_entropy: bool = False,
):
    """lp[t] = log_softmax(y[t])[targets[t]] with y = logit_scale * cap(hidden @ weight.T) / temperature,
    cap(z) = softcap * tanh(z / softcap) when softcap > 0 (HF's final_logit_softcapping, then
    logit_scale, as soft_cap_and_scale), differentiable w.r.t. hidden and weight.

    hidden [T, H] and weight [V, H] (the LM head) share one dtype of f32/f16/bf16; targets [T]
    int64 in [0, V). The logits are f32 from the given values. Returns lp [T] f32, or (lp, entropy)
    with entropy[t] = -sum_v p log p of the same distribution when return_entropy; the entropy is
    differentiable too (its gradient is exact, so an entropy bonus may be trained through it;
    detach it to use it as a metric). Gradients come back in the input dtype, summed in f32
    (dL/dz is rounded to the input dtype before the gradient GEMMs, as autograd of a bf16 model
    does); there is no double backward. No T x V tensor is allocated: the backward's largest
    scratch is dL/dz of one vocabulary block for all tokens (T x 1,024 on CPU, T x 4,096 on CUDA,
    input dtype) plus, for 16-bit inputs, grad_hidden in f32. A row whose logits hold a NaN or +inf
    gives NaN (and NaN gradients). One host sync on CUDA (the target range check).
    """
    hidden, weight, targets, temperature, softcap, logit_scale, scale = _validate(
        hidden, weight, targets, temperature, softcap, logit_scale
    )
    return_entropy = _checks.flag("return_entropy", return_entropy)
    checks = _checks.ValueChecks()
    checks.out_of_range("targets", targets, 0, weight.shape[0])
    checks.run()

    kind, reason = _native_kind(hidden)
    if kind is None:
        _warn_fallback(reason)
        return _torch_path(hidden, weight, targets, temperature, softcap, logit_scale, return_entropy)
    outputs = _LmHeadLogprobs.apply(hidden, weight, targets, scale, softcap, return_entropy, kind)
    return outputs if return_entropy else outputs[0]


def _validate(hidden, weight, targets, temperature, softcap, logit_scale):
    hidden = _checks.tensor("hidden", hidden, dtypes=_checks.FLOAT_DTYPES, ndim=2)
    device = hidden.device
    weight = _checks.tensor("weight", weight, dtypes=(hidden.dtype,), ndim=2, device=device, device_of="hidden")
    num_tokens, hidden_size = hidden.shape
    vocab_size = weight.shape[0]
    if hidden_size == 0:
        raise ValueError(f"hidden: has 0 columns (shape {tuple(hidden.shape)}); expected H >= 1")
    if weight.shape[1] != hidden_size:
        raise ValueError(
            f"weight: shape {tuple(weight.shape)} does not fit hidden {tuple(hidden.shape)}; "
            f"expected (V, {hidden_size})"
        )
    if vocab_size == 0:
        raise ValueError(f"weight: has 0 rows (shape {tuple(weight.shape)}); expected a vocabulary of V >= 1")
    for name, size, what in (("hidden", num_tokens, "T"), ("hidden", hidden_size, "H"), ("weight", vocab_size, "V")):
        if size > _blas.CBLAS_INT_MAX:
            raise ValueError(
                f"{name}: {what} = {size} exceeds {_blas.CBLAS_INT_MAX}, the largest size the GEMMs take"
            )
    targets = _checks.tensor("targets", targets, dtypes=(torch.int64,), ndim=1, device=device, device_of="hidden")
    _checks.length("targets", targets, num_tokens, "one target per row of hidden")
    temperature = _checks.temperature("temperature", temperature)
    softcap = _checks.real("softcap", softcap, nonnegative=True)
    logit_scale = _checks.real("logit_scale", logit_scale, positive=True)

    # The kernels take y = scale * z (or scale * softcap * tanh(z / softcap)) with f32 constants.
    scale = logit_scale / temperature
    f32 = torch.finfo(torch.float32)
    if not f32.tiny <= scale <= f32.max:
        raise ValueError(
            f"logit_scale: logit_scale / temperature = {scale:g} must lie in the f32 range "
            f"[{f32.tiny:g}, {f32.max:g}] (logit_scale {logit_scale:g}, temperature {temperature:g})"
        )
    if softcap > 0 and not (f32.tiny <= 1 / softcap <= f32.max and scale * softcap <= f32.max):
        raise ValueError(
            f"softcap: {softcap:g} is outside what f32 kernels can apply with scale {scale:g}; "
            "expected 0 (off) or a cap whose inverse and product with logit_scale / temperature are f32-finite"
        )
    return hidden, weight, targets, temperature, softcap, logit_scale, scale


# ---- which implementation runs ------------------------------------------------------------------

_warned_fallback = False


def _native_kind(hidden: torch.Tensor) -> tuple[str | None, str]:
    """("cpu" | "cuda", "") when the native kernels serve `hidden`'s device, else (None, why not)."""
    kind = _backend.native_kind(hidden.device)
    if kind is None:
        return None, ""  # orsd._C missing or its CUDA kernels unusable: _backend words the warning
    C = _backend._C
    if not hasattr(C, f"lm_head_logprobs_forward_{kind}"):
        return None, "orsd._C was built before lm_head_logprobs existed (rebuild: pip install -e .)"
    if kind == "cpu" and _blas.cpu_gemm(hidden.dtype) is None:
        return None, (
            f"the torch in this process exports no usable MKL GEMM for {hidden.dtype} "
            "(libtorch_cpu: cblas_gemm_bf16bf16f32 / cblas_gemm_f16f16f32 / sgemm_)"
        )
    return kind, ""


def _warn_fallback(reason: str) -> None:
    """The chunked torch path stands in: say so once per process, loudly (never silently)."""
    global _warned_fallback
    if not reason:
        _backend.warn_reference("lm_head_logprobs")
        return
    if _warned_fallback:
        return
    _warned_fallback = True
    warnings.warn(
        f"orsd.ops.lm_head_logprobs: using the pure-torch path (checkpointed chunks of "
        f"{FALLBACK_CHUNK_TOKENS} tokens) because {reason}; results are the same, speed and memory are not",
        RuntimeWarning,
        stacklevel=3,
    )


# ---- which CUDA GEMM the kernels use (ops/_blas.py finds cuBLAS's) -----------------------------

CUDA_GEMMS = ("cublas", "own")
"""cublas: cublasGemmEx of the libcublas torch loaded, on torch's handle (first choice when found
and self-tested); own: the module's WMMA/FFMA kernels (the fallback, and a reference)."""

_cuda_gemm_choice = os.environ.get("ORSD_LM_HEAD_CUDA_GEMM", "cublas")
_cublas_gemm_ex: int | None | bool = False  # False: not looked up yet; None: unusable


def cuda_gemm() -> str:
    """The GEMM the CUDA kernels use: "cublas" or "own" (cublas only where it was found and passed
    its self-test; a request for it falls back to own, with one warning)."""
    return "cublas" if _cuda_gemm_choice == "cublas" and _cublas() is not None else "own"


def set_cuda_gemm(name: str) -> None:
    """Choose the CUDA GEMM ("cublas" | "own"); ORSD_LM_HEAD_CUDA_GEMM sets it at import."""
    global _cuda_gemm_choice
    if name not in CUDA_GEMMS:
        raise ValueError(f"cuda_gemm: {name!r} is not one of {', '.join(CUDA_GEMMS)}")
    _cuda_gemm_choice = name


if _cuda_gemm_choice not in CUDA_GEMMS:
    raise ValueError(f"ORSD_LM_HEAD_CUDA_GEMM: {_cuda_gemm_choice!r} is not one of {', '.join(CUDA_GEMMS)}")


def _cuda_blas(device: torch.device) -> tuple[int, int]:
    """(cublasGemmEx address, torch's cuBLAS handle for `device`, bound to its current stream), or
    (0, 0) for the own kernels. current_blas_handle() sets the handle's stream to the current one,
    which is the stream the kernels are launched on (_backend.cuda_launch_args)."""
    gemm_ex = _cublas() if _cuda_gemm_choice == "cublas" else None
    if gemm_ex is None:
        return 0, 0
    with torch.cuda.device(device):
        return gemm_ex, torch.cuda.current_blas_handle()


def _cublas() -> int | None:
    global _cublas_gemm_ex
    if _cublas_gemm_ex is False:
        _cublas_gemm_ex = _blas.find_cublas()
        if _cublas_gemm_ex is None and torch.cuda.is_available():
            warnings.warn(
                "orsd.ops.lm_head_logprobs: cuBLAS's cublasGemmEx was not found in this process or failed "
                "its self-test; the CUDA kernels use their own (slower) GEMM",
                RuntimeWarning,
                stacklevel=4,
            )
    return _cublas_gemm_ex


# ---- the autograd function around the two native calls ----------------------------------------


class _LmHeadLogprobs(torch.autograd.Function):
    """Forward: native lp, lse (saved) and entropy. Backward: native grad_hidden / grad_weight
    from recomputed logits, only for the inputs that need a gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, scale, softcap, return_entropy, kind):
        num_tokens, hidden_size = hidden.shape
        lp = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(lp)
        entropy = torch.empty_like(lp) if return_entropy else None
        shape = (num_tokens, weight.shape[0], hidden_size, _backend.DTYPE_CODES[hidden.dtype])
        # When a backward will follow, the scratch is sized for it now and handed over: one
        # allocation instead of two (on CPU, a freed forward scratch would stay resident in the
        # malloc heap under the backward's), held only until the backward, which comes right after
        # the loss for the last layer of a model.
        backward_follows = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        workspace = _workspace(kind, shape, hidden.device, backward=False, at_least_backward=backward_follows)
        args = (hidden.data_ptr(), weight.data_ptr(), *shape, targets.data_ptr(), scale, softcap,
                lp.data_ptr(), lse.data_ptr(), _backend.ptr(entropy))  # fmt: skip
        _launch(kind, "forward", args, hidden, workspace)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.scale, ctx.softcap, ctx.kind, ctx.shape = scale, softcap, kind, shape
        ctx.workspace = workspace if backward_follows else None
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros to read
        return (lp, entropy) if return_entropy else (lp,)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_lp, grad_entropy=None):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        workspace, ctx.workspace = ctx.workspace, None
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_lp is None and grad_entropy is None) or not (want_hidden or want_weight):
            return None, None, None, None, None, None, None
        # Incoming gradients may be expanded views (e.g. of lp.sum()): the kernel reads dense f32.
        grad_lp = None if grad_lp is None else grad_lp.float().contiguous()
        grad_entropy = None if grad_entropy is None else grad_entropy.float().contiguous()
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.empty_like(weight) if want_weight else None
        needed = _workspace_bytes(ctx.kind, ctx.shape, backward=True)
        if workspace is None or workspace.numel() < needed:  # e.g. the thread count changed
            workspace = None  # release a too-small one before allocating
            workspace = _workspace(ctx.kind, ctx.shape, hidden.device, backward=True)
        args = (hidden.data_ptr(), weight.data_ptr(), *ctx.shape, targets.data_ptr(), ctx.scale, ctx.softcap,
                lse.data_ptr(), _backend.ptr(entropy), _backend.ptr(grad_lp), _backend.ptr(grad_entropy),
                _backend.ptr(grad_hidden), _backend.ptr(grad_weight))  # fmt: skip
        _launch(ctx.kind, "backward", args, hidden, workspace)
        return grad_hidden, grad_weight, None, None, None, None, None


def _workspace_bytes(kind: str, shape: tuple, *, backward: bool) -> int:
    C = _backend._C
    if kind == "cpu":
        return C.lm_head_logprobs_workspace_cpu(*shape, _backend.num_threads(), backward)
    return C.lm_head_logprobs_workspace_cuda(*shape, backward)


def _workspace(kind, shape, device, *, backward: bool, at_least_backward: bool = False) -> torch.Tensor:
    """Uninitialised scratch for the kernels (torch's allocator: stream-ordered on CUDA)."""
    size = _workspace_bytes(kind, shape, backward=backward)
    if at_least_backward:
        size = max(size, _workspace_bytes(kind, shape, backward=True))
    return torch.empty(size, dtype=torch.uint8, device=device)


def _launch(kind: str, direction: str, args: tuple, hidden: torch.Tensor, workspace: torch.Tensor) -> None:
    """Calls lm_head_logprobs_{direction}_{kind} with the device-specific trailing arguments (the
    thread count passed must be the one the CPU workspace was sized for: num_threads() again)."""
    function = getattr(_backend._C, f"lm_head_logprobs_{direction}_{kind}")
    if kind == "cpu":
        function(*args, _blas.cpu_gemm(hidden.dtype), workspace.data_ptr(), workspace.numel(), _backend.num_threads())
    else:
        function(*args, *_cuda_blas(hidden.device), workspace.data_ptr(), workspace.numel(),
                 *_backend.cuda_launch_args(hidden))  # fmt: skip


# ---- the pure-torch path (fallback only; the tests' spec is the full-logits reference) ---------


def _torch_path(hidden, weight, targets, temperature, softcap, logit_scale, return_entropy):
    """The same quantities with torch autograd: f32 logits in checkpointed token chunks."""
    lps, entropies = [], []
    # At least one (possibly empty) chunk, so that T = 0 still yields outputs attached to the graph.
    for start in range(0, max(1, hidden.shape[0]), FALLBACK_CHUNK_TOKENS):
        end = start + FALLBACK_CHUNK_TOKENS
        lp, entropy = checkpoint(
            _torch_chunk, hidden[start:end], weight, targets[start:end], temperature, softcap, logit_scale,
            use_reentrant=False,
        )  # fmt: skip
        lps.append(lp)
        entropies.append(entropy)
    lp, entropy = torch.cat(lps), torch.cat(entropies)
    return (lp, entropy) if return_entropy else lp


def _torch_chunk(hidden, weight, targets, temperature, softcap, logit_scale):
    logits = soft_cap_and_scale(hidden.float() @ weight.float().T, softcap, logit_scale)
    log_p = torch.log_softmax(logits / temperature, dim=-1)
    entropy = torch.special.entr(log_p.exp()).sum(-1)  # entr(0) = 0: -inf logits add nothing
    return log_p.gather(-1, targets[:, None]).squeeze(-1), entropy


def soft_cap_and_scale(logits: torch.Tensor, softcap: float | None, logit_scale: float | None) -> torch.Tensor:
    """cap(logits) = softcap * tanh(logits / softcap) (HF's final_logit_softcapping), then times
    logit_scale (Cohere's): the one order of every torch LM-head path, this module's fallback and
    orsd.train.head.final_logits (the model's two numbers); the kernels apply the same. A softcap or
    logit_scale of None or 0 skips its step."""
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits * logit_scale if logit_scale else logits
