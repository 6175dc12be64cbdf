"""RFC 8785 canonical records and link extraction (docs/format.md §2)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from nscas.errors import RecordError, StrictJSONError
from nscas.objects.digests import Digest, is_digest_text

MAX_RECORD_BYTES = 16 << 20
# Objects and arrays nest at most this deep in a record (docs/format.md §2.3): deeper is no
# record a recipe writes, and recursive readers (the verifiers' among them) stop there.
MAX_RECORD_DEPTH = 64
_SAFE_INT = 2**53 - 1  # the integers rfc8785 accepts as Python ints


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # in C: every record read goes through here, once per object in it
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        key = next(k for i, k in enumerate(keys) if k in keys[:i])  # the first one repeated
        raise StrictJSONError(f"duplicate key {key!r} (a key repeats within an object)")
    return out


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not allowed: not a JSON number (strict JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    # 1e400 is not a constant to the decoder, but it reads as Infinity all the same.
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(f"number {text} overflows to infinity")
    return value


def _json_int(text: str) -> int | float:
    # JCS numbers are IEEE-754 doubles: rfc8785 writes an integral float of 2**53 or more (1e20)
    # as digits, and refuses Python ints that large. Such digits are the float they denote, so
    # the bytes rfc8785 wrote decode to a value that re-encodes to the same bytes.
    value = int(text)
    return value if -_SAFE_INT <= value <= _SAFE_INT else float(text)


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                            parse_float=_finite_float)
_JCS_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                                parse_float=_finite_float, parse_int=_json_int)


def nesting_depth(text: str) -> int:
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


def loads_strict(data: str | bytes, *, max_bytes: int | None = None, max_depth: int | None = None,
                 jcs_numbers: bool = False, parse_int: Callable[[str], Any] | None = None) -> Any:
    """Parse strict JSON: UTF-8, one value with only JSON whitespace around it, no repeated key
    in an object, no NaN/Infinity (nor a number that overflows to it). ``max_bytes`` caps the
    UTF-8 size and ``max_depth`` the bracket nesting, both checked before parsing;
    ``jcs_numbers`` reads integers beyond 2**53 as the doubles RFC 8785 means by them;
    ``parse_int`` (instead) turns each integer's digits into a value (a server bounding them).
    Raises :class:`StrictJSONError` (a ValueError) with the reason."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StrictJSONError("not valid UTF-8") from None
        size = len(raw)
    else:
        text = data
        try:
            size = len(text.encode("utf-8")) if max_bytes is not None else 0
        except UnicodeEncodeError:  # lone surrogates cannot be UTF-8 text at all
            raise StrictJSONError("not valid UTF-8 text") from None
    if max_bytes is not None and size > max_bytes:
        raise StrictJSONError(f"{size} bytes; at most {max_bytes} allowed")
    # Counting brackets is cheap; the character scan runs only when the count could matter.
    if (max_depth is not None and text.count("[") + text.count("{") > max_depth
            and nesting_depth(text) > max_depth):
        raise StrictJSONError(f"nests deeper than {max_depth} levels")
    try:
        # decode() skips JSON whitespace (space, tab, CR, LF) on both sides and nothing else.
        decoder = _JCS_DECODER if jcs_numbers else _DECODER
        if parse_int is not None:
            decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates,
                                       parse_constant=_no_constant, parse_float=_finite_float,
                                       parse_int=parse_int)
        return decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"not valid JSON ({exc.msg} at offset {exc.pos})") from None
    except StrictJSONError:
        raise
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        raise StrictJSONError("holds an integer too long to read (over "
                              f"{sys.get_int_max_str_digits()} digits)") from None
    except RecursionError:
        raise StrictJSONError("nests too deeply to parse") from None


def _check_finite(value: Any, path: str = "$") -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError("NaN and Infinity are not allowed", path=path)
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise RecordError("object keys must be strings", path=path)
            _check_finite(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_finite(v, f"{path}[{i}]")


def value_depth(value: Any) -> int:
    """How deeply objects and arrays nest in a parsed value (1 for ``{}``), without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


def encode(value: dict[str, Any]) -> bytes:
    """The canonical bytes of a record value (RFC 8785 via ``rfc8785``)."""
    if not isinstance(value, dict):
        raise RecordError("a record must be a JSON object")
    if value_depth(value) > MAX_RECORD_DEPTH:
        raise RecordError(f"a record nests at most {MAX_RECORD_DEPTH} levels deep")
    _check_finite(value)
    import rfc8785  # here: reads parse records (:func:`parse`) without ever encoding one

    try:
        data = rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise RecordError(f"cannot canonicalise: {exc}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"record is {len(data)} bytes; records stay under {MAX_RECORD_BYTES} bytes")
    return data


def parse(data: bytes) -> dict[str, Any]:
    """Parse record bytes strictly (valid UTF-8 JSON object, no duplicates, no NaN, within the
    size and depth limits) without re-encoding them: for bytes already checked against their
    ID, whose canonical form their writer checked (:func:`decode`) and ``fsck`` rechecks."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"record is {len(data)} bytes; records stay under {MAX_RECORD_BYTES} bytes")
    try:
        value = loads_strict(bytes(data), jcs_numbers=True, max_depth=MAX_RECORD_DEPTH)
    except StrictJSONError as exc:
        raise RecordError(exc.reason) from None
    if not isinstance(value, dict):
        raise RecordError("a record must be a JSON object")
    return value


def decode(data: bytes) -> dict[str, Any]:
    """Parse record bytes strictly: valid UTF-8 JSON object, no duplicates, no NaN, canonical."""
    value = parse(data)
    if encode(value) != bytes(data):
        raise RecordError("bytes are not the RFC 8785 canonical encoding of their value")
    return value


def looks_like_record(data: bytes) -> bool:
    """Cheap test used when classifying stored bytes: a JSON object with an ``nscas`` member."""
    return data[:1] == b"{" and b'"nscas":"' in data[:4096]


def iter_links(value: Any, path: str = "$") -> Iterator[tuple[str, Digest]]:
    """Every (JSON path, ID) pair: each string anywhere that is exactly an object ID."""
    if isinstance(value, str):
        if is_digest_text(value):
            yield path, Digest(value[7:])
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from iter_links(value[key], f"{path}.{key}" if _plain(key) else f"{path}[{json.dumps(key)}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from iter_links(item, f"{path}[{i}]")


def _plain(key: str) -> bool:
    return key.isidentifier()
