"""The spec lm_head_logprobs is tested against (full f64 logits through torch autograd), the inputs
the tests draw, and the tolerances they hold it to; shared by test_lm_head_logprobs.py and
test_lm_head_choices.py."""

from __future__ import annotations

import torch

from orsd.ops import lm_head_logprobs

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(hidden, weight, targets, temperature=1.0, softcap=0.0, logit_scale=1.0):
    """The spec: full f64 logits of the given values, log_softmax, the target's entry, and the
    entropy -sum p log p (entr(0) = 0). Returns (lp, entropy, hidden_leaf, weight_leaf)."""
    hidden64 = hidden.detach().double().requires_grad_()
    weight64 = weight.detach().double().requires_grad_()
    logits = hidden64 @ weight64.T
    if softcap > 0:
        logits = torch.tanh(logits / softcap) * softcap
    log_p = torch.log_softmax(logits * logit_scale / temperature, dim=-1)
    lp = log_p.gather(-1, targets[:, None]).squeeze(-1)
    entropy = torch.special.entr(log_p.exp()).sum(-1)
    return lp, entropy, hidden64, weight64


def make_inputs(T, H, V, dtype, device, *, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * scale / max(H, 1) ** 0.5 * 3).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    return hidden.to(device).requires_grad_(), weight.to(device).requires_grad_(), targets.to(device)


# Gradient tolerance relative to the largest reference gradient: f32 is exact up to summation
# order; 16-bit inputs round dL/dz and the result to the input dtype (as torch autograd does).
GRAD_TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.5e-2, torch.float16: 3e-3}


def assert_close_scaled(got, want, dtype, what, floor=0.1):
    # The floor covers gradients that vanish exactly (e.g. V = 1: p = 1 at the target), where
    # rounding leaves ~1e-7 of |dL/dy| x |other operand| x logit_scale / T, the gradient's natural
    # scale: 0.1 of it (a constant 0.1 assumed unit inputs, and Hypothesis found T=12, H=1, V=1 at
    # temperature 0.7 on an Intel Xeon off by 2.8e-6 where 2e-6 was allowed, with |W| up to ~6).
    scale = max(want.abs().max().item() if want.numel() else 0.0, floor)
    tol = GRAD_TOLERANCE[dtype]
    torch.testing.assert_close(
        got.double().cpu(), want.cpu(), atol=tol * scale, rtol=tol, msg=lambda m: f"{what}: {m}"
    )


def check_against_reference(hidden, weight, targets, *, temperature=1.0, softcap=0.0, logit_scale=1.0, seed=1):
    """Forward values and both gradients through a random mix of lp and entropy."""
    lp, entropy = lm_head_logprobs(
        hidden, weight, targets, temperature=temperature, softcap=softcap, logit_scale=logit_scale,
        return_entropy=True,
    )  # fmt: skip
    ref_lp, ref_entropy, hidden64, weight64 = reference(hidden, weight, targets, temperature, softcap, logit_scale)
    assert lp.dtype == entropy.dtype == torch.float32 and lp.shape == entropy.shape == (hidden.shape[0],)
    torch.testing.assert_close(lp.double().cpu(), ref_lp.detach().cpu(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(entropy.double().cpu(), ref_entropy.detach().cpu(), atol=1e-4, rtol=1e-5)

    g = torch.Generator().manual_seed(seed)
    grad_lp = torch.randn(lp.shape, generator=g).to(lp.device)
    grad_entropy = torch.randn(lp.shape, generator=g).to(lp.device)
    hidden.grad = weight.grad = None
    (lp * grad_lp + entropy * grad_entropy).sum().backward()
    (ref_lp * grad_lp.double() + ref_entropy * grad_entropy.double()).sum().backward()
    assert hidden.grad.dtype == hidden.dtype and weight.grad.dtype == weight.dtype
    rate = max(grad_lp.abs().max().item(), grad_entropy.abs().max().item(), 1.0) if lp.numel() else 1.0
    rate *= logit_scale / temperature
    assert_close_scaled(hidden.grad, hidden64.grad, hidden.dtype, "grad_hidden", 0.1 * rate * largest(weight))
    assert_close_scaled(weight.grad, weight64.grad, weight.dtype, "grad_weight", 0.1 * rate * largest(hidden))


def largest(x):
    return max(x.detach().abs().max().item() if x.numel() else 0.0, 1.0)
