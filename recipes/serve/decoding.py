"""One completion request as it decodes: its sampler, its text as it grows, its stop strings.

A ``RowControl`` belongs to one request. The generation thread calls it as each token of its
row is chosen (``generate_greedy``'s ``choose`` and ``on_token`` hooks): it samples the row's
next token when the request asks for sampling, turns tokens into text incrementally, ends the
row at a stop string, and hands each new piece of text to the event loop at once (``emit``),
so that a stream carries tokens as they are generated. Greedy rows take the argmax, exactly
what decoding without hooks takes.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nscas.errors import NscasError

from .protocol import Sampling


class NonFiniteLogits(NscasError):
    """The model's logits (or the probabilities drawn from) for one request's row were not
    finite at one of its tokens: that request fails; the rows batched with it do not."""

    exit_code = 1

    def __init__(self, token: int | None) -> None:
        at = "" if token is None else f" at token {token} of its answer"
        super().__init__(f"the model produced logits that are not finite (NaN or infinity) "
                         f"for this request{at}")
        self.token = token
        """How many tokens the row had before (None where nothing counted them)."""

REPLACEMENT = "\ufffd"
"""What a decoder writes for bytes that do not yet make a whole character."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What one completion request produced (the answer's text and the evidence behind it)."""

    prompt_tokens: int
    output_ids: tuple[int, ...]
    """Every token generated, the end-of-turn token included if one ended the row."""
    text: str
    """The answer: the decoded tokens, cut before a stop string if one appeared."""
    pieces: tuple[str, ...]
    """``text`` in the pieces a stream sent (joined, exactly ``text``)."""
    finish_reason: str
    """``stop`` (end-of-turn token or stop string) or ``length`` (``max_tokens`` reached)."""
    seed: int | None
    """The sampler's seed (the request's, or one drawn for it); None for greedy decoding."""
    first_token_time: float | None
    """``time.time()`` when the first token was chosen, on the replica's clock."""
    last_token_time: float | None
    """``time.time()`` when the last token was chosen."""


