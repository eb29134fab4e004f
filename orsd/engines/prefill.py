"""The passes built on prefix-tree forwards (engines/tree.py): the hf decode loop's prefill
(`tree_prefill`: each prompt's keys/values then laid into the decode cache left-padded, as the
batched prefill would have left them, so the decode steps are unchanged and the logits differ from
the batched prefill's only by floating-point order), and the hidden states the reference pass, the
update and the warm start take (`shared_prefix_hidden`, train/replay.py; the last two under
autograd). A no-grad pass may keep the keys/values of what it forwarded (`PrefixCache`) for a later
pass that starts with the same tokens: paired replay's rubric pass continues from the plain
pass's (`continue_from`), a stem that several of its records share forwarded once."""

from __future__ import annotations

import os

import torch

from . import frozen
from .tree import PAD_TOKENS, distinct_rows, tree_forward

__all__ = ["PrefixCache", "bottom_states", "continue_from", "lay_into", "serves",
           "shared_prefix_hidden", "shared_stems", "supports_tree_prefill", "tree_prefill"]


def supports_tree_prefill(cache) -> bool:
    """Every cache layer a plain full-attention layer (no sliding window, no recurrent state), whose
    keys/values can be cut per row and laid side by side."""
    from transformers.cache_utils import DynamicLayer

    return all(isinstance(layer, DynamicLayer) and not getattr(layer, "is_sliding", False) for layer in cache.layers)


def serves(model) -> bool:
    """The model's own cache is one `tree_forward` can cut, lay and branch (see
    supports_tree_prefill), and its forward keeps a cache (gradient checkpointing drops it)."""
    from transformers.cache_utils import DynamicCache

    return (supports_tree_prefill(DynamicCache(config=model.config))
            and not getattr(model, "is_gradient_checkpointing", False))


def tree_prefill(decoder, config, prompts: list[list[int]], device) -> tuple[list[list[tuple]], torch.Tensor]:
    """Per distinct prompt, its keys and values per layer ([KV, L, D] each) and the final hidden
    state of its last token ([P, H])."""
    kv: list[list[tuple] | None] = [None] * len(prompts)
    last: list[torch.Tensor | None] = [None] * len(prompts)

    def keep(i: int, hidden: torch.Tensor, start: int, keys_values) -> None:
        kv[i] = keys_values()
        last[i] = hidden[len(prompts[i]) - 1 - start]

    tree_forward(decoder, config, prompts, None, device, keep)
    return kv, torch.stack(last)


def lay_into(cache, kv: list[list[tuple]], inverse: list[int], width: int) -> None:
    """Write row r's keys/values (those of distinct prompt inverse[r]) into `cache`, left-padded to
    `width` positions, as a left-padded batched prefill leaves them."""
    for index in range(len(kv[0])):
        keys0, values0 = kv[0][index]
        keys = keys0.new_zeros((len(inverse), keys0.shape[0], width, keys0.shape[-1]))
        values = values0.new_zeros((len(inverse), values0.shape[0], width, values0.shape[-1]))
        for row, prompt in enumerate(inverse):
            k, v = kv[prompt][index]
            keys[row, :, width - k.shape[1]:] = k
            values[row, :, width - v.shape[1]:] = v
        cache.update(keys, values, index)


class PrefixCache:
    """Keys/values of the sequences a no-grad pass forwarded, for a later pass with the same weights
    whose sequences start with some of the same tokens: paired replay's rubric pass, where each
    record's context up to its slot is exactly what the plain pass forwarded (train/replay.py).
    Only sequences that are no other's prefix are kept; a later sequence continues from the one
    that shares its longest prefix (on the default shape, where a turn's history holds only the
    turn before, each record's own plain sequence)."""

    def __init__(self) -> None:
        self.sequences: list[list[int]] = []
        self.kv: list[list[tuple]] = []

    def add(self, sequence: list[int], kv: list[tuple]) -> None:
        """`kv`: keys and values per layer ([KV, L, D] each) of all L positions of `sequence`,
        copied here (a view would keep its whole batch's cache alive), the keys in the values'
        dtype: under bf16 autocast they leave the rotary embedding in f32, and the forwards that
        read them cast them to bf16 anyway (_stacked), so a third fewer bytes are held. A
        sequence's layers share one buffer where their
        shapes agree: one allocation instead of ~60 small ones scattered over the heap."""
        self.sequences.append(sequence)
        shape = kv[0][1].shape
        if any(keys.shape != shape or values.shape != shape for keys, values in kv):  # layers of other shapes
            self.kv.append([(keys.to(values.dtype, copy=True), values.clone()) for keys, values in kv])
            return
        buffer = kv[0][1].new_empty((len(kv), 2, *shape))
        for layer, (keys, values) in enumerate(kv):
            buffer[layer, 0].copy_(keys)
            buffer[layer, 1].copy_(values)
        self.kv.append([(buffer[layer, 0], buffer[layer, 1]) for layer in range(len(kv))])

    def longest(self, sequence: list[int]) -> tuple[int, int]:
        """(index, length) of the kept sequence sharing the longest prefix with `sequence`; (-1, 0)
        where none shares a first token."""
        best = (-1, 0)
        for index, kept in enumerate(self.sequences):
            shared = len(os.path.commonprefix([kept, sequence]))
            if shared > best[1]:
                best = (index, shared)
        return best

    def under(self, bottom: "PrefixCache") -> "PrefixCache":
        """A cache of every layer from this one, holding the layers from some `split` up, and `bottom`,
        holding those below it for the same sequences (a pass that ran its frozen layers apart:
        bottom_states, then the layers above from their states); a sequence kept in only one is
        dropped."""
        below = {tuple(sequence): kv for sequence, kv in zip(bottom.sequences, bottom.kv)}
        whole = PrefixCache()
        for sequence, kv in zip(self.sequences, self.kv):
            if (lower := below.get(tuple(sequence))) is not None:
                whole.sequences.append(sequence)
                whole.kv.append(lower + kv)  # already copied and cast by add()
        return whole

    def __len__(self) -> int:
        return len(self.sequences)


