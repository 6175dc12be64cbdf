"""The strict answer checker and the task rules of docs/experiment.md §1, implemented independently.

``check_answer`` decides whether a model's answer text equals a target: at most 32,768 UTF-8
bytes, strict JSON (no duplicate keys, no NaN/Infinity), a top-level object with only JSON
whitespace around it, and equal to the target key by key with equal JSON types (``true`` is
not ``1`` and ``365.0`` is not ``365``), recursively, lists in order.

The task functions recompute, from a case alone, what the ``prepare`` recipe claims: the
target, the records part of the prompt, the task identity, the damaged-control rule and the
case itself from the task seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..core.errors import RecordParseError, TaskError
from ..core.results import Check

MAX_ANSWER_BYTES = 32_768
FAMILIES = ("lookup", "filter", "total", "sort")
CITIES = ("Oslo", "Lima", "Kyoto", "Accra", "Perth", "Riga", "Bern", "Suva")
STATUSES = ("ready", "pending", "closed")
ABSENT_ID = "Z000"
ROLES = {"test": 256, "dev": 64, "train": 768}
VISIBLE = {
    "lookup": ("id", "city", "units"),
    "filter": ("id", "status"),
    "total": ("id", "units", "price"),
    "sort": ("id", "priority"),
}
Reason = Literal["invalid_json_object", "wrong_schema_or_value", "correct"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """The strict checker's verdict on one answer."""

    correct: bool
    """The answer equals the target exactly (same keys, same JSON types, equal values)."""
    valid_json_object: bool
    """The answer is one strict JSON object, whether or not it is right."""
    reason: Reason
    """``invalid_json_object``, ``wrong_schema_or_value`` or ``correct``."""

    def to_dict(self) -> dict[str, Any]:
        return {"correct": self.correct, "valid_json_object": self.valid_json_object,
                "reason": self.reason}


_INVALID = CheckResult(correct=False, valid_json_object=False, reason="invalid_json_object")
_WRONG = CheckResult(correct=False, valid_json_object=True, reason="wrong_schema_or_value")
_CORRECT = CheckResult(correct=True, valid_json_object=True, reason="correct")


MAX_ANSWER_NESTING = 64
"""Deeper nesting of arrays and objects in an answer makes it invalid (the parse recurses;
every target nests two deep)."""
MAX_INT_DIGITS = 4300
"""Integers up to this many digits are read as ints (CPython's default conversion limit);
longer ones are still valid JSON but equal no target value."""


class _HugeInteger:
    """A JSON integer too long to convert: valid JSON, equal to nothing."""

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def _answer_int(text: str) -> Any:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else _HugeInteger(text)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _finite(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):  # 1e400 is Infinity, which JSON does not have
        raise ValueError(f"number {text[:20]} overflows to infinity")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Answers are model output, not canonical records: strict JSON (no duplicate keys, no
# NaN/Infinity literals) with numbers read as Python reads them, so that an answer's
# validity does not depend on the limits the verifier puts on its own records.
_ANSWER_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_constant=_no_constant,
                                   parse_int=_answer_int, parse_float=_finite)


def _nesting(text: str) -> int:
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


def _parse_strict(text: str) -> Any:
    if (text.count("[") + text.count("{") > MAX_ANSWER_NESTING
            and _nesting(text) > MAX_ANSWER_NESTING):
        raise RecordParseError(f"nested deeper than {MAX_ANSWER_NESTING}", what="answer")
    try:
        return _ANSWER_DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise RecordParseError(str(exc)[:200], what="answer") from None


