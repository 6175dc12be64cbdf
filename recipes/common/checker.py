"""The strict answer checker of docs/experiment.md §1, shared by prepare, train and evaluate.

An answer is correct iff it is one JSON object (surrounding JSON whitespace allowed, nothing
else), at most 32,768 UTF-8 bytes, free of duplicate keys and NaN/Infinity, with exactly the
target's keys and, at every depth, the same JSON type and value (``true`` is not ``1``,
``365.0`` is not ``365``, list order matters).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from nscas.errors import InvalidInput

MAX_ANSWER_BYTES = 32_768
"""Answers longer than this many UTF-8 bytes are invalid without being parsed."""

MAX_NESTING = 64
"""Deeper nesting is refused before parsing. Python's JSON parser recurses, so without a
fixed bound the verdict on a pathological answer would depend on the caller's stack depth;
every target is two levels deep, so no correct answer comes near this."""

Reason = Literal["invalid_json_object", "wrong_schema_or_value", "correct"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """The verdict on one answer."""

    correct: bool
    """True iff the answer equals the target under the strict rules."""
    valid_json_object: bool
    """True iff the answer parsed as a single JSON object under the strict rules."""
    reason: Reason
    """``invalid_json_object``, ``wrong_schema_or_value`` or ``correct``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "correct": self.correct,
            "valid_json_object": self.valid_json_object,
            "reason": self.reason,
        }


_INVALID = CheckResult(correct=False, valid_json_object=False, reason="invalid_json_object")
_WRONG = CheckResult(correct=False, valid_json_object=True, reason="wrong_schema_or_value")
_CORRECT = CheckResult(correct=True, valid_json_object=True, reason="correct")


class _Rejected(ValueError):
    """Raised inside parsing hooks; never escapes this module."""


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Rejected(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise _Rejected(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    # 1e400 is not a constant to the decoder, but it reads as Infinity all the same.
    value = float(text)
    if not math.isfinite(value):
        raise _Rejected(f"number {text} overflows to infinity")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_without_duplicates, parse_constant=_no_constants,
    parse_float=_finite_float,
)


def _nesting_depth(text: str) -> int:
    """Maximum bracket depth outside strings (exact for valid JSON, a bound otherwise)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_strict(text: str) -> dict[str, Any] | None:
    """The answer as a JSON object, or ``None`` if it is not one under the strict rules."""
    if not isinstance(text, str):
        return None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates cannot be UTF-8 text at all
        return None
    if size > MAX_ANSWER_BYTES:
        return None
    # Counting brackets is cheap; the character scan runs only when the count could matter.
    if text.count("[") + text.count("{") > MAX_NESTING and _nesting_depth(text) > MAX_NESTING:
        return None
    try:
        # decode() skips JSON whitespace (space, tab, CR, LF) on both sides and nothing else.
        value = _DECODER.decode(text)
    except (ValueError, RecursionError):  # JSONDecodeError and _Rejected are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values with the same JSON type at every depth."""
    # bool is a subclass of int and 365.0 == 365 in Python, so compare exact types first.
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check(answer: str, target: str) -> CheckResult:
    """Judge ``answer`` against ``target`` (a JSON object text) under the strict rules."""
    expected = parse_strict(target)
    if expected is None:
        raise InvalidInput(f"checker target is not a strict JSON object: {target[:200]!r}")
    got = parse_strict(answer)
    if got is None:
        return _INVALID
    return _CORRECT if same_json(got, expected) else _WRONG
