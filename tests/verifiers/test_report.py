"""The report model and the claimed-versus-recomputed comparison."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from nscas.verifiers.core.compare import compare, differences
from nscas.verifiers.core.errors import InvalidArgument
from nscas.verifiers.core.results import Check, Report


def test_report_json_shape() -> None:
    target = "blake3:" + "ab" * 32
    report = Report.of([
        Check.passed("a", claimed=1, recomputed=1),
        Check.failed("b", "differs", claimed=Fraction(1, 4), recomputed=(1, 2)),
        Check.skipped("c", "no model run", needs="model"),
    ], target=target, self_reported=("receipts: started, finished",))
    data = json.loads(report.to_json())
    assert list(data) == ["target", "named", "ok", "strict", "summary", "not_rechecked",
                          "self_reported", "signers", "checks"]
    assert data["target"] == target and data["ok"] is False
    assert data["not_rechecked"] == {"weights": [], "model": ["c"]}
    assert data["self_reported"] == ["receipts: started, finished"]
    assert [list(c) for c in data["checks"]] == [
        ["name", "status", "claimed", "recomputed", "message", "needs"]] * 3
    assert data["checks"][1] == {"name": "b", "status": "failed", "claimed": 0.25,
                                 "recomputed": [1, 2], "message": "differs", "needs": None}
    assert data["checks"][2] == {"name": "c", "status": "skipped", "claimed": None,
                                 "recomputed": None, "message": "no model run", "needs": "model"}
    assert report.summary() == "FAILED: 3 checks, 1 passed, 1 failed, 1 not rechecked"
    assert report.notes() == ["not rechecked (needs a model run): c",
                              "self-reported, trusted only as far as the pinned ID or a "
                              "signature: receipts: started, finished"]


def test_receipts_signed_alike_are_one_note_with_their_count() -> None:
    key, other = "k" * 64, "o" * 64
    signers = tuple(f"receipt blake3:{i:064x}: signed by key {key} (an untrusted key)"
                    for i in range(22))
    signers += (f"receipt blake3:{99:064x}: signed by key {other} (trusted key a.pub)",)
    report = Report.of([Check.passed("a")], signers=signers)
    assert report.notes() == [
        f"self-reported facts of 22 receipts: each signed by key {key} (an untrusted key)",
        f"self-reported facts of receipt blake3:{99:064x}: signed by key {other} "
        "(trusted key a.pub)"]
    assert json.loads(report.to_json())["signers"] == list(signers)  # every one, for programs


def test_ok_and_strict() -> None:
    lenient = Report.of([Check.passed("a"), Check.skipped("b", "why", needs="weights"),
                         Check.skipped("m", "why", needs="model")])
    assert lenient.ok
    strict = Report.of(lenient.checks, strict=True)
    # Strict fails for omitted weights, never for what only a model run can recheck.
    assert not strict.ok and [c.name for c in strict.failures] == ["b"]
    assert Report.of([Check.skipped("m", "why", needs="model")], strict=True).ok
    assert Report().ok
    grown = lenient.with_checks([Check.failed("c", "bad")])
    assert not grown.ok and lenient.ok and len(grown.checks) == 4


@pytest.mark.parametrize("needs", [None, "", "network", "weights "])
def test_a_skip_must_name_weights_or_a_model_run(needs) -> None:
    with pytest.raises(InvalidArgument):
        Check(name="x", status="skipped", needs=needs)
    with pytest.raises(InvalidArgument):
        Check(name="x", status="failed", needs="weights")


def test_non_finite_values_still_serialise() -> None:
    text = Report.of([Check.failed("x", "nan", recomputed=float("nan"))]).to_json()
    assert json.loads(text)["checks"][0]["recomputed"] == "nan"


def test_check_validates_status_and_verdict() -> None:
    with pytest.raises(InvalidArgument):
        Check(name="x", status="ok")
    assert Check.verdict("x", True, message="ignored").message == ""
    assert Check.verdict("x", False, message="why").status == "failed"


@pytest.mark.parametrize("claimed,recomputed,equal", [
    (3, 3, True),
    (3, 4, False),
    (10**18, 10**18 + 1, False),  # ints compare exactly, no float rounding
    (2, 2.0, True),  # RFC 8785 writes 2.0 as 2
    (0.1 + 0.2, 0.3, True),
    (1.0, 1.0 + 1e-8, False),
    (1e-13, 0.0, True),  # absolute tolerance
    (0.00382, Fraction(79, 4096), False),
    (79 / 4096, Fraction(79, 4096), True),
    (True, 1, False),
    (False, 0.0, False),
    (None, 0, False),
    ("a", "a", True),
    ([1, 2], [1, 2], True),
    ([1, 2], [2, 1], False),
    ([1], [1, 1], False),
    ({"a": 1.0, "b": [True]}, {"b": [True], "a": 1}, False),  # a recomputed int is a count
    ({"a": 1, "b": [True]}, {"b": [True], "a": 1}, True),
    (1.0000000001, 1, False),  # a count is an integer, exactly
    (1e-12, 0, False),
])
def test_compare_rules(claimed, recomputed, equal) -> None:
    check = compare("c", claimed, recomputed)
    assert (check.status == "passed") == equal, check.message
    assert check.claimed == claimed and check.recomputed == recomputed


def test_compare_reports_every_difference() -> None:
    found = differences({"a": 1, "b": {"c": [1, 2]}, "x": 0},
                        {"a": 2, "b": {"c": [1, 3]}, "y": 0})
    assert found == [
        "$: claimed lacks keys ['y']",
        "$: claimed has extra keys ['x']",
        "$.a: claimed 1, recomputed 2",
        "$.b.c[1]: claimed 2, recomputed 3",
    ]
    assert compare("c", 1.0, 1.5, rel_tol=0.5).status == "passed"


def test_a_key_that_signed_many_receipts_is_named_once_with_a_count() -> None:
    ids = ["receipt blake3:" + c * 64 for c in "abc"]
    lines = [f"{ids[0]}: signed by key k1 (an untrusted key)",
             f"{ids[1]}: signed by key k1 (an untrusted key)",
             f"{ids[2]}: signed by key k2 (trusted key alice.pub)"]
    report = Report.of([], signers=tuple(lines))
    assert [n for n in report.notes() if n.startswith("self-reported facts")] == [
        "self-reported facts of 2 receipts: each signed by key k1 (an untrusted key)",
        f"self-reported facts of {ids[2]}: signed by key k2 (trusted key alice.pub)"]
    assert json.loads(report.to_json())["signers"] == lines  # every receipt, exactly
