"""The `hf` rollout engine: the policy module itself decodes (CPU or GPU), behind the interface
of engines/base.py (token ids in, sampled ids and their temperature-scaled log-probs out).

Top-k is off unless asked for: until this engine ran its own decode loop (engines/decode.py),
transformers 5's `generate` silently applied its default top_k=50 when given none, so rollouts
were sampled from a truncated distribution that neither the config nor the vllm engine had.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from . import speculative
from .base import Generation, Sampling, check_keys, stop_ids
from .decode import KeyedNoise, decode
from .speculative import DraftStats


class HfEngine:
    """The policy itself decodes (CPU or GPU), batched across episodes: engines/decode.py's loop,
    which samples as transformers' `generate` does.

    It generates with the live policy module, so weights are always in sync; prompts are sorted
    by length and left-padded in batches of at most `batch_size` prompts (0: no limit) and
    `token_budget` padded tokens. Without `sampling.seed` a whole batch samples from the global
    torch generator (as transformers does) and `keys` are ignored: samples depend on the batch.
    With it, keyed sampling (engines/base.py, engines/decode.py): row r chooses its tokens with
    Gumbel noise from a stream seeded by key_seed(sampling.seed, keys[r]), so a request samples
    the same in any batch (up to a near tie moved by the float rounding of batched matmuls) and
    the global generator is left alone.
    """

    def __init__(self, model, tokenizer, batch_size: int = 64, token_budget: int = 65536,
                 draft_corpus: list[list[int]] = ()):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.token_budget = token_budget
        # token sequences speculative decoding may copy drafts from, besides the batch's own rows
        self.draft_corpus = [list(seq) for seq in draft_corpus]
        self.draft_stats = DraftStats()  # accumulated; a reader resets it (Trainer.counters)
        self.stop_ids = stop_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]

    def sync_weights(self, model) -> None:
        self.model = model

    def take_draft_stats(self) -> DraftStats:
        """What speculative decoding bought since the last call (counts reset)."""
        stats, self.draft_stats = self.draft_stats, DraftStats()
        return stats

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling,
                 keys: list[str] | None = None) -> list[Generation]:
        check_keys(prompts, sampling, keys)
        keyed = sampling.seed is not None and not sampling.greedy  # greedy draws nothing
        if keyed and sampling.draft_tokens:
            raise ValueError(f"sampling.draft_tokens={sampling.draft_tokens} with sampling.seed={sampling.seed}: "
                             "speculative decoding has no keyed sampling; expected draft_tokens=0 or seed=None")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        rows = self.batch_size or len(order)
        start = 0
        while start < len(order):
            end = start + 1
            while (end < len(order) and end - start < rows
                   and (end - start + 1) * (len(prompts[order[end]]) + sampling.max_new_tokens)
                   <= self.token_budget):
                end += 1
            batch = order[start:end]
            noise = KeyedNoise(sampling.seed, [keys[i] for i in batch]) if keyed else None
            for i, gen in zip(batch, self._generate_batch([prompts[i] for i in batch], sampling, noise)):
                results[i] = gen
            start = end
        return results  # type: ignore[return-value]

    def _generate_batch(self, prompts: list[list[int]], sampling: Sampling,
                        noise: KeyedNoise | None = None) -> list[Generation]:
        from .kv_cache import reserved_cache

        width = max(len(p) for p in prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            with decode_attention(self.model):
                cache = reserved_cache(self.model, width + sampling.max_new_tokens)
                if sampling.draft_tokens:
                    new_ids, logprobs, stats = speculative.decode(self.model, prompts, cache, sampling, self.stop_ids,
                                                                  self.pad_id, self.draft_corpus)
                    self.draft_stats.add(stats)
                else:
                    new_ids, logprobs = decode(self.model, prompts, cache, sampling, self.stop_ids, self.pad_id,
                                               noise)
        finally:
            self.model.train(was_training)
        new_ids, logprobs = new_ids.cpu(), logprobs.cpu()
        stops = torch.tensor(self.stop_ids)
        generations = []
        for row in range(len(prompts)):
            ids = new_ids[row].tolist()
            hits = torch.isin(new_ids[row], stops).nonzero()
            length = int(hits[0]) + 1 if len(hits) else len(ids)
            generations.append(Generation(ids=ids[:length], logprobs=logprobs[row, :length].tolist(),
                                          finished=bool(len(hits))))
        return generations


#: transformers attention implementation used while generating on a CPU (registered on first use)
GQA_DECODE = "orsd_gqa_decode"
#: the most query tokens per row that take the grouped path (a decode step and its drafts)
MAX_DECODE_QUERIES = 32


def gqa_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         is_causal=None, **kwargs):
    """transformers' sdpa attention, except for a decode step (one query token, or a few under a mask:
    a speculative step's verified drafts, engines/speculative.py) of a grouped-query model: there the
    query heads that share a key/value head become query rows of that head, and SDPA runs on the
    cache as it is stored, never repeated.

    For that step transformers repeats every key/value head `num_key_value_groups` times when a
    padding mask is present (a copy of the whole cache per layer per token), which here costs more
    than the attention itself. Head
    h = kv·groups + g is repeat_kv's order, so the output is the same. Query, keys and values meet
    in the values' dtype, as autocast's SDPA would cast them (engines/kv_cache.py already stores
    keys so, so nothing is copied). Prefill and anything unusual (dropout, a per-head mask,
    position bias, paged caches) go to transformers' function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, length, dim = query.shape
    # several query tokens take this path only after a cache, under their mask: a prefill goes to transformers
    plain = (length > MAX_DECODE_QUERIES or (length > 1 and (attention_mask is None or key.shape[-2] <= length))
             or groups == 1 or dropout
             or key.shape[1] * groups != heads
             or (attention_mask is not None and attention_mask.shape[1] != 1)
             or kwargs.get("position_bias") is not None or kwargs.get("cache") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    dtype, kv_heads = value.dtype, key.shape[1]
    rows = query.reshape(batch, kv_heads, groups * length, dim).to(dtype)  # [B, KV, G·T, D]
    mask = None
    if attention_mask is not None:  # [B, 1, T, L]: the same for every head, repeated for the G rows
        mask = attention_mask[:, :, :, :key.shape[-2]]
        mask = mask if mask.dtype == torch.bool else mask.to(dtype)
        if length > 1:
            mask = mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(batch, 1, groups * length, -1)
    with torch.autocast(query.device.type, enabled=False):
        out = torch.nn.functional.scaled_dot_product_attention(rows, key.to(dtype), value, attn_mask=mask,
                                                               scale=scaling)  # [B, KV, G·T, D]
    # [B, T, H, D], as transformers returns it
    return out.reshape(batch, heads, length, dim).transpose(1, 2), None


@contextmanager
def decode_attention(model):
    """Generate with `gqa_decode_attention` when the model runs transformers' sdpa on a CPU (the case it
    was measured on); any other model or device is left as it is."""
    config = getattr(model, "config", None)
    on_cpu = next(model.parameters()).device.type == "cpu"
    if not on_cpu or getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_DECODE, gqa_decode_attention)
    AttentionMaskInterface.register(GQA_DECODE, sdpa_mask)  # the same masks as sdpa
    model.set_attn_implementation(GQA_DECODE)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
