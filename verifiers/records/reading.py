"""Strict reading of records (docs/format.md §2): canonical form, kind, schema and links.

A record's bytes must be exactly ``rfc8785.dumps(value)`` of a JSON object whose ``nscas``
member names a known kind. ``parse_record`` raises on bytes it cannot use; ``check_record``
never raises on bad bytes and reports every problem it finds as checks. Links are found in
JSON string *values* only (object member names are names, not links) and are located by
RFC 6901 JSON Pointers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import rfc8785

from ..core.errors import RecordParseError
from ..core.results import Check
from .objects import ID_PATTERN, is_object_id, object_id, sha256_hex
from .schemas import KINDS, pointer_token, schema_problems

# Re-exported so callers find a record's whole toolkit in one place.
__all__ = [
    "ID_PATTERN",
    "KINDS",
    "MAX_RECORD_BYTES",
    "Link",
    "Record",
    "check_record",
    "extract_links",
    "is_object_id",
    "object_id",
    "parse_json",
    "parse_record",
    "read_lines",
    "schema_problems",
    "sha256_hex",
]

MAX_RECORD_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in any JSON the verifiers read: the deepest
honest value (a report) nests under ten; a hostile one nested hundreds deep must be a finding,
not a RecursionError in a later recursive step."""
MAX_INTEGER = 2**53 - 1
"""Largest integer magnitude read exactly: beyond it JSON numbers are not interoperable
(I-JSON), and no count, id or size the verifiers check comes near it."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} overflows to infinity")
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _number_from_digits(text: str) -> int | float:
    """JSON numbers are IEEE-754 doubles (RFC 8785 3.2.2.3): digits beyond 2**53 - 1 denote the
    double they round to, which is how a canonical writer prints an integral 1e20."""
    if len(text.lstrip("-")) > 400:  # past any double, and int() of it costs quadratic time
        raise ValueError(f"integer of {len(text)} digits is beyond any JSON double")
    value = int(text)
    if abs(value) <= MAX_INTEGER:
        return value
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"integer of {len(text)} digits overflows a JSON double") from None


def _exact_integer(text: str) -> int:
    """Integers of plain JSON text (logs), refused beyond ``MAX_INTEGER``."""
    if len(text) < 16:  # at most 15 digits: within MAX_INTEGER (16 digits)
        return int(text)
    if len(text.lstrip("-")) > 16 or abs(value := int(text)) > MAX_INTEGER:
        raise ValueError(f"integer {text[:20]}{'...' if len(text) > 20 else ''} "
                         f"({len(text.lstrip('-'))} digits) is beyond 2**53 - 1")
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object, parse_constant=_reject_constant,
                            parse_float=_finite_float, parse_int=_exact_integer)
# For RFC 8785 text (records, journal lines), where every number is a double.
_JCS_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object, parse_constant=_reject_constant,
                                parse_float=_finite_float, parse_int=_number_from_digits)


def parse_json(data: bytes | str, *, what: str = "JSON text", jcs: bool = False) -> Any:
    """Parse strict JSON: UTF-8, no duplicate keys, no NaN/Infinity, one value with only
    JSON whitespace around it. Raises ``RecordParseError`` naming ``what``."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordParseError(f"not UTF-8 ({exc.reason} at byte {exc.start})",
                                   what=what) from None
    else:
        text = data
    try:
        value = (_JCS_DECODER if jcs else _DECODER).decode(text)
    except RecursionError:
        raise RecordParseError(f"nested deeper than {MAX_DEPTH} levels", what=what) from None
    except (ValueError, OverflowError) as exc:  # JSONDecodeError is a ValueError
        raise RecordParseError(str(exc), what=what) from None
    # A lone surrogate can only come from an escape (UTF-8 has none): look for one only then.
    # Nesting needs an opening bracket per level: text with few of them cannot nest too deep.
    strings = _SURROGATE_ESCAPE.search(text) is not None
    if not strings and text.count("[") + text.count("{") <= MAX_DEPTH:
        return value
    problem = _shape_problem(value, MAX_DEPTH, strings=strings)
    if problem is not None:
        raise RecordParseError(problem, what=what)
    return value


def read_lines(data: bytes, what: str) -> list[dict[str, Any]]:
    """A JSONL blob of objects (strict JSON per line, every line ends with a newline)."""
    if data and not data.endswith(b"\n"):
        raise RecordParseError("the last line lacks its newline", what=what)
    lines = []
    for number, line in enumerate(data.split(b"\n")[:-1] if data else [], start=1):
        value = parse_json(line, what=f"{what} line {number}")
        if not isinstance(value, dict):
            raise RecordParseError(f"line {number} is not a JSON object", what=what)
        lines.append(value)
    return lines


def _lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _shape_problem(value: Any, limit: int, *, strings: bool) -> str | None:
    """Arrays and objects nested deeper than ``limit``, or a string (value or member name)
    holding a lone surrogate (``"\\ud800"``: no Unicode text, so no UTF-8 form and no
    canonical one); iteratively, so no recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _lone_surrogate(item):
                return "a string holds a lone surrogate (an escape of half a UTF-16 pair)"
            continue
        if isinstance(item, dict):
            if strings and any(_lone_surrogate(key) for key in item):
                return "a member name holds a lone surrogate"
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return f"nested deeper than {limit} levels"
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list) or (strings and isinstance(child, str)))
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One link of a record: the JSON Pointer where it sits and the ID it names."""

    path: str
    """RFC 6901 pointer to the string, e.g. ``/outputs/checkpoint``."""
    target: str
    """The linked object ID (``blake3:`` + 64 hex)."""


