"""Paired statistics of docs/experiment.md §4, against hand computations and the published figures."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from nscas.errors import InvalidInput
from nscas.models.paired import contract, mcnemar_one_sided, paired, retention


def test_mcnemar_worked_example() -> None:
    # C(12,10) + C(12,11) + C(12,12) = 66 + 12 + 1 = 79 over 2^12.
    result = mcnemar_one_sided(10, 2)
    assert result.p == Fraction(79, 4096)
    assert result.n == 12 and result.p_float == 79 / 4096


def test_mcnemar_edges() -> None:
    assert mcnemar_one_sided(0, 0).p == 1
    assert mcnemar_one_sided(0, 5).p == 1  # every tail includes k = 0
    assert mcnemar_one_sided(5, 5).p == Fraction(638, 1024)  # (252+210+120+45+10+1) / 2^10
    for n in (1, 2, 7, 30, 146):
        assert mcnemar_one_sided(n, 0).p == Fraction(1, 2**n)
    assert mcnemar_one_sided(1, 1).p == Fraction(3, 4)


def test_mcnemar_published_figures() -> None:
    assert mcnemar_one_sided(146, 0).p_float == pytest.approx(1.12e-44, rel=1e-3)
    clean_vs_damaged = mcnemar_one_sided(27, 10)
    assert round(clean_vs_damaged.p_float, 5) == 0.00382
    assert clean_vs_damaged.p == Fraction(sum(math.comb(37, k) for k in range(27, 38)), 2**37)


@pytest.mark.parametrize(("wins", "losses"), [(-1, 0), (0, -2), (True, 0), (1.0, 0)])
def test_mcnemar_refuses_bad_counts(wins: object, losses: object) -> None:
    with pytest.raises(InvalidInput, match="McNemar"):
        mcnemar_one_sided(wins, losses)  # type: ignore[arg-type]


def _outcomes(correct: list[bool]) -> list[tuple[str, bool]]:
    return [(f"t{i:03d}", c) for i, c in enumerate(correct)]


def test_paired_published_primary_comparison() -> None:
    # The seed had 23/256 right; clean-single kept all of them and gained 146 more.
    seed = _outcomes([True] * 23 + [False] * 233)
    clean = _outcomes([True] * 169 + [False] * 87)
    result = paired(seed, clean)
    assert (result.wins, result.losses, result.documents) == (146, 0, 256)
    assert (result.baseline_correct, result.candidate_correct) == (23, 169)
    assert result.gain == Fraction(146, 256)
    assert round(result.gain_points, 2) == 57.03
    assert result.test.p == Fraction(1, 2**146)
    record = result.to_dict()
    assert record["gain_exact"] == "73/128" and record["p_exact"] == f"1/{2**146}"


def test_paired_counts_both_directions() -> None:
    base = _outcomes([True, True, False, False, True])
    cand = _outcomes([True, False, True, True, False])
    result = paired(base, cand)
    assert (result.wins, result.losses) == (2, 2)
    assert result.gain == 0 and result.test.p == Fraction(11, 16)


def test_paired_alignment_errors() -> None:
    base = _outcomes([True, False, True])
    with pytest.raises(InvalidInput, match=r"different order .* position 0"):
        paired(base, [base[1], base[0], base[2]])
    with pytest.raises(InvalidInput, match="id lists differ"):
        paired(base, base[:2])
    with pytest.raises(InvalidInput, match="only in candidate: \\['x'\\]"):
        paired(base, [*base[:2], ("x", True)])
    with pytest.raises(InvalidInput, match="more than once"):
        paired([*base, base[0]], [*base, base[0]])
    with pytest.raises(InvalidInput, match="no documents"):
        paired([], [])
    with pytest.raises(InvalidInput, match="not true or false"):
        paired(base, [("t000", 1), base[1], base[2]])


def test_retention_hand_computed() -> None:
    base = [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    cand = [("a", 1.5), ("b", 1.5), ("c", 3.5)]
    # changes +0.5, -0.5, +0.5: mean 1/6; sample variance (1/9 + 4/9 + 1/9) / 2 = 1/3;
    # SE = sqrt(1/3) / sqrt(3) = 1/3; upper = 1/6 + 2.576 / 3.
    result = retention(base, cand)
    assert result.n == 3
    assert result.mean == pytest.approx(1 / 6, abs=1e-15)
    assert result.se == pytest.approx(1 / 3, abs=1e-15)
    assert result.upper == pytest.approx(1 / 6 + 2.576 / 3, abs=1e-15)
    assert (result.improved, result.worsened) == (1, 2)


def test_retention_two_probes_and_ties() -> None:
    result = retention([("a", 2.0), ("b", 2.0), ("c", 1.0)], [("a", 1.0), ("b", 1.0), ("c", 1.0)])
    # changes -1, -1, 0: mean -2/3, variance (1/9 + 1/9 + 4/9) / 2 = 1/3, SE = 1/3.
    assert result.mean == pytest.approx(-2 / 3, abs=1e-15)
    assert result.se == pytest.approx(1 / 3, abs=1e-15)
    assert (result.improved, result.worsened) == (2, 0)
    flat = retention([("a", 1.0), ("b", 2.0)], [("a", 1.0), ("b", 2.0)])
    assert (flat.mean, flat.se, flat.upper, flat.improved, flat.worsened) == (0, 0, 0, 0, 0)


def test_retention_small_and_bad_inputs() -> None:
    single = retention([("a", 1.0)], [("a", 0.75)])
    assert (single.n, single.mean, single.se, single.upper) == (1, -0.25, None, None)
    assert single.to_dict()["upper"] is None
    with pytest.raises(InvalidInput, match="no probes"):
        retention([], [])
    with pytest.raises(InvalidInput, match="not a finite number"):
        retention([("a", 1.0), ("b", 1.0)], [("a", float("nan")), ("b", 1.0)])
    with pytest.raises(InvalidInput, match=r"retention: .*different order"):
        retention([("a", 1.0), ("b", 1.0)], [("b", 1.0), ("a", 1.0)])


def test_contract_published_pass() -> None:
    verdict = contract(Fraction(146, 256), Fraction(1, 2**146), 0.006656)
    assert verdict["passed"] is True
    assert verdict["gain"] == {"value": 0.5703125, "at_least": 0.05, "passed": True}
    assert verdict["retention_upper"]["passed"] is True


def test_contract_boundaries() -> None:
    assert contract(Fraction(1, 20), Fraction(1, 100), 0.02)["passed"] is True
    assert contract(0.05, 0.01, 0.02)["passed"] is True  # floats equal to the written limits
    assert contract(Fraction(12, 256), Fraction(1, 100), 0.0)["gain"]["passed"] is False
    assert contract(Fraction(1, 2), Fraction(101, 10000), 0.0)["p"]["passed"] is False
    assert contract(Fraction(1, 2), Fraction(1, 2**10), 0.0201)["passed"] is False
    no_upper = contract(Fraction(1, 2), Fraction(1, 2**10), None)
    assert no_upper["retention_upper"] == {"value": None, "at_most": 0.02, "passed": False}
    assert no_upper["passed"] is False
    with pytest.raises(InvalidInput, match="gain"):
        contract("0.5", Fraction(1, 2), 0.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="retention upper"):
        contract(Fraction(1, 2), Fraction(1, 2), float("inf"))
