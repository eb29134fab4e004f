"""The hf engine's decode loop: one prefill, then one token per step on an in-place KV cache,
choosing tokens as transformers' `generate` does (n-gram ban, temperature, top-k, top-p,
`torch.multinomial` on the global generator) without its per-step machinery.

Keyed sampling (`Sampling.seed`, engines/base.py) instead takes a row's token t as the argmax of
its filtered, temperature-scaled scores plus Gumbel noise drawn from that row's own stream
(`KeyedNoise`; the Gumbel-max trick samples exactly the softmax): the global generator is neither
read nor advanced, and a row samples the same whatever else is in its batch. Gumbel-max, not the
inverse CDF of one uniform per token: both sample the same distribution, but batching moves
logits by float rounding (SmolLM2-135M, fp32, 8 WebShop prompts alone vs together: up to 4e-5,
a total variation of at most 6e-6), and the inverse CDF's cumulative sums run in vocabulary
order, so every boundary moves: 1.1e-3 of its choices flipped at T = 0.6 (3.0e-3 at T = 1), where
none of 32,000 Gumbel-max choices did at either (only a near tie of the two best noisy scores can
flip one). Its price: one exponential draw and one log per vocabulary entry per row and token.

Why not `generate`: it decides what is sampled in ways the config does not say (transformers 5
applies its default top_k=50 when given none), and it prefills every row even where prompts repeat.
Here the sampling is exactly the config's, and with the same seed the ids are those transformers
samples with the same settings (tests/engines/test_engines.py checks greedy, temperature, top-k,
top-p and the n-gram ban against it). Per step it is only a little faster, since the model's
forward is the same; the gain is in the prefill.

Repeated prompts in a batch (the M bundles of a group share one prompt; a group's N episodes share
their first turn's) are prefilled once and their keys/values copied to every row that asks for them;
distinct prompts are prefilled once, a prefix they share once (engines/prefill.py). The
decode steps take the logits from the decoder's last hidden state and the LM head directly
(`next_token_head`), with a frozen fp32 head cast once per call instead of at every step. A
model whose head or cache this cannot serve (a biased or rescaled
head, sliding-window layers) takes the left-padded batched prefill and the model's own forward.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import key_seed
from .packed import is_packed, packed_linears
from .prefill import lay_into, supports_tree_prefill, tree_prefill
from .tree import distinct_rows


def check_top_k(sampling) -> None:
    """Both engines refuse a top-k that is not an integer >= 0 (0: off), with one message."""
    if sampling.top_k < 0 or sampling.top_k != int(sampling.top_k):
        raise ValueError(f"sampling.top_k={sampling.top_k}: expected an integer >= 0 (0: off)")


def lm_head_of(model) -> torch.nn.Linear | None:
    """The output projection when logits or log-probs may be taken straight from it (no bias, no
    soft-capping or logit scaling between hidden states and logits); otherwise None (use the
    model's logits). The decode loop and replay both ask this."""
    head = model.get_output_embeddings()
    config = model.config
    if (not isinstance(head, torch.nn.Linear) or head.bias is not None
            or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)):
        return None
    return head


def next_token_head(model):
    """hidden [n, H] -> next-token logits [n, V] as the model's forward computes them, with the LM
    head's weight cast to the autocast dtype once per decode call; None where `lm_head_of` finds
    no plain head.

    Autocast caches its cast of a weight only while the weight requires grad, so a frozen fp32
    head (a head tied to embeddings that optim.train_layers froze) would be cast at every decode
    step, a sizeable share of a small model's step on a CPU. The cast here rounds
    as autocast does, so the logits are the same."""
    head = lm_head_of(model)
    if head is None:
        return None
    if is_packed(head):  # inside packed_linears: the head's weight is cast and packed once already
        return head
    weight, device = head.weight, head.weight.device.type
    if torch.is_autocast_enabled(device) and weight.dtype == torch.float32:
        weight = weight.detach().to(torch.get_autocast_dtype(device))
    return lambda hidden: torch.nn.functional.linear(hidden, weight)


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W] ids and attention mask of prompts left-padded to the longest (W)."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    return input_ids, attention_mask


class NGramBan:
    """Forbids any token that would repeat an n-gram already in a row (prompt included), as
    transformers' NoRepeatNGramLogitsProcessor does, but kept incrementally: each row's table of
    (n-1)-gram → next tokens grows by one entry per step instead of being rebuilt from the whole
    sequence every step. Left padding is not part of a row here (transformers counts it)."""

    def __init__(self, size: int, prompts: list[list[int]]):
        self.size = size
        self.rows = [list(p) for p in prompts]
        self.tables: list[dict[tuple, list[int]]] = [{} for _ in prompts]
        for row in range(len(prompts)):
            for end in range(size, len(self.rows[row]) + 1):
                self._add(row, end)

    def _add(self, row: int, end: int) -> None:
        """Record the n-gram that ends just before `end` in `row`."""
        seq = self.rows[row]
        self.tables[row].setdefault(tuple(seq[end - self.size:end - 1]), []).append(seq[end - 1])

    def apply(self, scores: torch.Tensor) -> None:
        """Set the banned tokens' scores of every row to -inf (in place)."""
        for row, seq in enumerate(self.rows):
            if len(seq) + 1 < self.size:
                continue
            banned = self.tables[row].get(tuple(seq[len(seq) - self.size + 1:]))
            if banned:
                scores[row, banned] = float("-inf")

    def extend(self, tokens: list[int]) -> None:
        """One more token for every row."""
        for row, token in enumerate(tokens):
            self.extend_row(row, [token])

    def extend_row(self, row: int, tokens: list[int]) -> None:
        for token in tokens:
            self.rows[row].append(token)
            if len(self.rows[row]) >= self.size:
                self._add(row, len(self.rows[row]))


