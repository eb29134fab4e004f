"""Linear layers with their bf16 weights packed once for oneDNN, for the decode steps of a CPU run.

Under CPU bf16 autocast every `F.linear` hands oneDNN a plain row-major weight, which it reorders
into its blocked (AMX / AVX-512-BF16) layout before multiplying, at every call. For a decode step's
few rows that reorder is a large share of the matmul (docs/performance.md). `packed_linears` reorders
each weight once
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU freezing uses) and runs the small
matmuls on the packed copy; the results are bitwise those of autocast's matmul (tests check it).

It serves only what it was measured on: a CPU, bf16 autocast on, no gradient wanted, few rows
(`MAX_ROWS`); every other call (prefill, replay's long forwards, the update) takes the layer's own
forward. The packs live as long as the context (the weights change at every update).
"""

from __future__ import annotations

import contextlib
import functools

import torch

#: rows (tokens in the call) up to which a matmul uses the packed weight; a packed layout chosen for
#: few rows is slow for many (oneDNN reorders it back), and at hundreds of rows the per-call reorder
#: is a small part of the matmul anyway
MAX_ROWS = 16


def available(model) -> bool:
    """A CPU model, torch built with oneDNN, bf16 autocast active now, and a CPU on which oneDNN packs
    bf16 weights (`packs_bf16`)."""
    parameter = next(model.parameters(), None)
    return (parameter is not None and parameter.device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and packs_bf16())


@functools.cache
def packs_bf16() -> bool:
    """Whether oneDNN packs a bf16 weight on this CPU: it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT and
    refuses otherwise ("bf16 path needs the cpu support ..."). Asked of oneDNN itself with one small
    weight, once per process, rather than read from flags that torch does not expose. On an AVX2-only
    CPU a run that asks for `model.autocast: bfloat16` (auto picks fp32 there) then decodes with the
    model's own forwards instead of stopping at the first bundle."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


@contextlib.contextmanager
def packed_linears(model, rows_hint: int = 4):
    """Within the context, the bias-free nn.Linear layers of `model` multiply few-row, no-grad bf16
    inputs with a weight packed once for `rows_hint` rows; a no-op where `available` is False or
    `rows_hint` is above MAX_ROWS (no call would use the packs)."""
    if rows_hint > MAX_ROWS or not available(model):
        yield
        return
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is None
              and m.weight.dim() == 2 and m.weight.dtype in (torch.float32, torch.bfloat16)
              and not hasattr(m.weight, "ds_id")  # a ZeRO-3 weight is a placeholder outside its hooks
              and "forward" not in vars(m)]  # a forward set on the instance (accelerate's hooks) is kept
    packs: dict[int, torch.Tensor] = {}  # one per distinct weight (a tied head shares the embedding's)
    for layer in layers:
        if id(layer.weight) not in packs:
            packs[id(layer.weight)] = torch.ops.mkldnn._reorder_linear_weight(
                layer.weight.detach().to(torch.bfloat16), rows_hint)
        layer.forward = _packed_forward(layer, packs[id(layer.weight)])
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again
        packs.clear()


def _packed_forward(layer: torch.nn.Linear, packed: torch.Tensor):
    plain = type(layer).forward.__get__(layer)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if (x.numel() // max(x.shape[-1], 1) > MAX_ROWS
                or (torch.is_grad_enabled() and (x.requires_grad or layer.weight.requires_grad))
                or not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") != torch.bfloat16):
            return plain(x)
        return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), packed, None, "none", [], "")

    forward.packed = True
    return forward


def is_packed(layer) -> bool:
    """Whether `layer` runs on a packed weight now (inside `packed_linears`)."""
    return getattr(vars(layer).get("forward"), "packed", False)
