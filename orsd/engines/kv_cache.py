"""A KV cache for generating on a CPU: transformers' DynamicCache with room reserved ahead, so a
decode step writes in place instead of copying the whole cache, and keys stored in the values'
dtype (engines/hf.py uses it)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """transformers' DynamicLayer with room reserved for `capacity` positions: a decode step writes its
    keys and values in place instead of concatenating them to a copy of the whole cache.

    The concatenation copies every layer's cache at every step, a large share of a small model's
    decode step on a CPU; writing in place gives identical fp32 logits. `keys`/`values` are
    views of the first `length` positions of the buffers, so everything that reads them (masks,
    attention, get_seq_length) sees what DynamicLayer shows. Whatever replaces them from outside
    (beam reordering, cropping, batch repeats) is adopted as the new contents on the next update."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._room: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        # Keys are kept in the values' dtype. Under bf16 autocast they leave the rotary embedding in
        # fp32 (its cos/sin follow the fp32 residual stream) while values are bf16, and transformers'
        # sdpa casts them to bf16 at every call anyway; stored in fp32 they were a third more bytes
        # for every decode step to read (engines/hf.py: gqa_decode_attention).
        if key_states.dtype != value_states.dtype:
            key_states = key_states.to(value_states.dtype)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        room = self._room
        if (room is None or self.keys.data_ptr() != room[0].data_ptr() or length + new > room[0].shape[-2]
                or room[0].shape[:2] != key_states.shape[:2] or room[0].dtype != key_states.dtype
                or room[1].dtype != value_states.dtype):
            room = self._reserve(key_states, value_states, length, max(self.capacity, 2 * (length + new)))
        room[0][:, :, length:length + new] = key_states
        room[1][:, :, length:length + new] = value_states
        self.keys, self.values = room[0][:, :, :length + new], room[1][:, :, :length + new]
        return self.keys, self.values

    def _reserve(self, key_states, value_states, length: int, capacity: int):
        """New buffers of `capacity` positions holding the `length` positions cached so far."""
        batch, heads = key_states.shape[:2]
        keys = key_states.new_empty((batch, heads, capacity, key_states.shape[-1]))
        values = value_states.new_empty((batch, value_states.shape[1], capacity, value_states.shape[-1]))
        if length:
            keys[:, :, :length] = self.keys
            values[:, :, :length] = self.values
        self._room = (keys, values)
        return self._room


def reserved_cache(model, capacity: int) -> DynamicCache:
    """The model's DynamicCache with every full-attention layer a ReservedLayer of `capacity`
    positions (sliding-window layers keep transformers' own class)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [ReservedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
