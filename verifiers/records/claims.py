"""What a checker recomputed for one receipt's claims (docs/format.md §3.10), and the
``<run>.environment`` check every recipe's checker makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import VerifierError
from ..core.results import Check, Needs
from ..core.runs import Run
from .closure import Objects, Unusable
from .environment import environment_check


@dataclass(slots=True)
class Findings:
    """What a checker recomputed for one receipt."""

    checks: list[Check] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    """Recomputed claim values by claim name."""
    per_rank: dict[str, list[Any]] = field(default_factory=dict)
    """Per-rank recomputations, used when a claim states one value per rank."""
    decided: dict[str, Check] = field(default_factory=dict)
    """Claims already checked whole by a checker (serving), by claim name."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Claims that could not be recomputed, with the reason: each is a failed check."""
    not_rechecked: dict[str, tuple[Needs, str]] = field(default_factory=dict)
    """Claims that need omitted weights or a model run to recompute, with what they need and
    why: the only claims that are skipped rather than failed."""

    def section(self, name: str, claims: tuple[str, ...], work: Callable[[], None]) -> None:
        """Run one part of a checker; an unusable object fails that part (or skips it, when
        what is missing is an omitted weight), not the rest."""
        try:
            work()
        except Unusable as exc:
            reason = f"{exc.object_id} is unusable: {exc.why}"
            if exc.needs is None:
                self._fail(name, reason, claims)
                return
            self.checks.append(Check.skipped(name, reason, needs=exc.needs))
            for claim in claims:
                self.not_rechecked.setdefault(claim, (exc.needs, reason))
        except VerifierError as exc:  # malformed content: a finding about this receipt
            self._fail(name, exc.message, claims)
        except KeyError as exc:  # an input, output or member the recipe always has is absent
            self._fail(name, f"the run lacks {exc.args[0]!r}, which its recipe always has",
                       claims)

    def _fail(self, name: str, why: str, claims: tuple[str, ...]) -> None:
        self.checks.append(Check.failed(name, why))
        for claim in claims:
            self.skipped.setdefault(claim, f"not recomputed: {why}")


Checker = Callable[[Objects, Run, Findings], None]


def environment_section(objects: Objects, run: Run, found: Findings,
                 journals: list[dict[str, Any]] | None = None) -> None:
    """``<run>.environment``: the environment/1 record agrees with the params and journals."""
    def work() -> None:
        env = objects.record_of(run.receipt["environment"], "environment/1")
        found.checks.append(environment_check(env, run.params, run.name, journals or ()))
    found.section(f"{run.name}.environment", (), work)
