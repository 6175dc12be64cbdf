"""Exact batched greedy decoding: what ``evaluate`` scores and what a replica serves.

Batching changes speed, never tokens: prompts are left-padded, padded positions are masked out
of attention and skipped by the position ids, so each row computes what it would compute alone,
up to float noise from matrix products of another shape. The next token is the argmax of FP32
logits, so that noise decides a token only where the two best logits are within it.

On CPU (FP32) that noise is about 1e-6 of a logit, and batched output equals one-at-a-time
output token for token (tests/recipes/test_generate.py). Under BF16 autocast on CUDA a product of
another shape can round a value differently by a BF16 step: a trained model kept every token
(same test, on an H200), but a random ~38M model, whose best logits are often close, changed
tokens in 16 of 64 rows within 96 steps. ``precision="fp32"`` turns autocast and TF32 off for
the call: on CUDA the noise is then FP32's, as on CPU, at a cost in speed. Either way the batch
size and the precision are recorded with the outputs.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from nscas.errors import InvalidInput

if TYPE_CHECKING:
    from .static_decode import StaticDecoder


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    """One prompt's greedy continuation, retained whole by ``evaluate`` (docs/experiment.md §4)."""

    prompt_ids: tuple[int, ...]
    """The prompt's token ids, exactly as given."""
    output_ids: tuple[int, ...]
    """The generated ids; the end-of-turn token that stopped the row is the last one, if any."""
    text: str
    """``output_ids`` without that end-of-turn token, decoded with special tokens skipped."""
    seconds: float
    """Wall-clock seconds from the start of this row's batch until its last token was chosen."""
    tokens_per_second: float
    """``len(output_ids) / seconds``: this row's rate, not the batch's."""
    ended_with_eos: bool
    """The row stopped at one of the ``eos_ids`` (even if that was its last allowed token)."""
    hit_token_limit: bool
    """The row produced ``max_new_tokens`` tokens without an end-of-turn token."""


Chooser = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]
"""(FP32 logits of the live rows [live, vocab], the prompt index of each) -> their next tokens.
A server's sampling; without one, the next token is the argmax."""
TokenSink = Callable[[int, int], bool]
"""(prompt index, the token just chosen for it) -> False to end that row now. Called as each
token is chosen, so that a server can stream it and stop at a stop string."""


def stop_ids(tokenizer: Any) -> set[int]:
    """The ids greedy generation stops at (docs/format.md §6.9): the chat template's
    end-of-turn token (``tokenise.end_of_turn``, which refuses a template without one) and the
    tokenizer's eos token, where it has one (a model that writes it has ended, too)."""
    from nscas.recipes.common.tokenise import end_of_turn

    ids = {end_of_turn(tokenizer).id}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int = 96,
    batch_size: int = 16,
    eos_ids: set[int],
    device: torch.device | str,
    precision: Literal["bf16", "fp32"] = "bf16",
    static: StaticDecoder | None = None,
    choose: Chooser | None = None,
    on_token: TokenSink | None = None,
) -> list[Generation]:
    """Greedy continuations of ``prompts`` (token ids), in the order given.

    ``model`` is a Hugging Face causal LM whose logits are its output embedding applied to the
    decoder's last hidden state (Llama, Qwen2 and kin), already on ``device`` and in eval mode;
    ``tokenizer`` only decodes. Prompts are sorted by length into batches of ``batch_size``
    to limit padding. Each row stops at its first token in ``eos_ids`` or after
    ``max_new_tokens`` tokens. ``precision`` "bf16": BF16 autocast on CUDA; "fp32": FP32 matrix
    products without TF32. On CPU both are FP32. Nothing is truncated. ``static``, a
    ``StaticDecoder`` of this very model, decodes each batch with fixed-shape steps instead
    (replayed as CUDA graphs on CUDA; the same tokens up to float noise). ``choose`` and
    ``on_token`` (a server's hooks, see their types) leave decoding as it is when absent;
    ``choose`` needs eager decoding (no ``static``).
    """
    where = torch.device(device)
    _check(model, prompts, max_new_tokens, batch_size, eos_ids, where)
    if precision not in ("bf16", "fp32"):
        raise InvalidInput(f"precision must be 'bf16' or 'fp32', not {precision!r}")
    if static is not None and static.model is not model:
        raise InvalidInput("the static decoder was made for another model")
    if static is not None and choose is not None:
        raise InvalidInput("a static decoder chooses argmax tokens only; decode eagerly to sample")
    eos = frozenset(eos_ids)
    # Any valid id will do for padding: padded positions are masked out of every attention.
    pad_id = min(eos)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    results: dict[int, Generation] = {}
    with torch.inference_mode(), _precision(where, precision):
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = [tuple(int(t) for t in prompts[i]) for i in rows]
            # The hooks name prompts by their index in ``prompts``, not by their batch row.
            local_choose = None if choose is None else (
                lambda logits, live, rows=rows: choose(logits, [rows[r] for r in live]))
            local_sink = None if on_token is None else (
                lambda row, token, rows=rows: on_token(rows[row], token))
            if static is None:
                outputs = _decode_batch(model, batch, max_new_tokens, eos, pad_id, where,
                                        choose=local_choose, on_token=local_sink)
            else:
                outputs = static.decode_batch(batch, max_new_tokens, eos, pad_id, where,
                                              on_token=local_sink)
            for i, prompt, (ids, seconds) in zip(rows, batch, outputs, strict=True):
                results[i] = _generation(tokenizer, prompt, ids, seconds, eos, max_new_tokens)
    return [results[i] for i in range(len(prompts))]


