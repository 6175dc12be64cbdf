"""The strict comparison of report.json and the pages with the verifiers' recomputation
(docs/experiment.md §6.2): integers and rationals exactly, copied floats to the bit, summed floats
within a stated tolerance, every member accounted for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..core.results import Check

REL_TOL = 1e-9


ABS_TOL = 1e-12


TOLERANCE = f"float_recomputation (relative {REL_TOL:g}, absolute {ABS_TOL:g})"


EXACT_KEYS = frozenset({"first_loss", "last_loss", "mean_loss", "loss_by_step", "lr_by_step",
                        "grad_norm_by_step", "x", "y"})
"""Members whose floats are copied from retained entries, or defined to the bit (``mean_loss``,
``math.fsum`` then one division: docs/format.md §3.10), so they compare exactly."""


INEXACT_KEYS = frozenset({"parameters"})
"""Members whose floats are all recomputed sums (report.json's ``parameters`` and the
``parameters`` figure drawn from it, whose lines' ``y`` are distances): within the tolerance
everywhere below them, whatever ``EXACT_KEYS`` says."""


Exactness = bool | None
"""How the floats below a member compare: exactly (True), within the tolerance (False), or
within the tolerance whatever member follows (None: below an ``INEXACT_KEYS`` member)."""


def _below(exact: Exactness, key: Any) -> Exactness:
    """The exactness of member ``key`` of a value compared with ``exact``."""
    if exact is None or key in INEXACT_KEYS:
        return None
    return exact or key in EXACT_KEYS


SHOWN = 5
"""How ``closure.Objects`` says a bundle left an object out (``omitted (<reason>)``)."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float | Fraction):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _show(value: Any) -> str:
    if isinstance(value, Fraction):
        text = f"{value.numerator}/{value.denominator}"
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10 ** 30:
        text = f"an integer of {len(str(abs(value)))} digits"
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except OverflowError:
        return None


def leaf_problem(claimed: Any, mine: Any, *, exact: bool = False) -> str | None:
    """Why ``claimed`` is not ``mine`` under the comparison rules, or None when it is."""
    kc, km = _kind(claimed), _kind(mine)
    if km in ("null", "boolean", "string"):
        if kc != km or claimed != mine:
            return f"shows {kc} {_show(claimed)}, recomputed {km} {_show(mine)}"
        return None
    if km == "integer":
        if kc != "integer" or claimed != mine:
            return f"shows {kc} {_show(claimed)}, recomputed integer {_show(mine)} (exact)"
        return None
    if km == "number" and isinstance(mine, Fraction):
        if kc == "integer" and claimed == mine:
            return None
        if kc == "number" and isinstance(claimed, float) and claimed == _as_float(mine):
            return None
        return (f"shows {kc} {_show(claimed)}, recomputed exactly {_show(mine)} (correctly "
                f"rounded {_show(_as_float(mine))})")
    if km == "number":
        got = _as_float(claimed) if kc in ("integer", "number") else None
        if got is None or not math.isfinite(got):
            return f"shows {kc} {_show(claimed)}, recomputed number {_show(mine)}"
        if exact:
            return None if got == mine else (f"shows {_show(claimed)}, recomputed "
                                             f"{_show(mine)} (copied values compare exactly)")
        if math.isfinite(mine) and abs(got - mine) <= max(REL_TOL * max(abs(got), abs(mine)),
                                                          ABS_TOL):
            return None
        return f"shows {_show(claimed)}, recomputed {_show(mine)} (tolerance {TOLERANCE})"
    return f"shows {kc} {_show(claimed)}, recomputed {km} {_show(mine)}"


def strict_problems(claimed: Any, mine: Any, path: str = "$", *,
                    exact: Exactness = False) -> list[str]:
    """Every place ``claimed`` differs from ``mine`` (recursing only along ``mine``)."""
    out: list[str] = []
    stack = [(claimed, mine, path, exact)]
    while stack:
        a, b, where, ex = stack.pop()
        if isinstance(b, dict) and isinstance(a, dict):
            extra = sorted(str(k) for k in a if k not in b)
            missing = sorted(str(k) for k in b if k not in a)
            if extra:
                out.append(f"{where}: members not recomputed {extra[:SHOWN]}")
            if missing:
                out.append(f"{where}: lacks members {missing[:SHOWN]}")
            stack.extend((a[k], b[k], f"{where}.{k}", _below(ex, k))
                         for k in reversed(list(b)) if k in a)
        elif isinstance(b, list | tuple) and isinstance(a, list):
            if len(a) != len(b):
                out.append(f"{where}: {len(a)} items, recomputed {len(b)}")
            stack.extend((x, y, f"{where}[{i}]", ex)
                         for i, (x, y) in reversed(list(enumerate(zip(a, b, strict=False)))))
        else:
            problem = leaf_problem(a, b, exact=bool(ex))
            if problem is not None:
                out.append(f"{where}: {problem}")
    return out


def settle(claimed: Any, mine: Any, *, exact: Exactness = False) -> Any:
    """``mine`` (the recomputation) with report.json's value at each leaf that is equal to it
    under the comparison rules, so that a float equal within the tolerance is shown as the
    report printed it; exact rationals elsewhere as their correctly rounded floats."""
    if isinstance(mine, dict):
        theirs = claimed if isinstance(claimed, dict) else {}
        return {k: settle(theirs.get(k, _ABSENT), v, exact=_below(exact, k))
                for k, v in mine.items()}
    if isinstance(mine, list | tuple):
        items = claimed if isinstance(claimed, list) else []
        return [settle(items[i] if i < len(items) else _ABSENT, v, exact=exact)
                for i, v in enumerate(mine)]
    if claimed is not _ABSENT and leaf_problem(claimed, mine, exact=bool(exact)) is None:
        return claimed
    return float(mine) if isinstance(mine, Fraction) else mine


_ABSENT = object()


@dataclass(slots=True)
class _Fields:
    prefix: str
    compared: int = 0
    failed: list[Check] = field(default_factory=list)

    def walk(self, claimed: Any, mine: Any, path: str, exact: Exactness = False) -> None:
        stack = [(claimed, mine, path, exact)]
        while stack:
            a, b, where, ex = stack.pop()
            if isinstance(a, dict) and isinstance(b, dict):
                for key in sorted(set(a) - set(b), key=str):
                    self.failed.append(Check.failed(
                        f"{self.prefix}.{_join(where, key)}", "report.json holds this member, "
                        "which no verifier recomputes", claimed=_short(a[key])))
                for key in sorted(set(b) - set(a), key=str):
                    self.failed.append(Check.failed(f"{self.prefix}.{_join(where, key)}",
                                                    "report.json lacks this member",
                                                    recomputed=b[key]))
                stack.extend((a[k], b[k], _join(where, k), _below(ex, k))
                             for k in sorted((k for k in b if k in a), key=str, reverse=True))
            elif isinstance(a, list) and isinstance(b, list | tuple):
                if len(a) != len(b):
                    self.failed.append(Check.failed(
                        f"{self.prefix}.{where}", f"report.json lists {len(a)} items, "
                        f"recomputed {len(b)}", claimed=len(a), recomputed=len(b)))
                stack.extend((x, y, f"{where}[{i}]", ex) for i, (x, y)
                             in reversed(list(enumerate(zip(a, b, strict=False)))))
            else:
                problem = leaf_problem(a, b, exact=bool(ex))
                if problem is not None:
                    self.failed.append(Check.failed(f"{self.prefix}.{where}", "report.json "
                                                    f"differs from the recomputation: {problem}",
                                                    claimed=_short(a), recomputed=b))
                else:
                    self.compared += 1


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _short(value: Any) -> Any:
    """A claimed value as a check may hold it (no huge or deep hostile values)."""
    if isinstance(value, dict | list) or (isinstance(value, int) and abs(value) > 10 ** 30):
        return _show(value)
    if isinstance(value, str) and len(value) > 200:
        return value[:197] + "..."
    return value


def field_checks(prefix: str, part: str, claimed: dict[str, Any],
                 mine: dict[str, Any]) -> list[Check]:
    """One failed check per differing, missing or unrecomputed member of ``claimed``
    (report.json's top-level members of ``part``), else one passed check for the part."""
    fields = _Fields(prefix=prefix)
    fields.walk(claimed, mine, "")
    return fields.failed or [Check.passed(f"{prefix}.{part}",
                                          recomputed=f"{fields.compared} values equal")]


def listing(name: str, problems: list[str], *, recomputed: Any = None) -> Check:
    if not problems:
        return Check.passed(name, recomputed=recomputed)
    more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
    return Check.failed(name, f"{len(problems)} problem(s): " + "; ".join(problems[:SHOWN])
                        + more, recomputed=recomputed)