def maximal(prompts: list[list[int]]) -> list[bool]:
    """Per distinct prompt: no other prompt starts with it (sorted, a prompt's extensions follow it)."""
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    out = [True] * len(prompts)
    for here, after in zip(order, order[1:]):
        out[here] = prompts[after][:len(prompts[here])] != prompts[here]
    return out


def shared_prefix_hidden(model, sequences: list[list[int]], needed: list[list[int]],
                         token_budget: int = 0, states: list[torch.Tensor] | None = None,
                         split: int = 0, prefixes: PrefixCache | None = None,
                         keep_into: PrefixCache | None = None) -> list[torch.Tensor]:
    """Final hidden states [len(needed[i]), H] at the ascending positions `needed[i]` of every
    sequence, each prefix that sequences share forwarded once and repeated sequences once. Where a
    record's context extends the one before it (a trajectory's turns under a full history) this
    is one forward of the trajectory instead of one per turn. Leaf batches stay within
    `token_budget` padded tokens (0: any). Differentiable under autograd (the update, the warm
    start): a shared prefix's gradient is the sum over the sequences that read it, as when each
    forwarded its own copy. Every `needed[i]` must be non-empty. With `states` (each sequence's
    states entering layer `split`, engines/frozen.py) only the layers from `split` up run.
    No-grad passes only, and not with `states`: `prefixes`, a sequence continues from the kept
    keys/values of its longest shared prefix (up to its first needed position) instead of
    forwarding it; `keep_into`, the keys/values of every sequence no other extends are kept (with
    `states`, those of the layers from `split` up: PrefixCache.under joins them to the layers below)."""
    device = next(model.parameters()).device
    rows, inverse = distinct_rows(sequences)
    prompts = [sequences[row] for row in rows]
    first = [len(p) for p in prompts]
    wanted: list[list[int]] = [[] for _ in prompts]
    for i, p in enumerate(inverse):  # a repeated sequence: from the earliest position any copy needs
        first[p] = min(first[p], needed[i][0])
        wanted[p].append(i)
    out: list[torch.Tensor | None] = [None] * len(sequences)

    if states is not None and prefixes is not None:
        raise ValueError("shared_prefix_hidden: prefixes hold every layer's keys/values; not with states")
    ends = maximal(prompts) if keep_into is not None else None

    def keep(p: int, hidden: torch.Tensor, start: int, keys_values) -> None:
        for i in wanted[p]:
            out[i] = hidden[torch.tensor(needed[i], device=hidden.device) - start]
        if ends is not None and ends[p]:
            keep_into.add(prompts[p], keys_values())

    decoder = model.get_decoder()
    if states is None:
        rest = list(range(len(prompts)))
        if prefixes:
            rest = continue_from(decoder, model.config, prefixes, prompts, first, device, keep, token_budget)
        if rest:
            tree_forward(decoder, model.config, [prompts[p] for p in rest], [first[p] for p in rest], device,
                         lambda p, *args: keep(rest[p], *args), token_budget)
        return out
    with frozen.layer_range(decoder, split, len(decoder.layers)):
        tree_forward(decoder, decoder.config, prompts, first, device, keep, token_budget,
                     embed=lambda p, start, end: states[rows[p]][start:end].to(device))
    return out


def continue_from(decoder, config, prefixes: PrefixCache, prompts: list[list[int]], first: list[int], device,
                  on_leaf, token_budget: int = 0) -> list[int]:
    """tree_forward's on_leaf for every prompt that shares a prefix with a sequence `prefixes`
    keeps, each continuing from that sequence's keys/values at the shared length (at most its
    first needed position); returns the indices of the other prompts. Prompts that continue from
    the same place and agree beyond it (`shared_stems`) continue from their shared tokens,
    forwarded once beforehand."""
    served, rest = _served(prefixes, prompts, first)
    stems = shared_stems(prompts, first, served)
    if stems:
        grown = PrefixCache()  # `prefixes` and the stems; the caller's cache is left as it was
        grown.sequences, grown.kv = list(prefixes.sequences), list(prefixes.kv)
        tree_forward(decoder, config, [stem for stem, _, _ in stems], None, device,
                     lambda i, _hidden, _start, kv: grown.add(stems[i][0], kv()), token_budget,
                     base=([prefixes.kv[index] for _, index, _ in stems], [start for _, _, start in stems]))
        prefixes = grown
        served, _ = _served(prefixes, prompts, first)
    if served:
        tree_forward(decoder, config, [prompts[p] for p, _, _ in served], None, device,
                     lambda i, *args: on_leaf(served[i][0], *args), token_budget,
                     base=([prefixes.kv[index] for _, index, _ in served], [start for _, _, start in served]))
    return [p for p, _, _ in rest]


