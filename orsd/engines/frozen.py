"""Frozen bottom layers run once: their output kept per sequence and the layers above started from it.

With `warm_start.train_layers` or `optim.train_layers` set, the bottom decoder layers (and the
embeddings) never change, so what they compute for a sequence is the same at every later forward.
The warm start runs them once per demonstration (`prefill.bottom_states`, along the prefix tree)
and every epoch only the fitted layers on top of those states; the plain replay pass hands its
records' states to the reference pass and the update (train/replay.py). Each epoch then skips
the frozen layers' forward, a fixed share of its time (docs/performance.md has the figure).

`layer_range(decoder, start, stop)` makes the decoder run layers [start, stop) alone: its layer
list, its config's layer count and layer types, and every layer's `layer_idx` (the index of its
keys/values in a cache) are those of a model made of those layers, for the time of the `with`.
Below the top it skips the final norm; above the bottom the caller passes `inputs_embeds` (the
states of layer `start`). An architecture whose forward transforms `inputs_embeds` (scales or
shifts them) would break this, so `serves` checks, once per model and split, that the two halves
reproduce the whole forward.
"""

from __future__ import annotations

import copy
import weakref
from contextlib import contextmanager

import torch

_checked: "weakref.WeakKeyDictionary[torch.nn.Module, dict[int, bool]]" = weakref.WeakKeyDictionary()


def frozen_layers(model) -> int:
    """How many bottom decoder layers, with the embeddings, have no parameter that takes a gradient
    (0 when the embeddings train or the model has no decoder layer list)."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    embed = model.get_input_embeddings()
    if layers is None or embed is None or any(p.requires_grad for p in embed.parameters()):
        return 0
    count = 0
    for layer in layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        count += 1
    return count if count < len(layers) else 0  # a fully frozen model has nothing to fit


@contextmanager
def layer_range(decoder, start: int, stop: int):
    """Within: `decoder` runs its layers [start, stop) as a model of those layers alone; without
    the final norm when `stop` is below the top. Everything is restored on exit."""
    layers, config = decoder.layers, decoder.config
    if not 0 <= start < stop <= len(layers):
        raise ValueError(f"layer_range: [{start}, {stop}) is not a range of the decoder's {len(layers)} layers")
    sliced = copy.copy(config)
    sliced.num_hidden_layers = stop - start
    if getattr(config, "layer_types", None) is not None:
        sliced.layer_types = list(config.layer_types[start:stop])
    shifted = [(m, m.layer_idx) for layer in layers[start:stop] for m in layer.modules()
               if isinstance(getattr(m, "layer_idx", None), int)]
    norm = decoder.norm if stop < len(layers) else None
    try:
        decoder.layers = torch.nn.ModuleList(layers[start:stop])
        decoder.config = sliced
        for module, index in shifted:
            module.layer_idx = index - start
        if norm is not None:
            decoder.norm = torch.nn.Identity()
        yield decoder
    finally:
        decoder.layers, decoder.config = layers, config
        for module, index in shifted:
            module.layer_idx = index
        if norm is not None:
            decoder.norm = norm


def serves(model, split: int) -> bool:
    """Whether the decoder's layers [0, split) then [split, top) from their states reproduce the whole
    forward (checked once per model and split, on a few tokens)."""
    known = _checked.setdefault(model, {})
    if split not in known:
        known[split] = _reproduces(model, split)
    return known[split]


def _reproduces(model, split: int) -> bool:
    decoder = model.get_decoder()
    if not hasattr(decoder, "layers") or not hasattr(decoder, "norm") or not 0 < split < len(decoder.layers):
        return False
    device = next(model.parameters()).device
    ids = torch.arange(1, 9, device=device).unsqueeze(0) % model.config.vocab_size
    with torch.no_grad():  # under the caller's autocast: frozen layers may hold their weights in its dtype
        whole = decoder(input_ids=ids).last_hidden_state.float()
        try:
            with layer_range(decoder, 0, split):
                states = decoder(input_ids=ids).last_hidden_state
            with layer_range(decoder, split, len(decoder.layers)):
                top = decoder(inputs_embeds=states).last_hidden_state.float()
        except (TypeError, ValueError, AttributeError, IndexError):  # a forward that cannot run on a slice
            return False
    # the same operations on the same rows: equal but for rounding, where a slice that transforms its
    # input (as Gemma's forward once scaled inputs_embeds by sqrt(H)) is off by far more
    return torch.allclose(top, whole, rtol=1e-3, atol=1e-3 * float(whole.abs().max()))
