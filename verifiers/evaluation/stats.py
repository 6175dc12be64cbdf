"""The statistics of docs/experiment.md §4, recomputed exactly where they can be.

McNemar's one-sided exact (sign) test is computed with integers and returns a ``Fraction``:
``p = sum_{k=wins..n} C(n, k) / 2^n`` with ``n = wins + losses`` and ``p = 1`` when ``n = 0``.
Retention uses the sample standard deviation (``n - 1``) of per-probe changes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from ..core.errors import InvalidArgument

RETENTION_Z = 2.576
"""The normal quantile used for the retention upper bound (one-sided 99.5 %)."""
# Decimal thresholds as exact fractions: a gain of 1/20 must pass, which the binary float
# 0.05 (slightly above 1/20) would refuse.
CONTRACT_MIN_GAIN = Fraction("0.05")
CONTRACT_MAX_P = Fraction("0.01")
CONTRACT_MAX_RETENTION_UPPER = Fraction("0.02")


def _count(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgument(name, f"expected a non-negative integer, found {value!r}")
    return value


def mcnemar_p(wins: int, losses: int) -> Fraction:
    """Exact one-sided p-value that the candidate is no better than the baseline."""
    _count("wins", wins)
    _count("losses", losses)
    n = wins + losses
    if n == 0:
        return Fraction(1)
    return Fraction(sum(math.comb(n, k) for k in range(wins, n + 1)), 2**n)


def accuracy_gain(wins: int, losses: int, documents: int) -> Fraction:
    """``(wins - losses) / documents``, exactly."""
    _count("documents", documents)
    if documents == 0:
        raise InvalidArgument("documents", "cannot compute a gain over zero documents")
    if _count("wins", wins) + _count("losses", losses) > documents:
        raise InvalidArgument("wins/losses", f"{wins} + {losses} exceeds {documents} documents")
    return Fraction(wins - losses, documents)


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """A paired comparison of a candidate evaluation with a baseline on the same tasks."""

    documents: int
    """Tasks compared (the shared task ids)."""
    wins: int
    """Baseline wrong, candidate right."""
    losses: int
    """Baseline right, candidate wrong."""
    p: Fraction
    """Exact one-sided McNemar p-value."""
    gain: Fraction
    """Accuracy gain, ``(wins - losses) / documents``."""

    @property
    def n(self) -> int:
        return self.wins + self.losses


def paired_comparison(baseline: Mapping[str, bool], candidate: Mapping[str, bool]) -> Paired:
    """Compare per-task correctness keyed by task id; both must cover the same task ids."""
    if baseline.keys() != candidate.keys():
        only_base = sorted(set(baseline) - set(candidate))[:3]
        only_cand = sorted(set(candidate) - set(baseline))[:3]
        raise InvalidArgument("paired task ids", f"the evaluations cover different tasks "
                              f"(only baseline: {only_base}, only candidate: {only_cand})")
    wins = sum(1 for t in baseline if not baseline[t] and candidate[t])
    losses = sum(1 for t in baseline if baseline[t] and not candidate[t])
    documents = len(baseline)
    return Paired(documents=documents, wins=wins, losses=losses, p=mcnemar_p(wins, losses),
                  gain=accuracy_gain(wins, losses, documents))


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """Summary of per-probe loss changes (candidate - baseline); lower loss is better."""

    n: int
    """Number of probes."""
    mean: float
    """Mean change."""
    se: float
    """Sample standard deviation of the changes divided by sqrt(n)."""
    upper: float
    """``mean + 2.576 * se``."""
    improved: int
    """Probes whose loss went down."""
    worsened: int
    """Probes whose loss went up."""


def retention(baseline: Sequence[float] | Mapping[str, float],
              candidate: Sequence[float] | Mapping[str, float]) -> Retention:
    """Retention summary from per-probe mean losses, paired by position or by probe id."""
    if isinstance(baseline, Mapping) or isinstance(candidate, Mapping):
        if not (isinstance(baseline, Mapping) and isinstance(candidate, Mapping)):
            raise InvalidArgument("retention losses", "pass two mappings or two sequences")
        if baseline.keys() != candidate.keys():
            raise InvalidArgument("retention probes", "the evaluations cover different probes")
        keys = sorted(baseline)
        base = [baseline[k] for k in keys]
        cand = [candidate[k] for k in keys]
    else:
        base, cand = list(baseline), list(candidate)
        if len(base) != len(cand):
            raise InvalidArgument("retention losses", f"{len(base)} baseline vs {len(cand)} "
                                  "candidate probes")
    if len(base) < 2:
        raise InvalidArgument("retention probes", "a sample standard deviation needs 2 probes")
    changes = [float(c) - float(b) for b, c in zip(base, cand, strict=True)]
    if not all(math.isfinite(x) for x in changes):
        raise InvalidArgument("retention losses", "losses must be finite")
    mean = statistics.fmean(changes)
    se = statistics.stdev(changes) / math.sqrt(len(changes))
    return Retention(n=len(changes), mean=mean, se=se, upper=mean + RETENTION_Z * se,
                     improved=sum(1 for x in changes if x < 0),
                     worsened=sum(1 for x in changes if x > 0))


def _at_most(value: float | Fraction, limit: Fraction) -> bool:
    # Floats meet floats, exact values meet exact values: the float 0.02 is a little above
    # 1/50, and a float upper bound of 0.02 must still pass a limit written as 0.02.
    return value <= (float(limit) if isinstance(value, float) else limit)


def meets_contract(*, gain: float | Fraction, p: float | Fraction,
                   retention_upper: float | Fraction) -> bool:
    """The published learning contract: gain >= 0.05, p <= 0.01, retention upper <= 0.02."""
    return (_at_most(-gain, -CONTRACT_MIN_GAIN) and _at_most(p, CONTRACT_MAX_P)
            and _at_most(retention_upper, CONTRACT_MAX_RETENTION_UPPER))