def _walk_links(value: Any, path: str) -> Iterator[Link]:
    if isinstance(value, str):
        if ID_PATTERN.fullmatch(value):
            yield Link(path=path, target=value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk_links(item, f"{path}/{pointer_token(key)}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk_links(item, f"{path}/{index}")


def extract_links(value: Any) -> tuple[Link, ...]:
    """Every link in a parsed record, in document order (duplicates kept: paths differ)."""
    return tuple(_walk_links(value, ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """A record that passed strict parsing: canonical bytes of a known kind."""

    id: str
    """``blake3:`` ID of the bytes."""
    sha256: str
    """SHA-256 hex of the bytes."""
    size: int
    """Length of the bytes."""
    kind: str
    """The full kind tag, e.g. ``receipt/1``."""
    value: dict[str, Any]
    """The parsed JSON object."""
    links: tuple[Link, ...]
    """Every link, with its JSON Pointer."""


def _canonical_problem(data: bytes, value: Any) -> str | None:
    try:
        canonical = rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        return f"cannot be canonicalised: {exc}"
    if canonical != data:
        at = next((i for i, (x, y) in enumerate(zip(data, canonical, strict=False)) if x != y),
                  min(len(data), len(canonical)))
        return (f"bytes are not the RFC 8785 canonical form (first difference at byte {at}; "
                f"{len(data)} bytes given, canonical form has {len(canonical)})")
    return None


def _kind_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"top level is a JSON {type(value).__name__}, not an object"
    tag = value.get("nscas")
    if not isinstance(tag, str):
        return "member 'nscas' is missing or not a string"
    if tag not in KINDS:
        return f"unknown kind {tag!r} (known: {', '.join(sorted(KINDS))})"
    return None


def parse_record(data: bytes) -> Record:
    """Parse record bytes strictly; raises ``RecordParseError`` on the first unusable property.

    Use ``check_record`` to get every problem as checks instead.
    """
    if len(data) > MAX_RECORD_BYTES:
        raise RecordParseError(f"{len(data)} bytes exceeds the {MAX_RECORD_BYTES}-byte limit")
    value = parse_json(data, what="record", jcs=True)
    for problem in (_kind_problem(value), _canonical_problem(data, value)):
        if problem:
            raise RecordParseError(problem)
    problems = schema_problems(value)
    if problems:
        raise RecordParseError(f"{value['nscas']} schema: " + "; ".join(problems))
    return Record(id=object_id(data), sha256=sha256_hex(data), size=len(data),
                  kind=value["nscas"], value=value, links=extract_links(value))


def check_record(data: bytes, *, name: str = "record", expected_id: str | None = None,
                 expected_kind: str | None = None) -> list[Check]:
    """Every finding about one record's bytes, as checks named ``<name>.<aspect>``.

    Aspects: ``id`` (when ``expected_id`` is given), ``size``, ``json``, ``canonical``,
    ``kind``, ``schema``. Later aspects fail too when the bytes are not JSON at all.
    """
    checks: list[Check] = []
    recomputed_id = object_id(data)
    if expected_id is not None:
        checks.append(Check.verdict(f"{name}.id", expected_id == recomputed_id,
                                    claimed=expected_id, recomputed=recomputed_id,
                                    message="bytes do not hash to the ID they are stored under"))
    checks.append(Check.verdict(f"{name}.size", len(data) <= MAX_RECORD_BYTES,
                                recomputed=len(data),
                                message=f"record exceeds {MAX_RECORD_BYTES} bytes"))
    try:
        value = parse_json(data, what="record", jcs=True)
    except RecordParseError as exc:
        checks.append(Check.failed(f"{name}.json", exc.why))
        for aspect in ("canonical", "kind", "schema"):
            checks.append(Check.failed(f"{name}.{aspect}", "record is not valid strict JSON"))
        return checks
    checks.append(Check.passed(f"{name}.json"))
    canonical = _canonical_problem(data, value)
    checks.append(Check.verdict(f"{name}.canonical", canonical is None, message=canonical or ""))
    kind_problem = _kind_problem(value)
    tag = value.get("nscas") if isinstance(value, dict) else None
    if kind_problem is None and expected_kind is not None and tag != expected_kind:
        kind_problem = f"expected a {expected_kind} record, found {tag}"
    checks.append(Check.verdict(f"{name}.kind", kind_problem is None, claimed=tag,
                                recomputed=expected_kind, message=kind_problem or ""))
    if isinstance(value, dict) and tag in KINDS:
        problems = schema_problems(value)
        checks.append(Check.verdict(f"{name}.schema", not problems, claimed=tag,
                                    recomputed=problems or None,
                                    message="; ".join(problems)))
    else:
        checks.append(Check.failed(f"{name}.schema", "kind unknown, so no schema holds it"))
    return checks
