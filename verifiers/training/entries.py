"""Journal step entries and the value rules every training check shares (docs/experiment.md §3.8).

Step entries of the train recipe are the entries with a ``step`` and no ``event``; steps are
numbered from 1 (step ``s`` trains batch ``s - 1`` of the schedule); ``documents`` holds
document ids and ``indices`` their schedule indices; an ``{"event": "resume",
"from_step": k}`` entry discards the step entries after ``k`` written before it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from ..core.results import Check

FLOAT_NOISE = 1e-6
"""Relative difference allowed between ranks' losses and gradient norms."""


_SHOWN = 5


def problems_check(name: str, problems: list[str], **values: Any) -> Check:
    if not problems:
        return Check.passed(name, **values)
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return Check.failed(name, f"{len(problems)} problem(s): " + "; ".join(problems[:_SHOWN])
                        + more, **values)


def effective_steps(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Step entries that led to the final parameters, in step order (resume-aware)."""
    kept: dict[Any, Mapping[str, Any]] = {}
    for entry in entries:
        if entry.get("event") == "resume":
            start = entry.get("from_step")
            # A resume without an integer step keeps nothing (as for the outer events).
            kept = {s: e for s, e in kept.items()
                    if isinstance(s, int) and is_int(start) and s <= start}
        elif "step" in entry and "event" not in entry:
            kept[entry["step"]] = entry
    # Numeric order for integer steps (10 after 9); anything else after them, by its text.
    return [kept[s] for s in sorted(kept, key=lambda s: (0, s, "") if isinstance(s, int)
                                     and not isinstance(s, bool) else (1, 0, str(s)))]


def close_enough(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=FLOAT_NOISE, abs_tol=1e-12)
    return bool(a == b)


def is_diloco(params: Mapping[str, Any]) -> bool:
    """A DiLoCo run (``sync = "diloco"``); actions from before the param are ddp."""
    return bool(params.get("sync", "ddp") == "diloco")


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


HEX_DIGEST = frozenset("0123456789abcdef")


def is_hex_digest(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX_DIGEST