def check_answer(answer: str, target: str | Mapping[str, Any]) -> CheckResult:
    """Score ``answer`` against ``target`` (compact JSON text or an already parsed object)."""
    try:
        size = len(answer.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates cannot be UTF-8: not a valid answer text
        return _INVALID
    if size > MAX_ANSWER_BYTES:
        return _INVALID
    try:
        value = _parse_strict(answer)
    except RecordParseError:
        return _INVALID
    if not isinstance(value, dict):
        return _INVALID
    expected = _parse_strict(target) if isinstance(target, str) else target
    return _CORRECT if json_equal(value, expected) else _WRONG


def json_equal(a: Any, b: Any) -> bool:
    """Equality of parsed JSON values where the JSON type matters as much as the value."""
    # Exact type identity, because bool is a subclass of int; mappings of any class are objects.
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- tasks ---------------------------------------------------------------------------------

def _rows(case: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rows = case.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        raise TaskError("'rows' must be a list of objects")
    return rows


def _family(case: Mapping[str, Any]) -> str:
    family = case.get("family")
    if not isinstance(family, str) or family not in FAMILIES:
        raise TaskError(f"'family' must be one of {FAMILIES}, found {family!r}")
    return family


def _field(row: Mapping[str, Any], key: str) -> Any:
    if key not in row:
        raise TaskError(f"a row lacks {key!r}: {dict(row)!r}")
    return row[key]


def compute_target(case: Mapping[str, Any]) -> dict[str, Any]:
    """The target object of a case by the rules of docs/experiment.md §1 (keys in the published order)."""
    family, rows = _family(case), _rows(case)
    if family == "lookup":
        query = case.get("query")
        hit = next((r for r in rows if _field(r, "id") == query), None)
        if hit is None:
            return {"city": None, "units": None}
        return {"city": _field(hit, "city"), "units": _field(hit, "units")}
    if family == "filter":
        return {"ids": sorted(_field(r, "id") for r in rows if _field(r, "status") == "ready")}
    if family == "total":
        return {"total": sum(_field(r, "units") * _field(r, "price") for r in rows)}
    ranked = sorted(rows, key=lambda r: (-_field(r, "priority"), _field(r, "id")))
    return {"ids": [_field(r, "id") for r in ranked[:2]]}


def target_text(target: Mapping[str, Any]) -> str:
    """A target as the compact JSON text the tasks carry."""
    return json.dumps(target, separators=(",", ":"))


def damaged_target(case: Mapping[str, Any]) -> dict[str, Any]:
    """The damaged-control target: lookup units + 1 (1 if null), total + 1, ids + ``Z000``."""
    family, target = _family(case), compute_target(case)
    if family == "lookup":
        units = target["units"]
        return {"city": target["city"], "units": 1 if units is None else units + 1}
    if family == "total":
        return {"total": target["total"] + 1}
    return {"ids": [*target["ids"], ABSENT_ID]}


def is_damaged(task_id: str) -> bool:
    """A train task is damaged iff its identity, read as a hex number, is divisible by 4."""
    try:
        return int(task_id, 16) % 4 == 0
    except ValueError:
        raise TaskError(f"task id {task_id!r} is not hexadecimal") from None


def task_identity(case: Mapping[str, Any], prompt: str) -> str:
    """SHA-256 hex of the published identity serialisation of ``{"task", "prompt"}``."""
    text = json.dumps({"task": case, "prompt": prompt}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def visible_records(case: Mapping[str, Any]) -> str:
    """The end of a prompt: ``\\nRecords:\\n`` and the family's visible columns, compact JSON."""
    keys = VISIBLE[_family(case)]
    visible = [{k: _field(row, k) for k in keys} for row in _rows(case)]
    return "\nRecords:\n" + json.dumps(visible, separators=(",", ":"))


def case_seed(seed: int, role: str, index: int) -> int:
    return int(hashlib.sha256(f"{seed}:{role}:{index}".encode()).hexdigest(), 16)


def generate_case(seed: int, role: str, index: int) -> dict[str, Any]:
    """Redraw case ``index`` of ``role`` from the task seed, in the published draw order."""
    if role not in ROLES:
        raise TaskError(f"role must be one of {tuple(ROLES)}, found {role!r}")
    rng = random.Random(case_seed(seed, role, index))
    numbers = rng.sample(range(100, 1000), 5)
    rows = []
    for number in numbers:
        row_id = chr(65 + rng.randrange(26)) + str(number)
        city = rng.choice(CITIES)
        units = rng.randrange(0, 20)
        price = rng.randrange(1, 20)
        status = rng.choice(STATUSES)
        priority = rng.randrange(1, 10)
        rows.append({"id": row_id, "city": city, "units": units, "price": price,
                     "status": status, "priority": priority})
    query = rng.choice(rows)["id"] if index % 5 != 0 else ABSENT_ID
    variant = (index // 4) % (4 if role == "test" else 2)
    return {"family": FAMILIES[index % 4], "rows": rows, "query": query, "variant": variant}


def check_task(*, case: Mapping[str, Any], prompt: str, task_id: str, target: Any,
               damaged: bool | None = None, name: str = "task") -> list[Check]:
    """Every finding about one task: identity, prompt records, target, and, when the task
    states whether it is damaged, that flag and its damaged target (which must fail the
    checker). ``target`` is the task's stated target, as text or parsed object."""
    checks: list[Check] = []
    identity = task_identity(case, prompt)
    checks.append(Check.verdict(f"{name}.id", identity == task_id, claimed=task_id,
                                recomputed=identity,
                                message="identity does not match case and prompt"))
    suffix = visible_records(case)
    checks.append(Check.verdict(f"{name}.prompt_records", prompt.endswith(suffix),
                                recomputed=suffix,
                                message="prompt does not end with the case's visible records"))
    clean = compute_target(case)
    stated = target
    if isinstance(target, str):
        try:
            stated = _parse_strict(target)
        except RecordParseError as exc:
            checks.append(Check.failed(f"{name}.target", exc.message, claimed=target,
                                       recomputed=target_text(clean)))
            stated = None
    expected = damaged_target(case) if damaged else clean
    if stated is not None:
        text_ok = not isinstance(target, str) or target == target_text(expected)
        checks.append(Check.verdict(
            f"{name}.target", json_equal(stated, expected) and text_ok, claimed=target,
            recomputed=target_text(expected),
            message="stated target differs from the target recomputed from the case"))
    if damaged is not None:
        rule = is_damaged(task_id)
        checks.append(Check.verdict(f"{name}.damaged", rule == damaged, claimed=damaged,
                                    recomputed=rule, message="damage flag contradicts the rule"))
        if damaged:
            verdict = check_answer(target_text(damaged_target(case)), clean)
            checks.append(Check.verdict(f"{name}.damaged_fails", not verdict.correct,
                                        recomputed=verdict.reason,
                                        message="damaged target passes the checker"))
    return checks
