"""Forwards along a prefix tree: every distinct sequence once, and a prefix that several share
computed once (`tree_forward`). engines/prefill.py builds the passes on it: the hf decode loop's
prefill, and the hidden states that replay, the reference pass, the update and the warm start take.

A rollout turn's prompts share a lot: a group's episodes start from the same system prompt, task
and first observation (~230 of ~300–570 tokens on the default WebShop shape), and the group's
first turn is the same prompt N times. Prefilled as one left-padded batch, every row also paid
for the padding up to the longest prompt, and on a CPU that prefill cost about as much as the
turn's decode steps.

Here the distinct prompts form a prefix tree (`prefix_tree`): a node holds the tokens all its
prompts share beyond its parent's. A chain of segments, following the child with the most prompts
(`trunks`), is forwarded once on one row; everything that branches off it (another prompt's own
remainder, another chain) continues from its keys and values in right-padded batches, each row
masked past the position where it branches off (`tree_forward`). A forward reads every weight
once whatever its few tokens, so the number of forwards is what this saves: a step's 30 records
on the default shape take 12 forwards for the plain replay pass instead of 32 with one forward
per segment and per node's leaves, 15 instead of 34 for the rubric pass (whose records branch
off their trajectory at each turn's slot), for ~20% more tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from .kv_cache import ReservedLayer


@dataclass
class Node:
    """Tokens [start, end) of every prompt in `prompts`, which all share tokens [0, end)."""

    start: int
    end: int
    prompts: list[int]
    children: list[Node] = field(default_factory=list)

    @property
    def is_leaf(self) -> bool:
        return not self.children


def prefix_tree(prompts: list[list[int]], first: list[int] | None = None) -> Node:
    """The prefix tree of distinct, non-empty `prompts`. A node's segment stops at the first
    position whose hidden state one of its prompts needs (`first[i]`; by default its last token,
    whose logits start a decode), so every needed position lies in a leaf."""
    if len({tuple(p) for p in prompts}) != len(prompts) or not all(prompts):
        raise ValueError("prefix_tree: expected distinct, non-empty prompts")
    first = [len(p) - 1 for p in prompts] if first is None else first
    if any(not 0 <= f < len(p) for f, p in zip(first, prompts)) or len(first) != len(prompts):
        raise ValueError("prefix_tree: first[i] must be a position of prompt i")
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    return _node(prompts, first, order, 0)


def _node(prompts: list[list[int]], first: list[int], order: list[int], start: int) -> Node:
    if len(order) == 1:
        return Node(start, len(prompts[order[0]]), order)
    # sorted, so what the first and last prompts share, all share
    lowest, highest = prompts[order[0]], prompts[order[-1]]
    end, limit = start, min(first[i] for i in order)
    while end < limit and lowest[end] == highest[end]:
        end += 1
    node = Node(start, end, order)
    # children: a prompt that needs position `end` alone (the segment stopped for it), the others
    # in runs with the same token at `end` (contiguous, as the prompts are sorted)
    runs: list[list[int]] = []
    for i in order:
        if first[i] == end:
            runs.append([i])
        elif runs and first[runs[-1][0]] > end and prompts[runs[-1][0]][end] == prompts[i][end]:
            runs[-1].append(i)
        else:
            runs.append([i])
    node.children = [_node(prompts, first, run, end) for run in runs]
    return node


def distinct_rows(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """The first row of each distinct prompt, and for every row the index of its prompt among them."""
    seen: dict[tuple, int] = {}
    first, inverse = [], []
    for row, prompt in enumerate(prompts):
        key = tuple(prompt)
        if key not in seen:
            seen[key] = len(first)
            first.append(row)
        inverse.append(seen[key])
    return first, inverse


#: padding a leaf batch may add beyond a quarter of its tokens: about what one more forward costs
#: (a forward reads every weight once, so a short forward costs as much as ~100 further tokens)
PAD_TOKENS = 96


@dataclass
class Hanging:
    """Tokens `tokens` of prompt `prompt` from position `start` on, forwarded on a cache that holds
    the prompt's positions [0, start) (and maybe more, masked out). A trunk (`items` not None) is a
    chain of the tree's segments: what hangs off it continues from its keys/values."""

    start: int
    tokens: list[int]
    prompt: int
    items: list[Hanging] | None = None


def trunks(node: Node, prompts: list[list[int]]) -> list[Hanging]:
    """The tree below `node.start` as trunks and leaves to forward on a cache of positions
    [0, node.start): from `node`, a trunk follows the inner child with the most prompts down to a
    node without inner children, in one forward; every leaf and other inner child along it hangs off
    it at its own start. An empty trunk hands its items to its parent."""
    path = [node]
    while inner := [c for c in path[-1].children if not c.is_leaf]:
        path.append(max(inner, key=lambda c: len(c.prompts)))
    items: list[Hanging] = []
    for here, onward in zip(path, path[1:] + [None]):
        for child in here.children:
            if child is onward:
                continue
            if child.is_leaf:
                items.append(Hanging(here.end, prompts[child.prompts[0]][here.end:], child.prompts[0]))
            else:
                items += trunks(child, prompts)
    last = path[-1].prompts[0]
    if path[-1].end == node.start:
        return items
    return [Hanging(node.start, prompts[last][node.start:path[-1].end], last, items)]


