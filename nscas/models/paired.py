"""Paired statistics of two models' outcomes on the same items (docs/experiment.md §4): exact
McNemar (sign) test, accuracy gain, retention. The evaluate and report recipes and the UI share them.

P-values and gains are exact ``Fraction``s, computed with integer arithmetic, so a contract
decision at a boundary (a gain of exactly 0.05) never depends on floating-point rounding.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nscas.errors import InvalidInput

GAIN_MIN = Fraction("0.05")
"""The published contract: accuracy gain of at least five percentage points ..."""
P_MAX = Fraction("0.01")
"""... at a one-sided paired p-value of at most 0.01 ..."""
RETENTION_UPPER_MAX = Fraction("0.02")
"""... and an approximate 99% upper bound on the retention loss change of at most 0.02 nats."""
Z_99 = 2.576
"""The one-sided normal quantile the published upper bound uses."""


@dataclass(frozen=True, slots=True, kw_only=True)
class McNemar:
    """The exact one-sided sign test on the discordant pairs."""

    wins: int
    losses: int
    p: Fraction
    """P(at least ``wins`` of ``wins + losses`` fair coin flips); 1 when there are none."""

    @property
    def n(self) -> int:
        return self.wins + self.losses

    @property
    def p_float(self) -> float:
        return float(self.p)


def mcnemar_one_sided(wins: int, losses: int) -> McNemar:
    """p = sum_{k=wins..n} C(n, k) / 2^n with n = wins + losses (p = 1 when n = 0)."""
    for name, value in (("wins", wins), ("losses", losses)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"McNemar {name} must be an integer >= 0, got {value!r}")
    n = wins + losses
    tail = sum(math.comb(n, k) for k in range(wins, n + 1))
    return McNemar(wins=wins, losses=losses, p=Fraction(tail, 2**n))


def _aligned(what: str, baseline: Sequence[tuple[str, Any]],
             candidate: Sequence[tuple[str, Any]]) -> None:
    """Refuse outcome lists that do not name the same ids in the same order."""
    base_ids = [item[0] for item in baseline]
    cand_ids = [item[0] for item in candidate]
    for label, ids in (("baseline", base_ids), ("candidate", cand_ids)):
        if len(set(ids)) != len(ids):
            repeated = next(i for i in ids if ids.count(i) > 1)
            raise InvalidInput(f"{what}: {label} names id {repeated} more than once")
    if base_ids == cand_ids:
        return
    if set(base_ids) == set(cand_ids):
        pairs = zip(base_ids, cand_ids, strict=True)
        position = next(i for i, (a, b) in enumerate(pairs) if a != b)
        raise InvalidInput(f"{what}: same ids in a different order (first at position {position}: "
                           f"baseline {base_ids[position]}, candidate {cand_ids[position]})")
    only_base = sorted(set(base_ids) - set(cand_ids))
    only_cand = sorted(set(cand_ids) - set(base_ids))
    raise InvalidInput(f"{what}: the id lists differ ({len(base_ids)} baseline, {len(cand_ids)} "
                       f"candidate; only in baseline: {only_base[:3]}, only in candidate: "
                       f"{only_cand[:3]})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """A candidate's task outcomes against a baseline's on the same ids."""

    documents: int
    baseline_correct: int
    candidate_correct: int
    wins: int
    """Baseline wrong, candidate right."""
    losses: int
    """Baseline right, candidate wrong."""
    gain: Fraction
    """(wins - losses) / documents."""
    test: McNemar

    @property
    def gain_points(self) -> float:
        """The gain in percentage points (146/256 gives 57.03125)."""
        return float(self.gain * 100)

    def to_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "baseline_correct": self.baseline_correct,
                "candidate_correct": self.candidate_correct, "wins": self.wins,
                "losses": self.losses, "gain": float(self.gain),
                "gain_exact": f"{self.gain.numerator}/{self.gain.denominator}",
                "p": self.test.p_float,
                "p_exact": f"{self.test.p.numerator}/{self.test.p.denominator}"}


def paired(baseline: Sequence[tuple[str, bool]], candidate: Sequence[tuple[str, bool]]) -> Paired:
    """Compare aligned ``(task_id, correct)`` lists; the ids must match in order."""
    baseline, candidate = list(baseline), list(candidate)
    _aligned("paired comparison", baseline, candidate)
    if not baseline:
        raise InvalidInput("paired comparison: no documents, so no accuracy gain is defined")
    for label, outcomes in (("baseline", baseline), ("candidate", candidate)):
        for task_id, correct in outcomes:
            if not isinstance(correct, bool):
                raise InvalidInput(f"paired comparison: {label} outcome of {task_id} is "
                                   f"{correct!r}, not true or false")
    wins = sum(1 for (_, b), (_, c) in zip(baseline, candidate, strict=True) if c and not b)
    losses = sum(1 for (_, b), (_, c) in zip(baseline, candidate, strict=True) if b and not c)
    return Paired(documents=len(baseline), baseline_correct=sum(c for _, c in baseline),
                  candidate_correct=sum(c for _, c in candidate), wins=wins, losses=losses,
                  gain=Fraction(wins - losses, len(baseline)),
                  test=mcnemar_one_sided(wins, losses))


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """Per-probe loss change (candidate - baseline, nats per labelled token) summarised."""

    n: int
    mean: float
    se: float | None
    """Sample standard deviation / sqrt(n); ``None`` when n < 2 (no spread to estimate)."""
    upper: float | None
    """mean + 2.576 * se; ``None`` when n < 2, which fails the contract."""
    improved: int
    """Probes whose loss went down."""
    worsened: int
    """Probes whose loss went up."""

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "se": self.se, "upper": self.upper,
                "improved": self.improved, "worsened": self.worsened}


def retention(baseline: Sequence[tuple[str, float]],
              candidate: Sequence[tuple[str, float]]) -> Retention:
    """Summarise aligned ``(probe_id, mean loss per labelled token)`` lists."""
    baseline, candidate = list(baseline), list(candidate)
    _aligned("retention", baseline, candidate)
    if not baseline:
        raise InvalidInput("retention: no probes")
    for label, losses in (("baseline", baseline), ("candidate", candidate)):
        for probe_id, loss in losses:
            number = isinstance(loss, int | float) and not isinstance(loss, bool)
            if not number or not math.isfinite(loss):
                raise InvalidInput(f"retention: {label} loss of {probe_id} is {loss!r}, "
                                   "not a finite number")
    changes = [c - b for (_, b), (_, c) in zip(baseline, candidate, strict=True)]
    mean = math.fsum(changes) / len(changes)
    se = upper = None
    if len(changes) >= 2:
        se = statistics.stdev(changes) / math.sqrt(len(changes))
        upper = mean + Z_99 * se
    return Retention(n=len(changes), mean=mean, se=se, upper=upper,
                     improved=sum(1 for d in changes if d < 0),
                     worsened=sum(1 for d in changes if d > 0))


def _compare(name: str, value: Fraction | float | int, limit: Fraction, at_least: bool) -> bool:
    """Fractions compare exactly with the decimal limit; floats with the limit's float, so
    that a float equal to the written limit (0.02) passes instead of losing to its rounding."""
    if isinstance(value, Fraction | int) and not isinstance(value, bool):
        bound: Fraction | float = limit
    elif isinstance(value, float) and math.isfinite(value):
        bound = float(limit)
    else:
        raise InvalidInput(f"contract: {name} must be a finite number, got {value!r}")
    return value >= bound if at_least else value <= bound


def contract(gain: Fraction | float, p: Fraction | float, upper: float | None) -> dict[str, Any]:
    """The three published conditions, each with its value, limit and verdict."""
    gain_ok = _compare("gain", gain, GAIN_MIN, at_least=True)
    p_ok = _compare("p", p, P_MAX, at_least=False)
    # No upper bound (fewer than two probes) means retention is not shown: a failure.
    upper_ok = upper is not None and _compare("retention upper", upper, RETENTION_UPPER_MAX,
                                              at_least=False)
    conditions = {
        "gain": {"value": float(gain), "at_least": float(GAIN_MIN), "passed": gain_ok},
        "p": {"value": float(p), "at_most": float(P_MAX), "passed": p_ok},
        "retention_upper": {"value": upper, "at_most": float(RETENTION_UPPER_MAX),
                            "passed": upper_ok},
    }
    return {**conditions, "passed": gain_ok and p_ok and upper_ok}
