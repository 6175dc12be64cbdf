"""The KV cache in room reserved up front, shared by both decoders: the dynamic decoder's layer
(``generate``), and the storage that the fixed-shape one (``static_decode``) reserves too."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from nscas.errors import InvalidInput


class _RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes into room reserved up front.

    The stock layer concatenates at every step, copying the whole cache each time: for a batch
    that copying, not arithmetic, dominated decoding on CPU. Here the keys and values handed to
    attention are views of the reserved room, so a step copies only its own states.
    """

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.key_room = reserve(key_states, self.room)
        self.value_room = reserve(value_states, self.room)
        self.length = 0
        self._expose()
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.room:
            raise InvalidInput(f"the cache has room for {self.room} positions, not {end}")
        self.key_room[:, :, self.length : end] = key_states
        self.value_room[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # _expose set them
        return keys, values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.key_room = self.key_room[indices]
            self.value_room = self.value_room[indices]
            self._expose()

    def _expose(self) -> None:
        self.keys = self.key_room[:, :, : self.length]
        self.values = self.value_room[:, :, : self.length]


def reserve(states: torch.Tensor, room: int, *, zeroed: bool = False) -> torch.Tensor:
    """Cache storage for ``room`` positions of ``states`` ([batch, heads, length, dim]); zeroed
    where slots that were never written may still be read (behind a mask)."""
    batch, heads, _, dim = states.shape
    make = states.new_zeros if zeroed else states.new_empty
    return make((batch, heads, room, dim))


def roomy_cache(config: Any, *, room: int) -> DynamicCache:
    """A dynamic cache whose full-attention layers reserve ``room`` positions up front."""
    cache = DynamicCache(config=config)
    cache.layers = [
        _RoomyLayer(room) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache
