"""Speculative decoding with looked-up drafts (the hf engine, `Sampling.draft_tokens` > 0): each
step feeds every row its last sampled token plus up to k drafted tokens, and one forward gives the
policy's distribution at all of them.

Drafts are copied, not generated: the tokens that followed the row's last n tokens somewhere else
(prompt lookup decoding; Saxena 2023), in a corpus the caller gives (the criteria pool a warm
start taught), in the other rows of the batch, or earlier in the row itself. Bundles are where it
pays: a warm-started policy writes the pool's criteria nearly word for word, and its M bundles of a
group repeat each other.

Exact: at draft slot j a token is sampled from the policy's filtered distribution given the
prefix with the drafts before j (top-p, top-k, temperature and the n-gram ban as decode.py applies
them); the draft is kept while the sample equals it, and the first sample that differs is emitted in
its place. Every emitted token is thus a sample of the policy given what precedes it, as in the
plain loop; only the random stream differs (the same seed samples other ids than decode.py does).
A draft that is rejected leaves its keys/values in the cache under a zero attention mask (a hole
the next steps never see), so rows that accept different counts stay in one batch. Greedy decoding
keeps the drafts that equal the argmax, so it returns the plain loop's ids. Under CPU bf16 autocast
the decode forwards take the layers' own matmuls: a step's rows × (1 + k) tokens are more than
engines/packed.py packs weights for (measured in fp32 only: the AVX2 host has no native bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decode import NGramBan, check_top_k, choose, prefill

#: n-gram sizes a draft is looked up by, longest first
LOOKUP_SIZES = (4, 3, 2)


@dataclass
class DraftStats:
    """What drafting bought: `tokens` emitted in `forwards` decode forwards; `accepted` of `drafted`."""
    forwards: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, other: "DraftStats") -> None:
        for name in ("forwards", "tokens", "drafted", "accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Lookup:
    """n-grams of every sequence added (the corpus, the prompts, each row as it grows) -> where they
    ended, latest last; a draft is what followed the longest n-gram that ends the row."""

    def __init__(self, corpus: list[list[int]], prompts: list[list[int]]):
        self.sequences: list[list[int]] = []
        self.where: dict[tuple, list[tuple[int, int]]] = {}
        for seq in corpus:
            self._add(seq)
        self.offset = len(self.sequences)  # sequence offset + i is row i: its prompt, then what it emits
        for prompt in prompts:
            self._add(prompt)

    def _add(self, tokens: list[int]) -> None:
        self.sequences.append([])
        self._extend(len(self.sequences) - 1, tokens)

    def extend(self, row: int, tokens: list[int]) -> None:
        self._extend(self.offset + row, tokens)

    def _extend(self, index: int, tokens: list[int]) -> None:
        """Append `tokens` to sequence `index`, indexing the n-grams they complete."""
        seq = self.sequences[index]
        for token in tokens:
            seq.append(token)
            end = len(seq)
            for n in LOOKUP_SIZES:
                if end >= n:
                    self.where.setdefault(tuple(seq[end - n:end]), []).append((index, end))

    def draft(self, row: int, k: int) -> list[int]:
        """Up to k tokens that followed, elsewhere, the longest n-gram ending row `row`."""
        seq = self.sequences[self.offset + row]
        for n in LOOKUP_SIZES:
            if len(seq) < n:
                continue
            for index, end in reversed(self.where.get(tuple(seq[-n:]), ())):
                source = self.sequences[index]
                if end < len(source):  # (the row's own last n-gram has nothing after it)
                    return source[end:end + k]
        return []


def banned_after(ban: NGramBan, row: int, extra: list[int]) -> list[int]:
    """The tokens `ban` forbids after row `row` continued by `extra` (without changing the ban)."""
    seq, n = ban.rows[row], ban.size
    if len(seq) + len(extra) + 1 < n:
        return []
    tail = seq[max(0, len(seq) - (n - 1)):] + extra  # the n-grams `extra` completes start here
    key = tuple(tail[len(tail) - (n - 1):]) if n > 1 else ()
    banned = list(ban.tables[row].get(key, ()))
    first = len(tail) - len(extra)  # index in tail of extra[0]
    for end in range(max(n, first + 1), len(tail) + 1):
        if tuple(tail[end - n:end - 1]) == key:
            banned.append(tail[end - 1])
    return banned


@torch.no_grad()
def decode(model, prompts: list[list[int]], cache, sampling, stop_ids: list[int], pad_id: int,
           corpus: list[list[int]] = ()) -> tuple[torch.Tensor, torch.Tensor, DraftStats]:
    """decode.decode's contract (ids [B, T] padded with `pad_id` after a stop, log-probs [B, T]),
    drafting up to `sampling.draft_tokens` tokens per row and step; also what drafting bought.
    Size: one draft-verify-accept loop whose state (the cache, each row's accepted length, the rows still
    live) lives across its steps; split, every part would take and return all of it."""
    check_top_k(sampling)
    k = sampling.draft_tokens
    if k < 1 or k != int(k):
        raise ValueError(f"sampling.draft_tokens={k}: expected an integer >= 1 here (0: decode.decode)")
    device = next(model.parameters()).device
    temperature = 1.0 if sampling.greedy else sampling.temperature
    ban = NGramBan(sampling.no_repeat_ngram_size, prompts) if sampling.no_repeat_ngram_size else None
    stops, budget, rows = set(stop_ids), sampling.max_new_tokens, len(prompts)
    lookup = Lookup(corpus, prompts)
    stats = DraftStats()
    logits, mask, position, head, decoder = prefill(model, prompts, cache, pad_id)
    pending, logprob = choose(logits.float(), sampling, temperature, ban.apply if ban is not None else None)
    out = [[int(t)] for t in pending.tolist()]
    out_lp = [[float(x)] for x in logprob.tolist()]
    done = [out[r][0] in stops or budget == 1 for r in range(rows)]
    for r in range(rows):
        lookup.extend(r, out[r])
    if ban is not None:
        ban.extend(pending.tolist())
    stats.tokens += rows
    while not all(done):
        drafts = [[] if done[r] else lookup.draft(r, min(k, budget - len(out[r]) - 1)) for r in range(rows)]
        width = 1 + max(len(d) for d in drafts)
        feed = torch.full((rows, width), pad_id, dtype=torch.long)
        feed[:, 0] = torch.tensor([out[r][-1] for r in range(rows)])
        for r, d in enumerate(drafts):
            feed[r, 1:1 + len(d)] = torch.tensor(d, dtype=torch.long)
        feed = feed.to(device)
        mask = torch.cat([mask, mask.new_ones((rows, width))], dim=-1)
        positions = position + 1 + torch.arange(width, device=device)
        # every slot a row may sample at (its drafts and one past them), with its own ban, in one call;
        # the LM head runs on those slots only, not on finished rows or padding
        slots = [(r, j) for r in range(rows) if not done[r] for j in range(len(drafts[r]) + 1)]
        at_slots = ([r for r, _ in slots], [j for _, j in slots])
        if head is not None:
            raw = head(decoder(input_ids=feed, attention_mask=mask, position_ids=positions,
                               past_key_values=cache, use_cache=True).last_hidden_state[at_slots]).float()
        else:
            raw = model(input_ids=feed, attention_mask=mask, position_ids=positions,
                        past_key_values=cache, use_cache=True).logits[at_slots].float()
        stats.forwards += 1
        banned = [banned_after(ban, r, drafts[r][:j]) for r, j in slots] if ban is not None else None

        def apply(scores, banned=banned):
            for i, tokens in enumerate(banned):
                if tokens:
                    scores[i, tokens] = float("-inf")

        sampled, sampled_lp = choose(raw, sampling, temperature, apply if ban is not None else None,
                                     inverse_cdf=True)
        sampled, sampled_lp = sampled.tolist(), sampled_lp.tolist()
        at = 0
        for r in range(rows):
            if done[r]:
                continue
            draft, emitted = drafts[r], []
            for j in range(len(draft) + 1):
                token = sampled[at + j]
                emitted.append(token)
                out_lp[r].append(sampled_lp[at + j])
                if token in stops or len(out[r]) + len(emitted) == budget or j == len(draft) or token != draft[j]:
                    break
            at += len(draft) + 1
            kept = len(emitted) - 1  # drafts whose keys/values stay (the last emitted token is fed next step)
            mask[r, mask.shape[1] - width + 1 + kept:] = 0
            position[r] += 1 + kept
            out[r] += emitted
            stats.drafted += len(draft)
            stats.accepted += kept
            stats.tokens += len(emitted)
            lookup.extend(r, emitted)
            if ban is not None:
                ban.extend_row(r, emitted)
            done[r] = emitted[-1] in stops or len(out[r]) == budget
    steps = max(len(o) for o in out)
    ids = torch.full((rows, steps), pad_id, dtype=torch.long)
    logprobs = torch.zeros((rows, steps))
    for r in range(rows):
        ids[r, :len(out[r])] = torch.tensor(out[r])
        logprobs[r, :len(out[r])] = torch.tensor(out_lp[r])
    return ids.to(device), logprobs.to(device), stats

