"""The verifiers' result model: one ``Check`` per finding, collected into a ``Report``.

Checkers return every finding they make and keep going (restic ``check`` style); a
``Report`` is only built at the end. ``Report.to_json()`` is the machine-readable form that
``nscas verify --json`` prints: ``{"ok": bool, "checks": [{"name", "status", "claimed",
"recomputed", "message"}, ...]}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import PurePath
from typing import Any, Literal

from .errors import InvalidArgument

Status = Literal["passed", "failed", "skipped"]
STATUSES: tuple[Status, ...] = ("passed", "failed", "skipped")


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One verified statement: what was claimed, what the verifier recomputed, and the verdict."""

    name: str
    """Dotted name of what was checked, e.g. ``claims.single.requests_per_second``."""
    status: Status
    """``passed``, ``failed``, or ``skipped`` (could not be checked; fails a strict report)."""
    claimed: Any = None
    """The value the checked object states (JSON-like), or None when it states none."""
    recomputed: Any = None
    """The value the verifier computed on its own, or None when nothing was computed."""
    message: str = ""
    """One line for humans: why it failed or was skipped; may be empty when it passed."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise InvalidArgument("check status", f"{self.status!r} is not one of {STATUSES}")
        if not self.name:
            raise InvalidArgument("check name", "must not be empty")

    @classmethod
    def passed(cls, name: str, *, claimed: Any = None, recomputed: Any = None,
               message: str = "") -> Check:
        return cls(name=name, status="passed", claimed=claimed, recomputed=recomputed,
                   message=message)

    @classmethod
    def failed(cls, name: str, message: str, *, claimed: Any = None,
               recomputed: Any = None) -> Check:
        return cls(name=name, status="failed", claimed=claimed, recomputed=recomputed,
                   message=message)

    @classmethod
    def skipped(cls, name: str, message: str, *, claimed: Any = None) -> Check:
        return cls(name=name, status="skipped", claimed=claimed, message=message)

    @classmethod
    def verdict(cls, name: str, ok: bool, *, claimed: Any = None, recomputed: Any = None,
                message: str = "") -> Check:
        """A passed or failed check depending on ``ok``; ``message`` explains a failure."""
        return cls(name=name, status="passed" if ok else "failed", claimed=claimed,
                   recomputed=recomputed, message="" if ok else message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "claimed": _jsonable(self.claimed),
            "recomputed": _jsonable(self.recomputed),
            "message": self.message,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """All checks of one verification. ``ok`` means no check failed (and, if strict, none skipped)."""

    checks: tuple[Check, ...] = ()
    """Every finding, in the order the checkers made them."""
    strict: bool = False
    """When true, a skipped check counts as a failure: nothing may go unverified."""

    @classmethod
    def of(cls, *groups: Iterable[Check], strict: bool = False) -> Report:
        """Build a report from any number of check lists, keeping their order."""
        return cls(checks=tuple(check for group in groups for check in group), strict=strict)

    def with_checks(self, checks: Iterable[Check]) -> Report:
        """A new report with ``checks`` appended (reports are immutable)."""
        return Report(checks=(*self.checks, *checks), strict=self.strict)

    @property
    def failures(self) -> tuple[Check, ...]:
        """The checks that make this report not ok."""
        bad: tuple[Status, ...] = ("failed", "skipped") if self.strict else ("failed",)
        return tuple(c for c in self.checks if c.status in bad)

    @property
    def ok(self) -> bool:
        return not self.failures

    def count(self, status: Status) -> int:
        return sum(1 for c in self.checks if c.status == status)

    def summary(self) -> str:
        """The one summary line a checker prints last."""
        verdict = "ok" if self.ok else "FAILED"
        return (f"{verdict}: {len(self.checks)} checks, {self.count('passed')} passed, "
                f"{self.count('failed')} failed, {self.count('skipped')} skipped"
                + (" (strict)" if self.strict else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks]}

    def to_json(self, *, indent: int | None = None) -> str:
        """The report as JSON text: exactly ``{"ok", "checks": [...]}``."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)


def _jsonable(value: Any) -> Any:
    """Values a checker may hold (fractions, tuples, paths, bytes) as plain JSON values.

    Exact fractions become floats for JSON; non-finite floats become strings because JSON
    has no NaN and a report must always serialise.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Fraction):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, PurePath):
        return value.as_posix()
    return repr(value)