def _served(prefixes: PrefixCache, prompts: list[list[int]], first: list[int]) -> tuple[list, list]:
    """(prompt, kept index, start) of the prompts that can continue from a kept sequence, and of the others."""
    served, rest = [], []
    for p, prompt in enumerate(prompts):
        index, shared = prefixes.longest(prompt)
        (served if min(shared, first[p]) >= 1 else rest).append((p, index, min(shared, first[p])))
    return served, rest


def shared_stems(prompts: list[list[int]], first: list[int], served: list[tuple]) -> list[tuple[list[int], int, int]]:
    """(stem, kept index, start) for each set of `served` prompts (prompt, kept index, start) that
    continue from the same kept sequence at the same start and agree beyond it: the stem is their
    common prefix up to the first position any of them needs. Forwarding it once saves its tokens
    after `start` for all but one prompt of the set, kept where that is more than one more forward
    costs (PAD_TOKENS). In paired replay's rubric pass these are a group's records whose contexts
    agree up to the slot (the N first turns at least): the rubric and what follows the slot up to
    the response, forwarded once instead of once per record. Where a set's prompts part before any
    needs a position, one stem per branch instead where that saves more: B*'s rows and the control's
    (rubric.delta_baseline) then each forward their own message once."""
    sets: dict[tuple[int, int], list[int]] = {}
    for p, index, start in served:
        sets.setdefault((index, start), []).append(p)
    stems = []
    for (index, start), members in sets.items():
        # one stem for the whole set, or one per branch where its prompts part before any needs a
        # position (with rubric.delta_baseline, B*'s rows and the control's share only the
        # template's header; each side shares its whole message): whichever saves more tokens
        options = [[members], _branches(prompts, members)]
        saved = [[(_stem_end(prompts, first, branch, start), branch) for branch in option] for option in options]
        best = max(saved, key=lambda option: sum((len(b) - 1) * (end - start) for end, b in option))
        stems += [(prompts[branch[0]][:end], index, start) for end, branch in best
                  if (len(branch) - 1) * (end - start) > PAD_TOKENS]
    return stems


def _stem_end(prompts: list[list[int]], first: list[int], members: list[int], start: int) -> int:
    """Where the prompts of `members` part (element by element: lists of ids too), or the first
    position any of them needs, whichever comes first (never before `start`)."""
    common = os.path.commonprefix([prompts[p] for p in members])
    return max(start, min(min(first[p] for p in members), len(common)))


def _branches(prompts: list[list[int]], members: list[int]) -> list[list[int]]:
    """`members` grouped by their token where their prompts part (a prompt that ends there alone)."""
    common = len(os.path.commonprefix([prompts[p] for p in members]))
    groups: dict[int | None, list[int]] = {}
    for p in members:
        groups.setdefault(prompts[p][common] if common < len(prompts[p]) else None, []).append(p)
    return list(groups.values())


def bottom_states(model, sequences: list[list[int]], split: int, token_budget: int = 0,
                  keep_into: PrefixCache | None = None) -> list[torch.Tensor]:
    """The states entering layer `split` ([len, H], float32) of every sequence, without a graph, under
    the caller's autocast; what sequences share forwarded once, each forward's
    rows × (cache + longest row) within `token_budget` tokens (0: any). Frozen layers run once this
    way, and the layers above from the result (engines/frozen.py). `keep_into`: the keys/values of
    layers [0, split) of every sequence no other extends (see shared_prefix_hidden)."""
    decoder = model.get_decoder()
    device = next(model.parameters()).device
    rows, inverse = distinct_rows(sequences)
    prompts = [sequences[row] for row in rows]
    distinct: list[torch.Tensor | None] = [None] * len(prompts)
    ends = maximal(prompts) if keep_into is not None else None

    def keep(p: int, hidden: torch.Tensor, start: int, keys_values) -> None:
        distinct[p] = hidden[:len(prompts[p])].float().clone()
        if ends is not None and ends[p]:
            keep_into.add(prompts[p], keys_values())

    was_training = model.training
    model.eval()  # no dropout: the states stand for every later forward of these layers
    try:
        with torch.no_grad(), frozen.layer_range(decoder, 0, split):
            tree_forward(decoder, decoder.config, prompts, None, device, keep, token_budget, whole=True)
    finally:
        model.train(was_training)
    return [distinct[p] for p in inverse]
