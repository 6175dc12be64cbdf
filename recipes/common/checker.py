"""The strict answer checker of docs/experiment.md §1, shared by prepare, train and evaluate.

An answer is correct iff it is one JSON object (surrounding JSON whitespace allowed, nothing
else), at most 32,768 UTF-8 bytes, free of duplicate keys and NaN/Infinity, with exactly the
target's keys and, at every depth, the same JSON type and value (``true`` is not ``1``,
``365.0`` is not ``365``, list order matters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from nscas.errors import InvalidInput, StrictJSONError
from nscas.objects.canonical import loads_strict

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


def parse_strict(text: object) -> dict[str, Any] | None:
    """The answer as a JSON object, or ``None`` if it is not one under the strict rules."""
    if not isinstance(text, str):
        return None
    try:
        value = loads_strict(text, max_bytes=MAX_ANSWER_BYTES, max_depth=MAX_NESTING)
    except StrictJSONError:
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