class TextStream:
    """Incremental detokenisation of one row with stop strings.

    Text is released only once it decodes cleanly (a byte-level token can hold part of a
    character: the window's text then ends in U+FFFD and waits for the next token), and never
    past, or into a possible start of, a stop string. ``finish`` releases what is left.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._longest = max((len(s) for s in self._stop), default=0)
        self._ids: list[int] = []
        self._prefix = 0  # the decoding window starts here
        self._read = 0  # ids before this are in ``_decoded``
        self._decoded = ""
        self._sent = 0  # characters of ``_decoded`` released
        self._searched = 0  # stop strings were looked for in ``_decoded[:_searched]``
        self.stopped_at: int | None = None
        """Where a stop string starts in the text, once one appeared."""

    @property
    def text(self) -> str:
        """The text released so far."""
        return self._decoded[: self._sent]

    def push(self, token: int) -> str:
        """Add one (visible) token; the text it releases, possibly empty."""
        if self.stopped_at is not None:
            return ""
        self._ids.append(token)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self._decoded += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release(final=False)

    def finish(self) -> str:
        """The rest of the text once the row has ended (no further token comes)."""
        if self.stopped_at is None:
            whole = self._decode(self._ids)
            # The whole decode is the answer's text; the window's is the same for the
            # tokenizers served here, and is kept where some tokenizer disagrees.
            if whole.startswith(self.text):
                self._decoded = whole
            else:
                self._decoded += self._decode(self._ids[self._read :])
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        end = len(self._decoded)
        if self._stop and self.stopped_at is None:
            start = max(0, self._searched - self._longest + 1)
            found = [i for s in self._stop if (i := self._decoded.find(s, start)) >= 0]
            self._searched = end
            if found:
                self.stopped_at = end = min(found)
            elif not final:
                end -= self._held_back()
        elif self.stopped_at is not None:
            end = self.stopped_at
        piece = self._decoded[self._sent : end]
        self._sent = max(self._sent, end)
        return piece

    def _held_back(self) -> int:
        """How many trailing characters might begin a stop string (kept until they cannot)."""
        text = self._decoded
        for size in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-size:]
            if any(s.startswith(tail) for s in self._stop):
                return size
        return 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True) if ids else ""


class Sampler:
    """Temperature and nucleus (top-p) sampling from one request's own seeded generator.

    The generator lives on the CPU and draws from FP32 probabilities computed there, so a
    seed gives the same tokens wherever the logits came from (up to the float noise that
    batching brings to the logits themselves).
    """

    def __init__(self, sampling: Sampling) -> None:
        import torch

        self.seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        self._temperature = sampling.temperature
        self._top_p = sampling.top_p
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(self.seed)

    def draw(self, logits: Any) -> int:
        """One token id from ``logits`` ([vocab], FP32, any device)."""
        import torch

        probs = torch.softmax(logits.detach().float().cpu() / self._temperature, dim=-1)
        if not bool(torch.isfinite(probs).all()):
            raise FloatingPointError("probabilities that are not finite")
        ordered, order = probs.sort(descending=True, stable=True)
        if self._top_p < 1:
            # Keep the most likely tokens until their mass reaches top_p (at least one).
            keep = int(((ordered.cumsum(0) - ordered) < self._top_p).sum().item())
            ordered, order = ordered[: max(keep, 1)], order[: max(keep, 1)]
        index = torch.multinomial(ordered, 1, generator=self._generator)
        return int(order[index].item())


class RowControl:
    """What one request asks of its row while it decodes, and what the row gave it.

    Called from the generation thread (``on_token``, ``draw``, ``finish``); ``emit`` is
    how text reaches the event loop, and ``cancel`` (from the loop) ends the row at its
    next token.
    """

    def __init__(self, *, tokenizer: Any, eos: frozenset[int], prompt_tokens: int,
                 stop: Sequence[str], sampling: Sampling,
                 emit: Callable[[str], object] | None) -> None:
        self._eos = eos
        self._text = TextStream(tokenizer, stop)
        self._emit = emit
        self._prompt_tokens = prompt_tokens
        self._ids: list[int] = []
        self._pieces: list[str] = []
        self._times: list[float] = []
        self._cancelled = threading.Event()
        self.sampler = None if sampling.greedy else Sampler(sampling)
        self.result: Completion | None = None
        """Set by ``finish`` once the row has ended."""
        self.failure: NonFiniteLogits | None = None
        """Set when the row's logits were not finite: the row ended there, with no answer."""

    def cancel(self) -> None:
        """End the row at its next token (its client has gone)."""
        self._cancelled.set()

    def fail(self, failure: NonFiniteLogits) -> None:
        """End the row at its next token, which is not part of any answer."""
        self.failure = failure

    def on_token(self, token: int) -> bool:
        """``token`` was chosen for this row; False ends the row now."""
        now = time.time()
        self._times = [self._times[0] if self._times else now, now]
        if self.failure is not None:
            return False
        self._ids.append(token)
        if token not in self._eos:
            self._send(self._text.push(token))
        return not (self._cancelled.is_set() or self._text.stopped_at is not None)

    @property
    def tokens_made(self) -> int:
        """How many tokens were chosen for this row so far."""
        return len(self._ids)

    def finish(self, limit: int) -> Completion:
        """Close the row (its generation has returned); the request's ``Completion``."""
        self._send(self._text.finish())
        ended = bool(self._ids) and self._ids[-1] in self._eos
        stopped = ended or self._text.stopped_at is not None
        self.result = Completion(
            prompt_tokens=self._prompt_tokens, output_ids=tuple(self._ids),
            text=self._text.text, pieces=tuple(self._pieces),
            finish_reason="stop" if stopped or len(self._ids) < limit else "length",
            seed=None if self.sampler is None else self.sampler.seed,
            first_token_time=self._times[0] if self._times else None,
            last_token_time=self._times[-1] if self._times else None)
        return self.result

    def _send(self, piece: str) -> None:
        if piece:
            self._pieces.append(piece)
            if self._emit is not None:
                self._emit(piece)


def choose_tokens(logits: Any, controls: Sequence[RowControl | None],
                  on_failure: Callable[[int, NonFiniteLogits], None] | None = None) -> Any:
    """The next token of each live row: the argmax, or a draw where the row samples. A row
    whose logits (or probabilities) are not finite is handed to ``on_failure`` with its index
    among ``controls``; its token is then meaningless, and the row must end at it. Without
    ``on_failure`` the failure is raised (the whole call fails)."""
    import torch

    if on_failure is None:
        def on_failure(index: int, failure: NonFiniteLogits) -> None:
            raise failure

    chosen = logits.argmax(dim=-1)
    finite = torch.isfinite(logits).all(dim=-1)
    every = bool(finite.all())
    for index, control in enumerate(controls):
        made = None if control is None else control.tokens_made
        if not every and not bool(finite[index]):
            on_failure(index, NonFiniteLogits(made))
        elif control is not None and control.sampler is not None:
            try:
                chosen[index] = control.sampler.draw(logits[index])
            except FloatingPointError:
                on_failure(index, NonFiniteLogits(made))
    return chosen