def tree_forward(decoder, config, prompts: list[list[int]], first: list[int] | None, device, on_leaf,
                 token_budget: int = 0, embed=None, whole: bool = False,
                 base: tuple[list[tuple], list[int]] | None = None) -> None:
    """Forward distinct `prompts` along their prefix tree, each chain of segments (`trunks`) in one
    forward and what hangs off a trunk in batches on its keys/values, each row masked past its own
    start. For each prompt i, once: `on_leaf(i, hidden, start, kv)`: `hidden` [W, H] is its final
    hidden states from position `start` on (right-padded), `kv()` its keys/values per layer
    ([KV, L, D] each, positions [0, L)). A batch's rows × (cache + longest row) stays within
    `token_budget` tokens (0: any). `embed(i, start, end)`, when given, is the decoder's input
    ([end - start, H]) for tokens [start, end) of prompt i, in place of the token ids (a decoder
    that starts above frozen layers: engines/frozen.py). `whole`: `hidden` covers every position of
    the prompt (start 0), its shared prefix's states taken from the trunks it hangs off.
    `base` = (per prompt i, keys/values per layer of a sequence already forwarded, [KV, L, D] each,
    that hold its positions [0, starts[i]); starts): every prompt instead continues from those at
    its start, in batches as above whose cache rows are each their own prompt's, without a tree
    (PrefixCache).
    Size: one walk of the prefix tree; the keys/values, trunks and batches live across the walk, and the
    parameters are its inputs and its two hooks (embed, on_leaf)."""
    from transformers.cache_utils import DynamicCache

    def forward(cache, length: int, batch: list[Hanging]):
        """The batch's rows right-padded, on `cache` (`length` positions, one row) repeated per row."""
        width = max(len(item.tokens) for item in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), length + width), dtype=torch.long)
        positions = torch.empty((len(batch), width), dtype=torch.long)
        for row, item in enumerate(batch):
            ids[row, :len(item.tokens)] = torch.tensor(item.tokens, dtype=torch.long)
            mask[row, :item.start] = 1  # its own prefix; the cache's positions past it are another prompt's
            mask[row, length:length + len(item.tokens)] = 1
            positions[row] = item.start + torch.arange(width)
        branch = DynamicCache(config=config) if cache is None else _branch(cache)
        if cache is not None and len(batch) > 1 and cache.layers[0].keys.shape[0] == 1:  # one row for all
            branch.batch_repeat_interleave(len(batch))
        inputs = {"input_ids": ids.to(device)} if embed is None else {"inputs_embeds": _embedded(embed, batch, width)}
        hidden = decoder(**inputs, attention_mask=mask.to(device), position_ids=positions.to(device),
                         past_key_values=branch, use_cache=True).last_hidden_state
        return branch, hidden

    def row_kv(cache, row: int, length: int, item: Hanging) -> list[tuple]:
        """Keys/values of positions [0, item.start + len(item.tokens)) of `item`'s row."""
        end = length + len(item.tokens)
        if item.start == length:
            return [(layer.keys[row, :, :end], layer.values[row, :, :end]) for layer in cache.layers]
        return [(torch.cat([layer.keys[row, :, :item.start], layer.keys[row, :, length:end]], dim=1),
                 torch.cat([layer.values[row, :, :item.start], layer.values[row, :, length:end]], dim=1))
                for layer in cache.layers]

    def visit(cache, length: int, items: list[Hanging], path: torch.Tensor | None) -> None:
        """`path`: with `whole`, the states of positions [0, length) of the trunk `cache` holds (None at the root)."""
        for batch in _batches(items, length, token_budget):
            out, hidden = forward(cache, length, batch)
            later = []
            for row, item in enumerate(batch):
                own = hidden[row] if not whole or not item.start else torch.cat([path[:item.start], hidden[row]])
                if item.items is None:
                    on_leaf(item.prompt, own, 0 if whole else item.start,
                            lambda r=row, i=item: row_kv(out, r, length, i))
                else:  # a trunk: its own cache (one row) for what hangs off it; copied out of a
                    # batch of several rows, whose whole cache a view would keep alive while they run
                    trunk = DynamicCache(config=config)
                    for index, (keys, values) in enumerate(row_kv(out, row, length, item)):
                        if len(batch) > 1 and item.start == length:  # row_kv gave views
                            keys, values = keys.clone(), values.clone()
                        trunk.update(keys.unsqueeze(0), values.unsqueeze(0), index)
                    end = item.start + len(item.tokens)
                    later.append((trunk, end, item.items, own[:end].clone() if whole else None))
            del out, hidden
            for trunk, end, hanging, states in later:
                visit(trunk, end, hanging, states)

    try:
        if base is not None:  # rows from different kept sequences, each cache row its own, in one forward
            kvs, starts = base
            items = [Hanging(s, prompt[s:], i) for i, (prompt, s) in enumerate(zip(prompts, starts))]
            for batch in _continued_batches(items, token_budget):
                length = max(item.start for item in batch)
                cache = _stacked(config, [kvs[item.prompt] for item in batch], [item.start for item in batch],
                                 length, max(len(item.tokens) for item in batch))
                out, hidden = forward(cache, length, batch)
                for row, item in enumerate(batch):
                    on_leaf(item.prompt, hidden[row], item.start, lambda r=row, i=item: row_kv(out, r, length, i))
                del out, hidden
            return
        root = prefix_tree(prompts, first)
        visit(None, 0, trunks(Node(0, 0, root.prompts, [root]), prompts), None)
    finally:
        # `visit` calls itself through this frame's cell, a reference cycle that held every cell of the
        # frame (on_leaf, and the hidden states and kept keys/values it fills) until Python's cycle
        # collector ran, so a rubric pass's kept keys/values stayed resident after it
        del visit


