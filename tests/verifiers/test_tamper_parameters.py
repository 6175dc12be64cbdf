"""The tamperer against the report's parameter comparison (issue 24), in consistently
rewritten bundles: every hash, link and checksum holds.

Two arms' weights exchanged (each checkpoint's files tree now names the other arm's
safetensors file) is caught by the recomputed distances, which the verifiers read from the
weight files themselves; the same bundle without weights lists the distances as not
rechecked (skipped, needing weights), never as passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import Demo, verify_here
from .test_tamper_classes import caught, integrity_holds, label, rewrite

REPORT = "report/report.json"


def test_weights_swapped_between_two_arms_are_caught(demo: Demo, tmp_path: Path) -> None:
    """Each trained checkpoint's ``files`` (the tree holding its safetensors) is the other
    arm's; the two trees differ only in their weights, so the weights are exchanged."""
    r = rewrite(demo, tmp_path)
    report = r.json(r.find(REPORT))
    models = {arm: report["learning"]["arms"][arm]["model"]
              for arm in ("clean-single", "clean-pair")}
    files = {arm: r.json(r.path_of(oid))["files"] for arm, oid in models.items()}
    assert files["clean-single"] != files["clean-pair"]
    for arm, other in (("clean-single", "clean-pair"), ("clean-pair", "clean-single")):
        def swap(record: dict[str, Any], other: str = other) -> None:
            record["files"] = files[other]
        r.edit_record(r.path_of(models[arm]), swap)
    v = verify_here(r.seal())
    integrity_holds(v)
    name = label("report", r.target)
    failed = caught(v, f"{name}.json.parameters.pairs[")
    # Every pair with one swapped arm is recomputed from the other arm's weights (the pair of
    # the two swapped arms keeps its difference and changes only its reference norm).
    assert {f"{name}.json.parameters.pairs[{i}].relative_l2"
            for i, p in enumerate(report["parameters"]["pairs"])
            if p["relative_l2"] and {p["candidate"], p["baseline"]} != set(models)} <= failed
    assert f"{name}.weights" in failed  # and the digests no longer match the files


def test_without_weights_the_distances_are_not_rechecked(demo: Demo, tmp_path: Path) -> None:
    r = rewrite(demo, tmp_path, light=True)

    def forge(report: dict[str, Any]) -> None:
        report["parameters"]["pairs"][0]["relative_l2"] *= 2

    r.edit_json(r.find(REPORT), forge)
    v = verify_here(r.seal())
    integrity_holds(v)
    name = label("report", r.target)
    check = v.check(f"{name}.json.parameters")
    assert check["status"] == "skipped" and check["needs"] == "weights", check
    # What the reader sees must still be report.json's: the figure no longer is.
    assert f"{name}.json.figures.parameters.panels[0].values[0]" in v.failed()
    honest_light = verify_here(demo.light)
    check = honest_light.check(f"report.{demo.report[7:15]}.json.parameters")
    assert check["status"] == "skipped" and check["needs"] == "weights"
    assert honest_light.code == 0