def top_k_filter(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Scores below the k-th largest of their row set to -inf (transformers' TopKLogitsWarper)."""
    if top_k >= scores.shape[-1]:
        return scores
    return scores.masked_fill(scores < torch.topk(scores, top_k)[0][..., -1:], float("-inf"))


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Scores outside the smallest set of tokens whose probability reaches `top_p` set to -inf
    (transformers' TopPLogitsWarper, the same operations in the same order, so sampling matches).

    On a CPU the ascending sort comes from numpy's (vectorised) sort of the values, and the tokens
    to drop are those below the first kept value (`_top_p_by_values`); where that cannot tell the
    same tokens apart (a tie across the cut, a NaN) it takes transformers' index sort itself."""
    if scores.device.type == "cpu" and scores.dtype == torch.float32 and scores.dim() == 2:
        filtered = _top_p_by_values(scores, top_p)
        if filtered is not None:
            return filtered
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False  # at least one token stays
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


def _top_p_by_values(scores: torch.Tensor, top_p: float) -> torch.Tensor | None:
    """top_p_filter from the sorted values alone, or None where that could differ from it.

    transformers removes a prefix of the ascending order: the cumulative probability never
    decreases, so `cumulative <= 1 - top_p` holds up to some position k and not after (the last
    position is always kept). The cumulative depends only on the sorted values, which are the
    same sequence whichever sort produced them, so k is the same; the removed tokens are then
    exactly those scoring below the value at k, unless the value before k equals it (a tie across
    the cut, where torch.sort's order of equal scores decides). torch.sort orders indices too,
    several times slower than numpy's sort of the values, at every bundle token."""
    rows = scores.detach().contiguous()
    if bool(torch.isnan(rows).any()):
        return None
    values = torch.from_numpy(np.sort(rows.numpy(), axis=-1))
    remove = values.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
    remove[..., -1:] = False  # at least one token stays
    cut = remove.sum(dim=-1, keepdim=True)  # [B, 1] removed positions per row
    first_kept = values.gather(-1, cut)
    last_removed = values.gather(-1, (cut - 1).clamp(min=0))
    if bool(((cut > 0) & (last_removed == first_kept)).any()):
        return None
    return scores.masked_fill(scores < first_kept, float("-inf"))


class KeyedNoise:
    """Keyed sampling's random streams, one per row: numpy's PCG64 seeded by key_seed(seed, key).
    Every call draws one block of standard Gumbel noise per row, one value per vocabulary entry, so
    a row's token t meets the t-th block of its stream whatever else is in the batch (drawn on the
    CPU whatever the model's device: under one numpy version the same numbers on any machine)."""

    def __init__(self, seed: int, keys: list[str]):
        self.generators = [np.random.Generator(np.random.PCG64(key_seed(seed, key))) for key in keys]

    def __len__(self) -> int:
        return len(self.generators)

    def gumbel(self, vocab: int, device=None) -> torch.Tensor:
        """[rows, vocab] of -log(E), E standard exponential (numpy's ziggurat), floored at the
        smallest normal float so that no draw is infinite (inf + -inf of a filtered score is NaN)."""
        exponential = np.stack([g.standard_exponential(vocab, dtype=np.float32) for g in self.generators])
        return torch.from_numpy(exponential).to(device).clamp_(min=torch.finfo(torch.float32).tiny).log_().neg_()


@torch.no_grad()
def decode(model, prompts: list[list[int]], cache, sampling, stop_ids: list[int],
           pad_id: int, noise: KeyedNoise | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to `sampling.max_new_tokens` ids per prompt (left-padded into one batch on the
    model's device). Returns the ids [B, T] (a row that stopped is padded with `pad_id` after its
    stop id, as transformers does) and the log-probs of the temperature-scaled policy at those ids
    [B, T] (T: steps taken). With `noise` (one stream per prompt) every token is chosen by keyed
    sampling (module docstring) instead of from the global generator. On a CPU under bf16 autocast
    the decode steps' matmuls run on weights packed once for this call (engines/packed.py)."""
    check_top_k(sampling)
    if noise is not None and len(noise) != len(prompts):
        raise ValueError(f"noise: {len(noise)} streams for {len(prompts)} prompts: expected one per prompt")
    with packed_linears(model, rows_hint=len(prompts)):
        return _decode(model, prompts, cache, sampling, stop_ids, pad_id, noise)


def prefill(model, prompts, cache, pad_id):
    """Prompts into `cache` (left-padded). Returns the next-token logits [B, V], the attention mask
    [B, W], each row's last position [B, 1], and the head and decoder a decode step runs (head None:
    the model's own forward)."""
    device = next(model.parameters()).device
    input_ids, attention_mask = (t.to(device) for t in left_padded(prompts, pad_id))
    # positions count real tokens only (left padding shares position 1, as in generate)
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    first, inverse = distinct_rows(prompts)
    head = next_token_head(model)
    decoder = model.get_decoder()
    if head is not None and supports_tree_prefill(cache):
        kv, last = tree_prefill(decoder, model.config, [prompts[i] for i in first], device)
        lay_into(cache, kv, inverse, input_ids.shape[1])
        logits = head(last)[torch.tensor(inverse, device=device)]
    elif len(first) == len(prompts):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    else:  # repeated prompts (M bundles per group, a group's first turn) are prefilled once
        index = torch.tensor(first, device=device)
        logits = model(input_ids=input_ids[index], attention_mask=attention_mask[index], position_ids=positions[index],
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        inverse = torch.tensor(inverse, device=device)
        logits = logits[inverse]
        cache.batch_select_indices(inverse)
    return logits, attention_mask, positions[:, -1:], head, decoder


def choose(raw: torch.Tensor, sampling, temperature: float, ban=None,
           inverse_cdf: bool = False, gumbel: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [n] sampled from fp32 logits [n, V] as the config says (`ban(scores)` sets banned
    scores to -inf in place first), and their log-probs under the temperature-scaled policy [n].

    `inverse_cdf` samples by one uniform per row against the cumulative probabilities instead of
    `torch.multinomial` (transformers' draw, whose random stream the plain loop keeps): the same
    distribution, drawn far faster on a CPU.
    `gumbel` [n, V] (keyed sampling, `KeyedNoise`): the argmax of the filtered scaled scores plus
    that noise instead, the global generator untouched."""
    scores = raw.clone() if ban is not None else raw  # the ban writes in place; the rest copies
    if ban is not None:
        ban(scores)
    if sampling.greedy:
        choice = scores.argmax(dim=-1)
    else:
        scores = scores / temperature
        if sampling.top_k:
            scores = top_k_filter(scores, sampling.top_k)
        if sampling.top_p < 1.0:
            scores = top_p_filter(scores, sampling.top_p)
        if gumbel is not None:  # Gumbel-max: a filtered score stays -inf, so its token is never chosen
            choice = (scores + gumbel).argmax(dim=-1)
        elif inverse_cdf:
            probs = scores.softmax(dim=-1)
            cumulative = probs.cumsum(dim=-1)
            uniform = torch.rand((len(probs), 1), device=probs.device) * cumulative[:, -1:]
            # right=True: a token of zero probability (its cumulative equals the one before) is never hit
            choice = torch.searchsorted(cumulative, uniform, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)
        else:
            choice = torch.multinomial(scores.softmax(dim=-1), num_samples=1).squeeze(1)
    return choice, torch.log_softmax(raw / temperature, dim=-1).gather(-1, choice[:, None]).squeeze(-1)


def _decode(model, prompts, cache, sampling, stop_ids, pad_id, noise=None):
    device = next(model.parameters()).device
    temperature = 1.0 if sampling.greedy else sampling.temperature
    ban = NGramBan(sampling.no_repeat_ngram_size, prompts) if sampling.no_repeat_ngram_size else None
    stops = torch.tensor(stop_ids, device=device)
    rows = len(prompts)
    logits, attention_mask, position, head, decoder = prefill(model, prompts, cache, pad_id)
    unfinished = torch.ones(rows, dtype=torch.bool, device=device)
    ids, logprobs = [], []
    for step in range(sampling.max_new_tokens):
        gumbel = noise.gumbel(logits.shape[-1], device) if noise is not None and not sampling.greedy else None
        choice, logprob = choose(logits.float(), sampling, temperature, ban.apply if ban is not None else None,
                                 gumbel=gumbel)
        choice = torch.where(unfinished, choice, pad_id)
        ids.append(choice)
        logprobs.append(logprob)
        unfinished &= ~torch.isin(choice, stops)
        if step + 1 == sampling.max_new_tokens or not bool(unfinished.any()):
            break
        if ban is not None:
            ban.extend(choice.tolist())
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((rows, 1))], dim=-1)
        position = position + 1
        if head is not None:
            logits = head(decoder(input_ids=choice[:, None], attention_mask=attention_mask, position_ids=position,
                                  past_key_values=cache, use_cache=True).last_hidden_state[:, -1])
        else:
            logits = model(input_ids=choice[:, None], attention_mask=attention_mask, position_ids=position,
                           past_key_values=cache, use_cache=True).logits[:, -1]
    return torch.stack(ids, dim=1), torch.stack(logprobs, dim=1)
