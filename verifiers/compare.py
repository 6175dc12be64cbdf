"""Compare a claimed value with a recomputed one and turn the verdict into a ``Check``.

Rules: integers (and exact fractions) compare exactly; as soon as either side is a float the
comparison is ``|a - b| <= max(rel_tol * max(|a|, |b|), abs_tol)``. A JSON float that happens
to be whole is written as an integer by RFC 8785 (``2.0`` becomes ``2``), so an integer
claimed against a float recomputation is compared with the float rule, not rejected for its
type. Booleans are never numbers (``true`` does not equal ``1``). Dicts compare key sets and
then values, lists compare length and then items in order, recursively; every differing path
is reported, not only the first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from .report import Check

REL_TOL = 1e-9
ABS_TOL = 1e-12
_MAX_SHOWN = 10


def differences(claimed: Any, recomputed: Any, *, rel_tol: float = REL_TOL,
                abs_tol: float = ABS_TOL) -> list[str]:
    """Every place where ``claimed`` and ``recomputed`` differ, as ``path: why`` strings."""
    found: list[str] = []
    _diff(claimed, recomputed, "$", rel_tol, abs_tol, found)
    return found


def compare(name: str, claimed: Any, recomputed: Any, *, rel_tol: float = REL_TOL,
            abs_tol: float = ABS_TOL) -> Check:
    """A passed check when ``claimed`` equals ``recomputed`` under the rules above."""
    found = differences(claimed, recomputed, rel_tol=rel_tol, abs_tol=abs_tol)
    if not found:
        return Check.passed(name, claimed=claimed, recomputed=recomputed)
    shown = "; ".join(found[:_MAX_SHOWN])
    more = f" (and {len(found) - _MAX_SHOWN} more)" if len(found) > _MAX_SHOWN else ""
    return Check.failed(name, f"claimed value differs from recomputation: {shown}{more}",
                        claimed=claimed, recomputed=recomputed)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Fraction) and not isinstance(value, bool)


def _numbers_equal(a: int | float | Fraction, b: int | float | Fraction, rel_tol: float,
                   abs_tol: float) -> bool:
    if isinstance(a, int | Fraction) and isinstance(b, int | Fraction):
        return a == b
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb):
        return False
    if math.isinf(fa) or math.isinf(fb):
        return fa == fb
    return abs(fa - fb) <= max(rel_tol * max(abs(fa), abs(fb)), abs_tol)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _diff(a: Any, b: Any, path: str, rel_tol: float, abs_tol: float, out: list[str]) -> None:
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        out.append(f"{path}: claimed {ka} {_short(a)}, recomputed {kb} {_short(b)}")
        return
    if ka == "number":
        if not _numbers_equal(a, b, rel_tol, abs_tol):
            out.append(f"{path}: claimed {_short(a)}, recomputed {_short(b)}")
    elif ka == "object":
        missing = sorted(set(b) - set(a), key=str)
        extra = sorted(set(a) - set(b), key=str)
        if missing:
            out.append(f"{path}: claimed lacks keys {missing}")
        if extra:
            out.append(f"{path}: claimed has extra keys {extra}")
        for key in sorted(set(a) & set(b), key=str):
            _diff(a[key], b[key], f"{path}.{key}", rel_tol, abs_tol, out)
    elif ka == "array":
        if len(a) != len(b):
            out.append(f"{path}: claimed {len(a)} items, recomputed {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(x, y, f"{path}[{i}]", rel_tol, abs_tol, out)
    elif a != b:
        out.append(f"{path}: claimed {_short(a)}, recomputed {_short(b)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
