"""The reference policy's pass: log π_ref of the response tokens for the k3 KL of the update (Eq. 11),
over the replay's packing, without grad.

The reference is the frozen initial policy (with model.lora: the policy's base, adapters off). Where
the policy keeps its bottom layers frozen (optim.train_layers) and the reference holds the same values
there, the plain pass's states of those layers are the reference's too, and its pass starts from them.
"""

from __future__ import annotations

import torch

from .forward import replay_logprobs
from .model import holds_same_bottom
from .replay import PlainReplay, ReplayResult


class ReferencePass:
    """log π_ref per packed position, with what the run's config says of the forwards."""

    def __init__(self, reference, policy, config):
        self.reference, self.policy, self.config = reference, policy, config
        self._same_bottom: dict[int, bool] = {}  # holds_same_bottom per split: neither side's bottom trains

    def logprobs(self, replay: ReplayResult | PlainReplay, frozen_states: tuple | None) -> torch.Tensor:
        """[L] log-probs under the reference; `frozen_states`: the plain pass's (split, states) or None."""
        if not self.config.optim.kl_coef:  # the KL term is multiplied by 0: any finite values serve
            return replay.old_logprobs if replay.old_logprobs is not None else replay.rollout_logprobs
        if frozen_states is not None and not self.shares_bottom(frozen_states[0]):
            frozen_states = None
        p, r = replay.packed, self.config.replay
        return replay_logprobs(self.reference, p.ids, p.cu_seqlens, p.response_mask, self.config.rollout.temperature,
                               r.token_budget, r.fused,  # the reference is a plain full copy per rank
                               share_prefix=r.share_prefix, frozen_states=frozen_states)

    def shares_bottom(self, split: int) -> bool:
        """Whether the plain pass's states below layer `split` are the reference's (compared once per split)."""
        if split not in self._same_bottom:
            self._same_bottom[split] = holds_same_bottom(self.policy, self.reference, split)
        return self._same_bottom[split]
