"""Claims against recomputation: every value a step claimed that the report recomputes is
compared, and the report refuses to exist if any differs.

Numbers compare by value (a stored record's ``0.0`` reads back as ``0``: RFC 8785 writes
both the same) within a relative 1e-9, since another implementation may sum the same
floats in another order; booleans, strings and ``None`` compare exactly.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from nscas.errors import RecipeError

REL_TOL = 1e-9
SHOWN = 10
"""Mismatches named in the error message; the error's ``mismatches`` holds them all."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    """One claimed value that the retained objects do not support."""

    source: str
    """The input (and receipt) that claimed it."""
    name: str
    """The claim, or the retained record line, that differs."""
    claimed: Any
    recomputed: Any

    def __str__(self) -> str:
        return (f"{self.source}: {self.name} claimed {_show(self.claimed)}, "
                f"recomputed {_show(self.recomputed)}")


class ClaimMismatch(RecipeError):
    """Claims (or a step's own retained scores) that recomputation from retained data
    contradicts; ``mismatches`` lists every one."""

    def __init__(self, mismatches: list[Mismatch]) -> None:
        shown = "; ".join(str(m) for m in mismatches[:SHOWN])
        more = f"; and {len(mismatches) - SHOWN} more" if len(mismatches) > SHOWN else ""
        super().__init__(f"{len(mismatches)} claimed value(s) differ from the retained data: "
                         f"{shown}{more}")
        self.mismatches = mismatches


def same_value(claimed: Any, recomputed: Any) -> bool:
    """Equal as JSON values, numbers within ``REL_TOL``."""
    if isinstance(claimed, bool) or isinstance(recomputed, bool):
        return type(claimed) is type(recomputed) and claimed == recomputed
    if isinstance(claimed, int) and isinstance(recomputed, int):
        return claimed == recomputed
    if isinstance(claimed, int | float) and isinstance(recomputed, int | float):
        return math.isclose(claimed, recomputed, rel_tol=REL_TOL, abs_tol=0.0)
    if isinstance(claimed, dict) and isinstance(recomputed, dict):
        return claimed.keys() == recomputed.keys() and all(
            same_value(claimed[k], recomputed[k]) for k in claimed)
    if isinstance(claimed, list | tuple) and isinstance(recomputed, list | tuple):
        return len(claimed) == len(recomputed) and all(
            same_value(a, b) for a, b in zip(claimed, recomputed, strict=True))
    return type(claimed) is type(recomputed) and claimed == recomputed


@dataclass(slots=True, kw_only=True)
class Audit:
    """Collects every mismatch so that one error names them all (restic ``check`` style)."""

    mismatches: list[Mismatch] = field(default_factory=list)

    def claim(self, run: Any, name: str, recomputed: Any) -> None:
        """Compare ``run``'s claim ``name`` with ``recomputed``, if the run claims it."""
        claims = run.claims
        if name in claims:
            self.value(f"{run.name} ({run.receipt})", name, claims[name], recomputed)

    def value(self, source: str, name: str, claimed: Any, recomputed: Any) -> None:
        if not same_value(claimed, recomputed):
            self.mismatches.append(Mismatch(source=source, name=name, claimed=claimed,
                                            recomputed=recomputed))

    def raise_if_any(self) -> None:
        if self.mismatches:
            raise ClaimMismatch(list(self.mismatches))


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."
