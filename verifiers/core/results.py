"""The verifiers' result model: one ``Check`` per finding, collected into a ``Report``.

Checkers return every finding they make and keep going (restic ``check`` style); a
``Report`` is only built at the end. ``Report.to_json()`` is the machine-readable form that
``nscas verify --json`` prints: ``{"target", "named", "ok", "strict", "summary",
"not_rechecked", "self_reported", "checks": [{"name", "status", "claimed", "recomputed",
"message", "needs"}, ...]}``.
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
Needs = Literal["weights", "model"]
"""Why a check may be skipped, and nothing else may: it needs weights the bundle omitted, or a
model run (a replay) that plain verification does not do (docs/format.md §7)."""
NEEDS: tuple[Needs, ...] = ("weights", "model")
SELF_REPORTED: tuple[str, ...] = (
    "journal entries: seconds",
    "journal/1 records: loop_seconds, peak_memory_bytes",
    "request log lines: start, end, wall_start, wall_end",
    "receipts: started, finished, pipeline, step, variant",
    "evaluate timing lines and probes generation lines: seconds, tokens_per_second",
    "environment/1 records: every member but those cross-checked against the run",
)
"""The fixed list of facts that only the run itself measured (docs/verify.md): no retained
evidence recomputes them, so a consistent rewrite of them alone is undetectable, and they are
trusted only as far as the pinned ID (``--expect``) or a signature is."""


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
    needs: Needs | None = None
    """For a skipped check, what rechecking it needs (``weights`` or ``model``); else None."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise InvalidArgument("check status", f"{self.status!r} is not one of {STATUSES}")
        if not self.name:
            raise InvalidArgument("check name", "must not be empty")
        if (self.status == "skipped") != (self.needs in NEEDS):
            raise InvalidArgument("check needs", "a check is skipped exactly when it needs "
                                  f"omitted weights or a model run ({self.name}: {self.needs!r})")

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
    def skipped(cls, name: str, message: str, *, needs: Needs, claimed: Any = None,
                recomputed: Any = None) -> Check:
        """Not rechecked: only for checks that need omitted weights or a model run. Anything
        else that cannot be recomputed (unreadable evidence, an unknown verifier) fails.
        ``recomputed`` holds what was computed on the way (a partial replay), if anything."""
        return cls(name=name, status="skipped", claimed=claimed, recomputed=recomputed,
                   message=message, needs=needs)

    @classmethod
    def verdict(cls, name: str, ok: bool, *, claimed: Any = None, recomputed: Any = None,
                message: str = "") -> Check:
        """A passed or failed check depending on ``ok``; ``message`` explains a failure."""
        return cls(name=name, status="passed" if ok else "failed", claimed=claimed,
                   recomputed=recomputed, message="" if ok else message)

    @classmethod
    def of_problems(cls, name: str, problems: list[str], *, shown: int = 5, claimed: Any = None,
                    recomputed: Any = None) -> Check:
        """Passed when ``problems`` is empty, else failed with the first ``shown`` of them
        and how many more there are."""
        if not problems:
            return cls.passed(name, claimed=claimed, recomputed=recomputed)
        more = f" (and {len(problems) - shown} more)" if len(problems) > shown else ""
        return cls.failed(name, "; ".join(problems[:shown]) + more, claimed=claimed,
                          recomputed=recomputed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "claimed": _jsonable(self.claimed),
            "recomputed": _jsonable(self.recomputed),
            "message": self.message,
            "needs": self.needs,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """All checks of one verification. ``ok`` means no check failed (and, if strict, none was
    skipped for want of omitted weights; checks that need a model run never fail it)."""

    checks: tuple[Check, ...] = ()
    """Every finding, in the order the checkers made them."""
    strict: bool = False
    """When true, a check skipped because weights were omitted counts as a failure."""
    target: str | None = None
    """The full ID of what was verified (a receipt), printed first in every output format."""
    named: str | None = None
    """What the user named, when it was not the receipt itself (an output, a ref, a bundle)."""
    self_reported: tuple[str, ...] = ()
    """The fixed list of facts no retained evidence can recompute (docs/verify.md)."""
    signers: tuple[str, ...] = ()
    """Who signed each receipt's self-reported facts, one line per (receipt, key) whose
    signature verified (``signatures.py``)."""

    @classmethod
    def of(cls, *groups: Iterable[Check], strict: bool = False, target: str | None = None,
           named: str | None = None, self_reported: tuple[str, ...] = (),
           signers: tuple[str, ...] = ()) -> Report:
        """Build a report from any number of check lists, keeping their order."""
        return cls(checks=tuple(check for group in groups for check in group), strict=strict,
                   target=target, named=named, self_reported=self_reported, signers=signers)

    def with_checks(self, checks: Iterable[Check]) -> Report:
        """A new report with ``checks`` appended (reports are immutable)."""
        return Report(checks=(*self.checks, *checks), strict=self.strict, target=self.target,
                      named=self.named, self_reported=self.self_reported, signers=self.signers)

    @property
    def failures(self) -> tuple[Check, ...]:
        """The checks that make this report not ok."""
        return tuple(c for c in self.checks if c.status == "failed"
                     or (self.strict and c.status == "skipped" and c.needs == "weights"))

    @property
    def ok(self) -> bool:
        return not self.failures

    def count(self, status: Status) -> int:
        return sum(1 for c in self.checks if c.status == status)

    def not_rechecked(self, needs: Needs) -> list[str]:
        """Names of the checks skipped because they need ``needs``."""
        return [c.name for c in self.checks if c.status == "skipped" and c.needs == needs]

    def summary(self) -> str:
        """The one summary line a checker prints last."""
        verdict = "ok" if self.ok else "FAILED"
        return (f"{verdict}: {len(self.checks)} checks, {self.count('passed')} passed, "
                f"{self.count('failed')} failed, {self.count('skipped')} not rechecked"
                + (" (strict)" if self.strict else ""))

    def notes(self) -> list[str]:
        """What the summary adds for a reader: what was not rechecked, by name and why, and
        which facts are self-reported."""
        lines = []
        reasons: tuple[tuple[Needs, str], ...] = (("model", "needs a model run"),
                                                  ("weights", "needs omitted weights"))
        for needs, why in reasons:
            names = self.not_rechecked(needs)
            if names:
                lines.append(f"not rechecked ({why}): {', '.join(names)}")
        if self.self_reported:
            lines.append("self-reported, trusted only as far as the pinned ID or a signature: "
                         + ", ".join(self.self_reported))
        lines += [f"self-reported facts of {line}" for line in _signed_alike(self.signers)]
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "named": self.named, "ok": self.ok,
                "strict": self.strict, "summary": self.summary(),
                "not_rechecked": {n: self.not_rechecked(n) for n in NEEDS},
                "self_reported": list(self.self_reported),
                "signers": list(self.signers),
                "checks": [c.to_dict() for c in self.checks]}

    def to_json(self, *, indent: int | None = None) -> str:
        """The report as JSON text (``to_dict``), the target first."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)


def _signed_alike(signers: tuple[str, ...]) -> list[str]:
    """Signer lines (``receipt R: signed by ...``) with the receipts one signer signed alike
    said once, with their count: a run signs every receipt with one key, and a line per
    receipt would bury the rest of the notes."""
    by_signature: dict[str, list[str]] = {}
    for line in signers:
        receipt, _, signed = line.partition(": ")
        by_signature.setdefault(signed, []).append(receipt)
    return [receipts[0] + ": " + signed if len(receipts) == 1
            else f"{len(receipts)} receipts: each {signed}"
            for signed, receipts in by_signature.items()]


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
