"""A KV cache for a batch whose rows come and go: preallocated, growable, joinable, left-trimmable.

transformers' DynamicCache grows by `torch.cat` every step (a copy of the whole cache per token). Here each layer
keeps a buffer with spare capacity; a step writes the new keys/values into it and hands the model a view. Rows are
left-padded: a row's real tokens end at the right edge, so all rows append at the same column. Joining two
batches pads the shorter cache on the left; dropping finished rows selects rows and trims columns that are
padding for every remaining row.

Importing this module imports torch and transformers; the engine imports it when the server starts.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

GROWTH_STEP = 256


class GrowableLayer(DynamicLayer):
    """One layer's keys and values, [batch, kv_heads, length, head_dim] views into a larger buffer."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._key_buffer = key_states.new_empty(_capacity_shape(key_states, 0))
        self._value_buffer = value_states.new_empty(_capacity_shape(value_states, 0))
        self.length = 0
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        self._reserve(self.length + new)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, self.length : self.length + new] = key_states
        self._value_buffer[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._refresh_views()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def _reserve(self, length: int) -> None:
        assert self._key_buffer is not None and self._value_buffer is not None
        if length <= self._key_buffer.shape[-2]:
            return
        keys = self._key_buffer.new_empty(_capacity_shape(self._key_buffer, length))
        values = self._value_buffer.new_empty(_capacity_shape(self._value_buffer, length))
        keys[:, :, : self.length] = self._key_buffer[:, :, : self.length]
        values[:, :, : self.length] = self._value_buffer[:, :, : self.length]
        self._key_buffer, self._value_buffer = keys, values

    def _refresh_views(self) -> None:
        assert self._key_buffer is not None and self._value_buffer is not None
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def _replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Take `keys`/`values` [B, H, L, D] as the whole content (copied into a fresh buffer with spare room)."""
        self.length = keys.shape[-2]
        self._key_buffer = keys.new_empty(_capacity_shape(keys, self.length))
        self._value_buffer = values.new_empty(_capacity_shape(values, self.length))
        self._key_buffer[:, :, : self.length] = keys
        self._value_buffer[:, :, : self.length] = values
        self._refresh_views()

    def select_rows(self, index: torch.Tensor, drop_left: int = 0) -> None:
        if self.is_initialized and self.keys is not None:
            self._replace(self.keys[index, :, drop_left:], self.values[index, :, drop_left:])  # type: ignore[index]

    def join(self, other: GrowableLayer) -> None:
        """Append `other`'s rows below this layer's rows, left-padding the shorter one."""
        assert self.keys is not None and self.values is not None and other.keys is not None
        assert other.values is not None
        length = max(self.length, other.length)
        keys = torch.cat([pad_left(self.keys, length), pad_left(other.keys, length)], dim=0)
        values = torch.cat([pad_left(self.values, length), pad_left(other.values, length)], dim=0)
        self._replace(keys, values)


class BatchKVCache(Cache):
    """The cache of a decode batch (one `GrowableLayer` per decoder layer, created on first use)."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=GrowableLayer)

    @property
    def growable_layers(self) -> list[GrowableLayer]:
        return [layer for layer in self.layers if isinstance(layer, GrowableLayer)]

    def select_rows(self, index: torch.Tensor, drop_left: int = 0) -> None:
        """Keep the rows in `index` (in that order, repeats allowed) and drop `drop_left` leading columns."""
        for layer in self.growable_layers:
            layer.select_rows(index, drop_left)

    def join(self, other: BatchKVCache) -> None:
        for mine, theirs in zip(self.growable_layers, other.growable_layers, strict=True):
            mine.join(theirs)


def _capacity_shape(tensor: torch.Tensor, length: int) -> tuple[int, ...]:
    batch, heads, _, head_dim = tensor.shape
    capacity = (length // GROWTH_STEP + 1) * GROWTH_STEP
    return (batch, heads, capacity, head_dim)


def pad_left(tensor: torch.Tensor, length: int, dim: int = -2) -> torch.Tensor:
    """`tensor` left-padded with zeros to `length` along `dim` (default: a cache's sequence axis)."""
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