def _decode_batch(
    model: Any,
    prompts: list[tuple[int, ...]],
    max_new_tokens: int,
    eos: frozenset[int],
    pad_id: int,
    device: torch.device,
    *,
    choose: Chooser | None = None,
    on_token: TokenSink | None = None,
) -> list[tuple[list[int], float]]:
    """Greedy-decode one batch with the KV cache; per row, its ids and seconds to finish.
    The hooks take batch rows here (``generate_greedy`` maps them to prompt indices)."""
    started = time.perf_counter()
    n = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    # Each row counts positions from its first real token, as it would without padding.
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    last_position = positions[:, -1]

    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    cache = _cache(model.config, room=width + max_new_tokens)
    # transformers 5.2x renamed ``past_key_values`` to ``cache``; the device image has 5.17.
    named = inspect.signature(decoder.forward).parameters
    cache_keyword = "cache" if "cache" in named else "past_key_values"
    generated: list[list[int]] = [[] for _ in range(n)]
    seconds = [0.0] * n
    live = list(range(n))  # the batch row of each row still decoding
    for step in range(max_new_tokens):
        hidden = decoder(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{cache_keyword: cache},
        ).last_hidden_state[:, -1]
        logits = fp32_logits(head, hidden)
        chosen = logits.argmax(dim=-1) if choose is None else choose(logits, live)
        now = time.perf_counter()
        keep = []
        for index, (row, token) in enumerate(zip(live, chosen.tolist(), strict=True)):
            generated[row].append(token)
            ended = on_token is not None and not on_token(row, token)
            if token in eos or step == max_new_tokens - 1 or ended:
                seconds[row] = now - started
            else:
                keep.append(index)
        if not keep:
            break
        if len(keep) < len(live):
            # Finished rows leave the batch so that they cost nothing more.
            selected = torch.tensor(keep, device=device)
            cache.batch_select_indices(selected)
            mask, chosen, last_position = mask[selected], chosen[selected], last_position[selected]
            live = [live[index] for index in keep]
        ids = chosen[:, None]
        last_position = last_position + 1
        positions = last_position[:, None]
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
    return [(generated[row], seconds[row]) for row in range(n)]


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


def _cache(config: Any, *, room: int) -> DynamicCache:
    """A dynamic cache whose full-attention layers reserve ``room`` positions up front."""
    cache = DynamicCache(config=config)
    cache.layers = [
        _RoomyLayer(room) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def fp32_logits(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """FP32 logits even under BF16 autocast: BF16 logits tie far more often."""
    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if head.bias is None else head.bias.float()
        return F.linear(hidden.float(), head.weight.float(), bias)


def _generation(
    tokenizer: Any,
    prompt: tuple[int, ...],
    ids: list[int],
    seconds: float,
    eos: frozenset[int],
    max_new_tokens: int,
) -> Generation:
    ended = bool(ids) and ids[-1] in eos
    visible = ids[:-1] if ended else ids
    return Generation(
        prompt_ids=prompt,
        output_ids=tuple(ids),
        text=tokenizer.decode(visible, skip_special_tokens=True),
        seconds=seconds,
        tokens_per_second=len(ids) / seconds if seconds > 0 else 0.0,
        ended_with_eos=ended,
        hit_token_limit=not ended and len(ids) == max_new_tokens,
    )


@contextlib.contextmanager
def _precision(device: torch.device, precision: str) -> Iterator[None]:
    if device.type != "cuda":
        yield
    elif precision == "bf16":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        # TF32 would round FP32 products to a 10-bit mantissa: restore the caller's setting after.
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved


def _check(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int,
    eos_ids: set[int],
    device: torch.device,
) -> None:
    """Refuse, with one message naming the culprit, what would fail or mislead later."""
    if device.type not in ("cpu", "cuda"):
        raise InvalidInput(f"generation runs on 'cpu' or 'cuda', not {str(device)!r}")
    if not _is_count(max_new_tokens):
        raise InvalidInput(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
    if not _is_count(batch_size):
        raise InvalidInput(f"batch_size must be a positive integer, not {batch_size!r}")
    if model.training:
        raise InvalidInput("the model is in training mode; call model.eval() before generating")
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(model.config, name, None) not in (None, 1, 1.0):
            raise InvalidInput(
                f"{type(model).__name__} sets {name}; greedy generation here supports models "
                "whose logits are the output embedding of the last hidden state"
            )
    parameter = next(model.parameters())
    if parameter.device.type != device.type or (
        device.index is not None and parameter.device.index != device.index
    ):
        raise InvalidInput(f"the model is on {parameter.device}, not on {device}")
    vocab = model.get_input_embeddings().num_embeddings
    if not eos_ids:
        raise InvalidInput("eos_ids is empty; name at least one end-of-turn token id")
    for token in sorted(eos_ids):
        if not _is_token(token, vocab):
            raise InvalidInput(f"end-of-turn id {token!r} is not a token id below {vocab}")
    limit = getattr(model.config, "max_position_embeddings", None)
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise InvalidInput(f"prompt {index} is empty")
        for token in prompt:
            if not _is_token(token, vocab):
                raise InvalidInput(f"prompt {index} holds {token!r}, not a token id below {vocab}")
        # The last generated token is never fed back, hence the - 1.
        needed = len(prompt) + max_new_tokens - 1
        if limit is not None and needed > limit:
            raise InvalidInput(
                f"prompt {index} has {len(prompt)} tokens; with max_new_tokens {max_new_tokens} "
                f"it needs {needed} positions but the model has {limit}, and nothing is truncated"
            )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_token(value: object, vocab: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab
