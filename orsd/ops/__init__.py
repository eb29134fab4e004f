"""Autograd-free tensor ops for paired replay and the ORSD loss (see docs/ops.md).

Each op validates its arguments (ValueError naming the argument) and runs the native kernel of
the tensors' device: C++/OpenMP on CPU, CUDA on GPU, or the torch reference in orsd.ops.reference
when the extension is missing (with one RuntimeWarning). `backend()` says which is in use.
The exception is lm_head_logprobs: differentiable, one autograd.Function around a native forward
and backward. `self_check(device)` compares the seven ops (the LM head with its gradients) with the reference on a device.
"""

from ._backend import backend
from .fused_token_logprobs import fused_token_logprobs
from .grpo_advantages import grpo_advantages
from .lm_head_logprobs import lm_head_logprobs
from .microbatch_weights import microbatch_weights
from .selfcheck import SelfCheckError, self_check
from .shape_advantages import shape_advantages
from .splice_rubric import splice_rubric
from .token_logprobs import token_logprobs

__all__ = [
    "backend",
    "token_logprobs",
    "fused_token_logprobs",
    "lm_head_logprobs",
    "grpo_advantages",
    "splice_rubric",
    "shape_advantages",
    "microbatch_weights",
    "self_check",
    "SelfCheckError",
]
