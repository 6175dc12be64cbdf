"""Exact statistics of docs/experiment.md §4, checked against hand-derived values."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import pytest

from nscas.verifiers.core.errors import InvalidArgument
from nscas.verifiers.evaluation.stats import (
    accuracy_gain,
    mcnemar_p,
    meets_contract,
    paired_comparison,
    retention,
)


def test_mcnemar_published_example_is_exact() -> None:
    # 10 wins, 2 losses: (C(12,10) + C(12,11) + C(12,12)) / 2^12 = (66 + 12 + 1) / 4096.
    assert mcnemar_p(10, 2) == Fraction(79, 4096)


def test_mcnemar_no_discordant_pairs_is_one() -> None:
    assert mcnemar_p(0, 0) == 1


def test_mcnemar_all_wins_is_two_to_minus_n() -> None:
    p = mcnemar_p(146, 0)
    assert p == Fraction(1, 2**146)
    assert float(p) == pytest.approx(1.12e-44, rel=1e-3)


def test_mcnemar_27_10() -> None:
    p = mcnemar_p(27, 10)
    assert p == Fraction(sum(math.comb(37, k) for k in range(27, 38)), 2**37)
    assert float(p) == pytest.approx(0.00382, abs=5e-6)


def test_mcnemar_all_losses_is_one() -> None:
    assert mcnemar_p(0, 5) == 1


@pytest.mark.parametrize("wins,losses", [(-1, 0), (0, -1), (1.0, 0), (True, 0)])
def test_mcnemar_rejects_bad_counts(wins, losses) -> None:
    with pytest.raises(InvalidArgument):
        mcnemar_p(wins, losses)


def test_paired_comparison_counts_and_gain() -> None:
    baseline = {"a": False, "b": False, "c": True, "d": True, "e": False}
    candidate = {"a": True, "b": True, "c": False, "d": True, "e": False}
    result = paired_comparison(baseline, candidate)
    assert (result.wins, result.losses, result.n, result.documents) == (2, 1, 3, 5)
    assert result.gain == Fraction(1, 5)
    assert result.p == Fraction(3 + 1, 8)


def test_paired_comparison_needs_same_tasks() -> None:
    with pytest.raises(InvalidArgument, match="different tasks"):
        paired_comparison({"a": True}, {"b": True})


def test_accuracy_gain_exact() -> None:
    assert accuracy_gain(146, 0, 256) == Fraction(146, 256)
    with pytest.raises(InvalidArgument):
        accuracy_gain(3, 3, 5)


def test_retention_summary() -> None:
    base = [2.0, 2.0, 2.0, 2.0]
    cand = [2.1, 1.9, 2.3, 2.0]
    r = retention(base, cand)
    changes = [0.1, -0.1, 0.3, 0.0]
    assert r.n == 4
    assert r.mean == pytest.approx(0.075, abs=1e-12)
    se = statistics.stdev(changes) / 2
    assert r.se == pytest.approx(se, rel=1e-12)
    assert r.upper == pytest.approx(0.075 + 2.576 * se, rel=1e-12)
    assert (r.improved, r.worsened) == (1, 2)


def test_retention_pairs_by_probe_id() -> None:
    r = retention({"x": 1.0, "y": 3.0}, {"y": 2.0, "x": 2.0})
    assert (r.improved, r.worsened, r.mean) == (1, 1, 0.0)


def test_retention_needs_two_probes() -> None:
    with pytest.raises(InvalidArgument):
        retention([1.0], [1.0])


def test_contract_thresholds_are_inclusive() -> None:
    assert meets_contract(gain=Fraction(1, 20), p=Fraction(1, 100), retention_upper=0.02)
    assert meets_contract(gain=0.05, p=0.01, retention_upper=Fraction(1, 50))
    assert not meets_contract(gain=Fraction(12, 256), p=0.001, retention_upper=0.0)
    assert not meets_contract(gain=0.5, p=0.0101, retention_upper=0.0)
    assert not meets_contract(gain=0.5, p=0.001, retention_upper=0.0201)
