"""Greedy decoding over a fixed-shape KV cache, replayed as CUDA graphs on CUDA.

A small model decoding one token at a time is bound by the host, not the GPU: each step
launches a hundred-odd small kernels from Python, so a step costs what the CPU happens to give
it, and that varies from process to process and from minute to minute. A ``StaticDecoder``
makes every step of a batch the same shapes (the cache reserves its full length up front and
is written at a position held on the device; the attention mask covers that full length and
opens one slot per step), so that one step can be captured once as a CUDA graph and then
replayed with a single launch. On CPU, under autocast, or with ``graphs=False``, the very
same step runs eagerly, which is how CI checks it.

What it computes is what ``generate._decode_batch`` computes: left-padded prompts, padded
positions masked out and skipped by the position ids, argmax of FP32 logits. Only the shapes
of the products differ (attention runs over the reserved length, finished rows stay in the
batch), so tokens agree up to float noise, as between any two batch shapes.

Decoding state is kept per (batch size, reserved length, autocast on or off): one
``StaticDecoder`` serves one model from one thread. Decoders of several models may run on
several threads of one process, each on its own CUDA stream (a server's model instances):
their captures take turns, and a capture tolerates the other threads' work meanwhile.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from nscas.recipes.common.kvcache import reserve
from nscas.recipes.common.next_token import TokenSink, fp32_logits

ROOM_STEP = 64
"""Reserved cache lengths are rounded up to a multiple of this, so that prompts of nearby
lengths share one captured graph."""

_CAPTURE = threading.Lock()
"""One CUDA graph capture at a time in the process (CUDA graphs allow no more)."""


class _StaticLayer(DynamicLayer):
    """Keys and values in room reserved up front, written where ``position`` (a 0-d tensor on
    the device, shared by every layer) says; attention always sees the whole room."""

    def __init__(self, room: int, position: torch.Tensor) -> None:
        super().__init__()
        self.room = room
        self.position = position

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # Zeroed: attention reads the whole room, and 0 x NaN behind a mask would still be NaN.
        self.device = key_states.device
        self.keys = reserve(key_states, self.room, zeroed=True)
        self.values = reserve(value_states, self.room, zeroed=True)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # lazy_initialization made them
        slots = torch.arange(key_states.shape[-2], device=self.device) + self.position
        keys.index_copy_(2, slots, key_states)
        values.index_copy_(2, slots, value_states)
        return keys, values

    def get_seq_length(self) -> int:
        return self.room


@dataclass(slots=True, kw_only=True)
class _State:
    """The fixed-address tensors of one batch shape, and its captured step if any."""

    cache: DynamicCache
    position: torch.Tensor
    """0-d long: the cache slot the next fed token is written to."""
    ids: torch.Tensor
    """[batch, 1]: the token each row feeds next."""
    positions: torch.Tensor
    """[batch, 1]: its position id (counted from the row's first real token)."""
    mask: torch.Tensor
    """[batch, 1, 1, room] bool: which cache slots each row attends to."""
    chosen: torch.Tensor
    """[batch]: the tokens the last step chose."""
    graph: Any = None
    """The captured step (a ``torch.cuda.CUDAGraph``), or None to run it eagerly."""


class StaticDecoder:
    """Greedy batch decoding for one model with fixed-shape steps (CUDA graphs on CUDA)."""

    def __init__(self, model: Any, *, graphs: bool, max_shapes: int = 16,
                 stream: Any = None) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"static decoding cannot run this model: {reason}")
        self._model = model
        self._decoder = model.get_decoder()
        self._head = model.get_output_embeddings()
        named = inspect.signature(self._decoder.forward).parameters
        # transformers 5.2x renamed ``past_key_values`` to ``cache``; the device image has 5.17.
        self._cache_keyword = "cache" if "cache" in named else "past_key_values"
        self._graphs = graphs
        self._max_shapes = max_shapes
        self._stream = stream
        """The ``torch.cuda.Stream`` its steps are captured on (the one its owner decodes on),
        or None for torch's own capture stream."""
        self._states: OrderedDict[tuple[int, int, bool], _State] = OrderedDict()
        self._pool: Any = None
        self.captures = 0
        """How many steps have been captured as CUDA graphs (a test and an operator read it)."""

    @property
    def model(self) -> Any:
        """The model this decoder runs (its state is shaped for it)."""
        return self._model

    @property
    def shapes(self) -> list[tuple[int, int, bool]]:
        """(batch size, reserved length, autocast) of each kept state, least recently used
        first."""
        return list(self._states)

    def decode_batch(
        self,
        prompts: list[tuple[int, ...]],
        max_new_tokens: int,
        eos: frozenset[int],
        pad_id: int,
        device: torch.device,
        *,
        on_token: TokenSink | None = None,
    ) -> list[tuple[list[int], float]]:
        """Greedy-decode one batch; per row, its ids and seconds to finish (as
        ``generate._decode_batch``, whose checks the caller has already made, and whose
        ``on_token`` hook it calls the same way)."""
        started = time.perf_counter()
        n = len(prompts)
        width = max(len(p) for p in prompts)
        room = -(-(width + max_new_tokens) // ROOM_STEP) * ROOM_STEP
        state = self._state(n, room, device)

        ids = torch.full((n, width), pad_id, dtype=torch.long)
        real = torch.zeros((n, width), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            real[row, width - len(prompt) :] = True
        ids, real = ids.to(device), real.to(device)
        positions = (real.long().cumsum(dim=-1) - 1).clamp(min=0)
        # Prefill, eagerly: row r's position i sees its real positions up to i. A padded position
        # sees itself only, so that its (never attended) states stay finite.
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
        seen = (causal & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)
        prefill_mask = torch.zeros((n, 1, width, room), dtype=torch.bool, device=device)
        prefill_mask[:, 0, :, :width] = seen
        state.position.zero_()
        hidden = self._forward(ids, prefill_mask, positions, state.cache)
        state.position.fill_(width)
        state.mask.zero_()
        state.mask[:, 0, 0, :width] = real
        state.chosen.copy_(fp32_logits(self._head, hidden).argmax(dim=-1))
        state.ids.copy_(state.chosen[:, None])
        state.positions.copy_(positions[:, -1:] + 1)

        generated: list[list[int]] = [[] for _ in range(n)]
        seconds = [0.0] * n
        live = set(range(n))
        chosen = state.chosen.tolist()
        for step in range(max_new_tokens):
            now = time.perf_counter()
            for row in sorted(live):
                generated[row].append(chosen[row])
                ended = on_token is not None and not on_token(row, chosen[row])
                if chosen[row] in eos or step == max_new_tokens - 1 or ended:
                    seconds[row] = now - started
                    live.discard(row)
            if not live:
                break
            # Finished rows stay in the batch (its shape is fixed); their tokens are ignored.
            if state.graph is not None:
                state.graph.replay()
            else:
                self._step(state)
            chosen = state.chosen.tolist()
        return [(generated[row], seconds[row]) for row in range(n)]

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        return self._decoder(input_ids=ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, **{self._cache_keyword: cache}
                             ).last_hidden_state[:, -1]

    def _step(self, state: _State) -> None:
        """Feed each row's chosen token and choose the next: device work only, no host sync,
        so that it can be captured."""
        state.mask.index_fill_(3, state.position.view(1), True)
        hidden = self._forward(state.ids, state.mask, state.positions, state.cache)
        state.chosen.copy_(fp32_logits(self._head, hidden).argmax(dim=-1))
        state.ids.copy_(state.chosen[:, None])
        state.positions.add_(1)
        state.position.add_(1)

    def _state(self, n: int, room: int, device: torch.device) -> _State:
        key = (n, room, torch.is_autocast_enabled(device.type))
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        while len(self._states) >= self._max_shapes:
            self._states.popitem(last=False)
        position = torch.zeros((), dtype=torch.long, device=device)
        cache = DynamicCache(config=self._model.config)
        cache.layers = [_StaticLayer(room, position) for _ in cache.layers]
        state = _State(
            cache=cache, position=position,
            ids=torch.zeros((n, 1), dtype=torch.long, device=device),
            positions=torch.zeros((n, 1), dtype=torch.long, device=device),
            mask=torch.zeros((n, 1, 1, room), dtype=torch.bool, device=device),
            chosen=torch.zeros((n,), dtype=torch.long, device=device))
        # Not under autocast: its cache of cast weights lives outside the graph's memory and
        # is dropped when the autocast region ends, so a captured step would read freed memory.
        if self._graphs and device.type == "cuda" and not key[2]:
            self._capture(state)
        else:
            self._step(state)  # allocates the cache's room, as a capture's warm-up would
        self._states[key] = state
        return state

    def _capture(self, state: _State) -> None:
        # Warm up on a side stream (allocations, kernel selection), then record one step. The
        # warm-up steps write into slots the next prefill resets or masks out.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(state)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads may go on launching, allocating and synchronising on
        # their own streams while this thread captures.
        with _CAPTURE, torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                        capture_error_mode="thread_local"):
            self._step(state)
        state.graph = graph
        self.captures += 1


def unsupported(model: Any) -> str | None:
    """Why ``StaticDecoder`` cannot decode ``model``, or None if it can: it needs SDPA
    attention (boolean masks) and only full-attention cache layers."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != "sdpa":
        return f"its attention implementation is {implementation!r}, not 'sdpa'"
    layers = DynamicCache(config=model.config).layers
    if any(type(layer) is not DynamicLayer for layer in layers):
        return "it has sliding-window or other non-full attention layers"
    return None