def _embedded(embed, batch: list[Hanging], width: int) -> torch.Tensor:
    rows = [embed(item.prompt, item.start, item.start + len(item.tokens)) for item in batch]
    out = rows[0].new_zeros((len(rows), width, rows[0].shape[-1]))
    for row, states in enumerate(rows):
        out[row, :len(states)] = states
    return out


def _batches(items: list[Hanging], length: int, token_budget: int = 0) -> list[list[Hanging]]:
    """Items batched by length: a batch's padding stays under a quarter of its tokens plus
    PAD_TOKENS, and its rows × (length + longest row) within `token_budget` (0: any)."""
    batches, current, total = [], [], 0
    for item in sorted(items, key=lambda item: len(item.tokens)):
        size = len(item.tokens)
        padded = (len(current) + 1) * size
        if current and (padded - total - size > 0.25 * (total + size) + PAD_TOKENS
                        or (token_budget and (len(current) + 1) * (length + size) > token_budget)):
            batches.append(current)
            current, total = [], 0
        current.append(item)
        total += size
    if current:
        batches.append(current)
    return batches


def _continued_batches(items: list[Hanging], token_budget: int = 0) -> list[list[Hanging]]:
    """Batches for rows that each continue from a cache of their own (tree_forward's `base`): a
    batch pads every row's cache to its latest start and its tokens to its longest, and a row's
    attention reads its cache as well as its tokens, so unlike `_batches` the starts count too.
    Sorted by where rows end, a batch grows while its padding stays under a quarter of its rows'
    tokens plus PAD_TOKENS and its padded query-key pairs under a quarter more than its rows' own
    plus PAD_TOKENS' worth; rows × (start + longest row) within `token_budget` (0: any). On the
    default step's rubric pass: 29 rows in 5 forwards of 3.7M query-key pairs per layer and head
    where batching by length alone gave 6 of 4.6M (docs/training.md)."""
    batches, current = [], []
    for item in sorted(items, key=lambda item: (item.start + len(item.tokens), item.start)):
        grown = current + [item]
        start = max(i.start for i in grown)
        width = max(len(i.tokens) for i in grown)
        tokens = sum(len(i.tokens) for i in grown)
        pairs = sum(len(i.tokens) * (i.start + len(i.tokens)) for i in grown)
        if current and (len(grown) * width - tokens > 0.25 * tokens + PAD_TOKENS
                        or len(grown) * width * (start + width) - pairs > 0.25 * pairs + PAD_TOKENS * (start + width)
                        or (token_budget and len(grown) * (start + width) > token_budget)):
            batches.append(current)
            grown = [item]
        current = grown
    if current:
        batches.append(current)
    return batches


def _stacked(config, kvs: list[list[tuple]], starts: list[int], length: int, width: int):
    """A cache of one row per (keys/values per layer, start): positions [0, start) of each, zero
    past them up to `length` (masked out by tree_forward), with room for `width` more positions
    written in place (kv_cache.ReservedLayer: no copy of the whole cache per layer). Keys are kept
    in the values' dtype, as that layer keeps them (transformers' sdpa casts them to it anyway)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=config)
    layers = []
    for index in range(len(kvs[0])):
        keys0, values0 = kvs[0][index]
        keys = values0.new_zeros((len(kvs), keys0.shape[0], length + width, keys0.shape[-1]))
        values = values0.new_zeros((len(kvs), values0.shape[0], length + width, values0.shape[-1]))
        for row, (kv, start) in enumerate(zip(kvs, starts)):
            keys[row, :, :start] = kv[index][0][:, :start]
            values[row, :, :start] = kv[index][1][:, :start]
        layer = ReservedLayer(length + width)
        layer.lazy_initialization(values, values)
        layer._room = (keys, values)
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        layers.append(layer)
    cache.layers = layers
    return cache


def _branch(cache):
    """A cache that continues from `cache` without changing it: transformers' DynamicLayer appends by
    concatenating into a new tensor, so the branch can hold the same tensors (no copy, and under
    autograd the shared prefix's graph is shared, its gradient summed over the branches)."""
    branch = copy.copy(cache)
    branch.layers = [copy.copy(layer) for layer in cache.layers]
    return branch
