"""The LM head: response-token log-probs (and entropies) from final hidden states.

Two ways, one result. The native ops (`fused_token_logprobs` for replay, without autograd;
`lm_head_logprobs` for the update, with its own backward) read the head's weight and never hold a
tokens × vocab tensor. The torch path (`chunk_logprobs`, run in checkpointed token chunks by
`forward.train_logprobs`) is the reference and serves where the native op cannot: a head with a
bias, a ZeRO-3-partitioned head, a distillation term that needs the whole distribution.
Soft-capping and the logit scale are applied in one order (`final_logits`, through
ops' `soft_cap_and_scale`, which lm_head_logprobs' own torch fallback applies too; the native op
takes the same two numbers); `fused_token_logprobs` has neither, so replay uses it only for a
head without them (`engines.decode.lm_head_of`).
"""

from __future__ import annotations

import torch

from orsd import ops
from orsd.engines.decode import lm_head_of
from orsd.ops.lm_head_logprobs import soft_cap_and_scale

from .distributed import gathered


def head_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, fused: bool) -> torch.Tensor:
    """log-probs [n] (f32, CPU) of `targets` from final hidden states [n, H]: through
    fused_token_logprobs when the head allows it, else the model's logits and token_logprobs."""
    targets = targets.to(hidden.device)
    head = lm_head_of(model) if fused else None
    if head is not None:
        with gathered(head.weight):
            weight = head.weight.detach()
            lp = ops.fused_token_logprobs(hidden.to(weight.dtype).contiguous(), weight.contiguous(),
                                          targets, temperature=temperature)
    else:
        logits = final_logits(model, model.get_output_embeddings()(hidden))
        lp = ops.token_logprobs(logits.contiguous(), targets, temperature=temperature)
    return lp.float().cpu()


def final_logits(model, logits: torch.Tensor) -> torch.Tensor:
    """The head's raw logits after the model's soft-capping (Gemma-2's final_logit_softcapping),
    then its logit scale (Cohere's logit_scale); the native ops take the same two numbers."""
    return soft_cap_and_scale(logits, getattr(model.config, "final_logit_softcapping", None),
                              getattr(model.config, "logit_scale", None))


def fused_head_serves(head) -> bool:
    """Whether ops.lm_head_logprobs can stand in for `head` + log-softmax: a bias-free Linear whose
    weight is a whole tensor (a ZeRO-3-partitioned one is gathered only by the module's own hooks)."""
    return isinstance(head, torch.nn.Linear) and head.bias is None and not hasattr(head.weight, "ds_id")


def fused_head(model, head, hidden, targets, temperature, dtype):
    """(lp, entropy) through the native op, with the model's soft-capping and logit scale."""
    weight = head.weight if dtype is None else head.weight.to(dtype)
    return ops.lm_head_logprobs(hidden.to(weight.dtype).contiguous(), weight.contiguous(), targets,
                                temperature=temperature,
                                softcap=float(getattr(model.config, "final_logit_softcapping", None) or 0.0),
                                logit_scale=float(getattr(model.config, "logit_scale", None) or 1.0),
                                return_entropy=True)


def chunk_logprobs(model, head, hidden, targets, temperature, fn=None, *extra):
    """(lp, entropy, term) of one token chunk through torch: the reference for fused_head, and
    the path of a `fn` term that needs the chunk's whole log-softmax. It is not lm_head_logprobs'
    torch fallback: it calls the head module itself (a bias, ZeRO-3's gathering hooks, the head's
    dtype, soft-capped before the cast to f32), and its entropy is -Σ p·log p from log p where the
    fallback's is Σ entr(p); the two share only `final_logits`' order."""
    logits = final_logits(model, head(hidden)).float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    term = fn(logp, *extra) if fn is not None else None
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy, term
