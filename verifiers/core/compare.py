"""Compare a claimed value with a recomputed one and turn the verdict into a ``Check``.

The rule is chosen by what the verifier recomputed, never by what the claim looks like
(docs/format.md §7: integers compare exactly; a floating value only within a tolerance named for that
check):

- a recomputed ``int`` (a count, wins, losses, documents, updates, targets, bytes) requires
  an integer claim equal to it exactly: ``0.000000000001``, ``1.0000000001`` and even
  ``2.0`` written as a float are refused (RFC 8785 writes an integral float as ``2``, so a
  claim that parses as a float is never a count);
- a recomputed ``Fraction`` (an exact rational: a p-value, an accuracy gain) requires a claim
  that is exactly ``float(fraction)``, the correctly rounded binary float (an integer claim is
  accepted only when it equals that float exactly, as RFC 8785 writes ``1.0`` as ``1``); a
  claimed string is a rational written ``numerator/denominator`` in lowest terms and must
  equal it exactly;
- a recomputed ``float`` is compared within a tolerance: ``Tolerance(value, rel=..., abs=...,
  why=...)`` names it for one check, else ``FLOAT_RULE`` (relative 1e-9, for sums taken in
  another order) applies. The claim may be an integer there, since an integral float is
  written as one. Non-finite values equal only themselves (and NaN nothing);
- ``Exact(value)`` forces exact comparison of anything (a float that must be bit-identical);
- booleans are never numbers (``true`` does not equal ``1``), strings and null compare
  exactly; dicts compare key sets and then values, lists length and then items in order,
  recursively; every differing path is reported, not only the first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .results import Check

REL_TOL = 1e-9
ABS_TOL = 1e-12
_MAX_SHOWN = 10


@dataclass(frozen=True, slots=True)
class Tolerance:
    """A recomputed float and the tolerance that this check allows, with why it is needed."""

    value: float | None
    rel: float = REL_TOL
    abs: float = ABS_TOL
    why: str = "floating sums taken in another order"

    def describe(self) -> str:
        return f"tolerance rel {self.rel:g}, abs {self.abs:g} ({self.why})"


@dataclass(frozen=True, slots=True)
class Exact:
    """A recomputed value that the claim must equal exactly, floats included."""

    value: Any


FLOAT_RULE = Tolerance(None)
"""The default for a recomputed float with no tolerance of its own."""


def differences(claimed: Any, recomputed: Any, *, rel_tol: float = REL_TOL,
                abs_tol: float = ABS_TOL) -> list[str]:
    """Every place where ``claimed`` and ``recomputed`` differ, as ``path: why`` strings."""
    found: list[str] = []
    _diff(claimed, recomputed, "$", Tolerance(None, rel_tol, abs_tol), found, 0)
    return found


def compare(name: str, claimed: Any, recomputed: Any, *, rel_tol: float = REL_TOL,
            abs_tol: float = ABS_TOL) -> Check:
    """A passed check when ``claimed`` equals ``recomputed`` under the rules above. The
    message names the tolerance(s) used when any float was compared within one."""
    default = Tolerance(None, rel_tol, abs_tol)
    found: list[str] = []
    used: set[str] = set()
    _diff(claimed, recomputed, "$", default, found, 0, used)
    shown_value = plain(recomputed)
    rule = ("; ".join(sorted(used))) if used else ""
    if not found:
        return Check.passed(name, claimed=claimed, recomputed=shown_value, message=rule)
    shown = "; ".join(found[:_MAX_SHOWN])
    more = f" (and {len(found) - _MAX_SHOWN} more)" if len(found) > _MAX_SHOWN else ""
    return Check.failed(name, f"claimed value differs from recomputation: {shown}{more}"
                        + (f" [{rule}]" if rule else ""), claimed=claimed,
                        recomputed=shown_value)


def plain(value: Any) -> Any:
    """``value`` without its ``Tolerance``/``Exact`` wrappers (what a report shows)."""
    if isinstance(value, Tolerance | Exact):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Fraction) and not isinstance(value, bool)


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


def _float_equal(a: float, b: float, tol: Tolerance) -> bool:
    if math.isnan(a) or math.isnan(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= max(tol.rel * max(abs(a), abs(b)), tol.abs)


def _number(claimed: Any, recomputed: Any, path: str, tol: Tolerance, out: list[str],
            used: set[str] | None, exact: bool) -> None:
    """Compare a claim with a recomputed number under the rule its type gives."""
    if isinstance(recomputed, bool):
        if claimed is not recomputed:
            out.append(f"{path}: claimed {_short(claimed)}, recomputed {recomputed}")
        return
    if isinstance(recomputed, int):
        if isinstance(claimed, bool) or not isinstance(claimed, int):
            out.append(f"{path}: claimed {_short(claimed)}, recomputed the integer {recomputed}"
                       " (integers compare exactly and must be integers)")
        elif claimed != recomputed:
            out.append(f"{path}: claimed {_short(claimed)}, recomputed {recomputed}")
        return
    if isinstance(recomputed, Fraction):
        if isinstance(claimed, str):
            text = f"{recomputed.numerator}/{recomputed.denominator}"
            if claimed != text:
                out.append(f"{path}: claimed {_short(claimed)}, recomputed exactly {text}")
            return
        rounded = float(recomputed)
        if not _is_number(claimed) or isinstance(claimed, Fraction) or claimed != rounded:
            out.append(f"{path}: claimed {_short(claimed)}, the correctly rounded float of the "
                       f"recomputed {recomputed.numerator}/{recomputed.denominator} is "
                       f"{rounded!r}")
        return
    # a float
    if not _is_number(claimed) or isinstance(claimed, Fraction):
        out.append(f"{path}: claimed {_short(claimed)}, recomputed {recomputed!r}")
        return
    if exact:
        if claimed != recomputed:
            out.append(f"{path}: claimed {_short(claimed)}, recomputed exactly {recomputed!r}")
        return
    if used is not None:
        used.add(tol.describe())
    try:
        fa = float(claimed)
    except OverflowError:
        out.append(f"{path}: claimed {_short(claimed)} is out of float range")
        return
    if not _float_equal(fa, float(recomputed), tol):
        out.append(f"{path}: claimed {_short(claimed)}, recomputed {recomputed!r} "
                   f"({tol.describe()})")


def _diff(a: Any, b: Any, path: str, tol: Tolerance, out: list[str], depth: int,
          used: set[str] | None = None, exact: bool = False) -> None:
    if isinstance(b, Tolerance):
        if b.value is None:
            if a is not None:
                out.append(f"{path}: claimed {_short(a)}, recomputed null")
            return
        _diff(a, float(b.value), path, b, out, depth, used, exact)
        return
    if isinstance(b, Exact):
        _diff(a, b.value, path, tol, out, depth, used, True)
        return
    if depth > 64:
        out.append(f"{path}: nested too deep to compare")
        return
    ka, kb = _kind(a), _kind(b)
    if kb == "number" and isinstance(b, Fraction) and ka == "string":
        _number(a, b, path, tol, out, used, exact)
        return
    if ka != kb:
        out.append(f"{path}: claimed {ka} {_short(a)}, recomputed {kb} {_short(b)}")
        return
    if ka in ("number", "boolean"):
        _number(a, b, path, tol, out, used, exact)
    elif ka == "object":
        missing = sorted(set(b) - set(a), key=str)
        extra = sorted(set(a) - set(b), key=str)
        if missing:
            out.append(f"{path}: claimed lacks keys {missing}")
        if extra:
            out.append(f"{path}: claimed has extra keys {extra}")
        for key in sorted(set(a) & set(b), key=str):
            _diff(a[key], b[key], f"{path}.{key}", tol, out, depth + 1, used, exact)
    elif ka == "array":
        if len(a) != len(b):
            out.append(f"{path}: claimed {len(a)} items, recomputed {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(x, y, f"{path}[{i}]", tol, out, depth + 1, used, exact)
    elif a != b:
        out.append(f"{path}: claimed {_short(a)}, recomputed {_short(b)}")


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**50:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
