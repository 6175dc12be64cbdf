"""Replay and retention conversations (docs/experiment.md §2): validation and an offline stand-in set.

A conversation set is JSONL, one ``{"id": str, "messages": [...]}`` per line; messages are
``{"role", "content"}`` objects, an optional leading ``system`` one, then strictly alternating
``user``/``assistant`` turns ending with ``assistant``. The published run used a public chat
corpus; offline, ``standin_conversations`` makes a small deterministic set, every record of
which carries ``"standin": true`` so nobody mistakes it for the real data.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable
from typing import Any, Literal

from nscas.errors import InvalidInput, RecipeError

Kind = Literal["replay", "retention"]
KINDS: tuple[Kind, ...] = ("replay", "retention")
ALLOWED_KEYS = frozenset({"id", "messages", "standin"})


class ConversationError(InvalidInput):
    """A conversation line is malformed; ``line`` is 1-based, ``conversation_id`` if known."""

    def __init__(self, message: str, *, line: int, conversation_id: str | None = None):
        who = f" (id {conversation_id!r})" if conversation_id is not None else ""
        super().__init__(f"conversations line {line}{who}: {message}")
        self.line = line
        self.conversation_id = conversation_id


def _check_messages(messages: object, line: int, cid: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ConversationError("'messages' must be a non-empty list",
                                line=line, conversation_id=cid)
    start = 1 if isinstance(messages[0], dict) and messages[0].get("role") == "system" else 0
    if len(messages) - start < 2:
        raise ConversationError("needs at least one user turn and one assistant turn",
                                line=line, conversation_id=cid)
    for position, message in enumerate(messages):
        where = f"message {position}"
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ConversationError(f"{where} must be an object with exactly 'role' and 'content'",
                                    line=line, conversation_id=cid)
        if position < start:
            expected = "system"
        else:
            expected = "user" if (position - start) % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise ConversationError(f"{where} has role {message['role']!r}, expected {expected!r}",
                                    line=line, conversation_id=cid)
        if not isinstance(message["content"], str) or not message["content"]:
            raise ConversationError(f"{where} content must be a non-empty string",
                                    line=line, conversation_id=cid)
    if messages[-1]["role"] != "assistant":
        raise ConversationError("must end with an assistant turn", line=line, conversation_id=cid)


def validate_conversations(data: bytes) -> list[dict[str, Any]]:
    """Parse and validate a conversation JSONL blob; ids must be unique."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"conversations: not UTF-8 (byte {exc.start})") from exc
    if text and not text.endswith("\n"):
        raise ConversationError("the last line lacks its newline", line=text.count("\n") + 1)
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for line, raw in enumerate(text.split("\n")[:-1], start=1):
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise ConversationError(f"not JSON: {exc}", line=line) from exc
        if not isinstance(record, dict):
            raise ConversationError("expected a JSON object", line=line)
        cid = record.get("id")
        if not isinstance(cid, str) or not cid:
            raise ConversationError("'id' must be a non-empty string", line=line)
        unknown = sorted(set(record) - ALLOWED_KEYS)
        if unknown:
            raise ConversationError(f"unknown key(s) {unknown}", line=line, conversation_id=cid)
        if "standin" in record and not isinstance(record["standin"], bool):
            raise ConversationError("'standin' must be true or false", line=line,
                                    conversation_id=cid)
        if cid in seen:
            raise ConversationError(f"id repeats line {seen[cid]}", line=line, conversation_id=cid)
        seen[cid] = line
        _check_messages(record.get("messages"), line, cid)
        records.append(record)
    return records


def conversations_jsonl(records: Iterable[dict[str, Any]]) -> bytes:
    """Compact JSONL bytes, one record per line in order."""
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode("utf-8")


# --- the offline stand-in set ---------------------------------------------------------------

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


def _arithmetic(rng: random.Random) -> Turns:
    a, b = rng.randrange(2, 500), rng.randrange(2, 500)
    turns = [(f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.")]
    if rng.random() < 0.8:
        c = rng.randrange(2, 13)
        turns.append((f"Now multiply {a + b} by {c}.", f"{a + b} times {c} is {(a + b) * c}."))
    return turns


def _conversion(rng: random.Random) -> Turns:
    big, small, factor = rng.choice(_UNITS)
    x = rng.randrange(2, 100)
    return [(f"How many {small} are there in {x} {big}?",
             f"There are {x * factor} {small} in {x} {big}.")]


def _word(rng: random.Random) -> Turns:
    word = rng.choice(_WORDS)
    turns = [(f'How many letters does the word "{word}" have?',
              f'The word "{word}" has {len(word)} letters.')]
    if rng.random() < 0.8:
        turns.append((f'Spell "{word}" backwards.', f'"{word}" backwards is "{word[::-1]}".'))
    return turns


def _compare(rng: random.Random) -> Turns:
    a, b = rng.sample(range(1, 1000), 2)
    return [(f"Which is larger, {a} or {b}?", f"{max(a, b)} is larger than {min(a, b)}.")]


def _alphabetical(rng: random.Random) -> Turns:
    words = rng.sample(_WORDS, 3)
    return [(f"Put these words in alphabetical order: {', '.join(words)}.",
             f"In alphabetical order: {', '.join(sorted(words))}.")]


_TEMPLATES: tuple[Callable[[random.Random], Turns], ...] = (
    _arithmetic, _conversion, _word, _compare, _alphabetical,
)


def _kind_of_text(text: str) -> Kind:
    # A text belongs to exactly one kind by its hash, so the two sets can never share a
    # message, whatever the seeds and counts.
    return KINDS[hashlib.sha256(text.encode("utf-8")).digest()[0] % 2]


def standin_conversations(kind: Kind, count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` synthetic conversations labelled ``"standin": true``; no text repeats."""
    if kind not in KINDS:
        raise InvalidInput(f"stand-in kind must be one of {list(KINDS)}, got {kind!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidInput(f"stand-in count must be an integer >= 0, got {count!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidInput(f"stand-in seed must be an integer, got {seed!r}")
    digest = hashlib.sha256(f"nscas-standin:{kind}:{seed}".encode()).hexdigest()
    rng = random.Random(int(digest, 16))
    used: set[str] = set()
    records: list[dict[str, Any]] = []
    attempts = 0
    while len(records) < count:
        attempts += 1
        if attempts > 1000 * (count + 1):
            raise RecipeError(f"could not make {count} distinct {kind} stand-in conversations")
        turns = rng.choice(_TEMPLATES)(rng)
        texts = [t for pair in turns for t in pair]
        if any(t in used or _kind_of_text(t) != kind for t in texts):
            continue
        used.update(texts)
        messages = [{"role": role, "content": text}
                    for user, assistant in turns
                    for role, text in (("user", user), ("assistant", assistant))]
        records.append({"id": f"standin-{kind}-{len(records):04d}", "messages": messages,
                        "standin": True})
    return records
