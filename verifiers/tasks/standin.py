"""The offline stand-in replay and retention conversations, regenerated from their params.

Without a ``replay`` or ``retention`` input, ``prepare`` makes a small deterministic set of
synthetic conversations (docs/experiment.md §2): a Python ``random.Random`` seeded with the
integer value of ``SHA-256("nscas-standin:<kind>:<standin_seed>")`` (hex) picks one of five
templates per attempt; an attempt whose texts were already used, or any of whose texts hashes
to the other kind (first SHA-256 byte of the UTF-8 text, even: replay, odd: retention), is
dropped. Conversation ``n`` is ``{"id": "standin-<kind>-<n:04d>", "messages": [...],
"standin": true}``; the records blob line adds ``"weight"`` and is compact JSON
(``separators=(",", ":")``, ASCII escapes) ending in a newline.

This is an independent copy of that generator: the verifier must not import nscas.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

KINDS = ("replay", "retention")

_WORDS = (
    "apple", "river", "candle", "garden", "window", "pencil", "orange", "bridge", "silver",
    "planet", "forest", "rocket", "button", "castle", "dragon", "meadow", "pepper", "violin",
    "harbor", "jacket", "lemon", "marble", "needle", "otter", "parrot", "quartz", "saddle",
    "tunnel", "velvet", "walnut", "yellow", "zipper", "anchor", "basket", "cactus", "donkey",
)
_UNITS = (  # (larger unit, smaller unit, factor)
    ("metres", "centimetres", 100), ("kilometres", "metres", 1000), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("kilograms", "grams", 1000), ("days", "hours", 24),
    ("weeks", "days", 7), ("litres", "millilitres", 1000),
)

Turns = list[tuple[str, str]]


class StandinError(ValueError):
    """The params cannot give a stand-in set (bad kind, count or seed, or too few texts)."""


def _sum_then_product(rng: random.Random) -> Turns:
    a, b = rng.randrange(2, 500), rng.randrange(2, 500)
    total = a + b
    turns = [(f"What is {a} plus {b}?", f"{a} plus {b} is {total}.")]
    if rng.random() < 0.8:
        c = rng.randrange(2, 13)
        turns.append((f"Now multiply {total} by {c}.", f"{total} times {c} is {total * c}."))
    return turns


def _units(rng: random.Random) -> Turns:
    big, small, factor = rng.choice(_UNITS)
    x = rng.randrange(2, 100)
    return [(f"How many {small} are there in {x} {big}?",
             f"There are {x * factor} {small} in {x} {big}.")]


def _letters(rng: random.Random) -> Turns:
    word = rng.choice(_WORDS)
    turns = [(f'How many letters does the word "{word}" have?',
              f'The word "{word}" has {len(word)} letters.')]
    if rng.random() < 0.8:
        turns.append((f'Spell "{word}" backwards.', f'"{word}" backwards is "{word[::-1]}".'))
    return turns


def _larger(rng: random.Random) -> Turns:
    a, b = rng.sample(range(1, 1000), 2)
    return [(f"Which is larger, {a} or {b}?", f"{max(a, b)} is larger than {min(a, b)}.")]


def _sorted_words(rng: random.Random) -> Turns:
    words = rng.sample(_WORDS, 3)
    return [(f"Put these words in alphabetical order: {', '.join(words)}.",
             f"In alphabetical order: {', '.join(sorted(words))}.")]


# The order matters: rng.choice picks by index.
_TEMPLATES: tuple[Callable[[random.Random], Turns], ...] = (
    _sum_then_product, _units, _letters, _larger, _sorted_words,
)


def _belongs_to(text: str) -> str:
    return KINDS[hashlib.sha256(text.encode("utf-8")).digest()[0] % 2]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def standin_set(kind: str, count: Any, seed: Any) -> list[dict[str, Any]]:
    """The ``count`` stand-in conversations of ``kind`` for ``seed``; raises ``StandinError``."""
    if kind not in KINDS:
        raise StandinError(f"stand-in kind must be one of {list(KINDS)}, got {kind!r}")
    if not _is_int(count) or count < 0:
        raise StandinError(f"stand-in count must be an integer >= 0, got {count!r}")
    if not _is_int(seed):
        raise StandinError(f"stand-in seed must be an integer, got {seed!r}")
    rng = random.Random(int(hashlib.sha256(f"nscas-standin:{kind}:{seed}".encode()).hexdigest(), 16))
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 1000 * (count + 1):
            raise StandinError(f"could not make {count} distinct {kind} stand-in conversations")
        turns = rng.choice(_TEMPLATES)(rng)
        texts = [text for pair in turns for text in pair]
        if any(text in seen or _belongs_to(text) != kind for text in texts):
            continue
        seen.update(texts)
        messages = []
        for question, answer in turns:
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        out.append({"id": f"standin-{kind}-{len(out):04d}", "messages": messages,
                    "standin": True})
    return out


def jsonl_bytes(lines: Iterable[Mapping[str, Any]]) -> bytes:
    """Compact JSONL, as the prepare recipe writes its conversation records blobs."""
    return "".join(json.dumps(dict(line), separators=(",", ":")) + "\n"
                   for line in lines).encode("utf-8")


def standin_note(count: int, seed: int) -> str:
    """The ``note`` member of a stand-in ``tasks/1`` record."""
    return (f"stand-in: {count} synthetic conversations generated by nscas (seed {seed}); "
            "not the published corpus")
