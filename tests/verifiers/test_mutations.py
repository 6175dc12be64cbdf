"""Mutation tests by class (tests/verifiers/mutations.py): every layout operation and every
JSON member edit of the demo bundle must make ``verify --strict`` fail naming the path, while
the honest bundle passes.

Cases run in-process through ``verify`` (a few through the real command), several of one
operation on disjoint files at a time; a case whose path the batch's findings do not name is
run again on its own, and must be named then. By default one file of each kind (top folder
and extension) gets every operation, and the JSON edits are of every member of the manifest
and of one member of each JSON type in a trained model's configuration files;
``NSCAS_MUTATIONS=all`` gives every file every one (docs/verify.md has the numbers of both).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nscas.verifiers.core.errors import VerifierError
from nscas.verifiers.verify import verify
from tests.verifiers.conftest import Demo, nscas_verify
from tests.verifiers.mutations import (
    Case,
    batches,
    files_of,
    json_cases,
    layout_cases,
    run_batch,
)

BATCH = 6
EVERY_FILE = os.environ.get("NSCAS_MUTATIONS") == "all"


@dataclass(slots=True)
class Tally:
    cases: int = 0
    verifications: int = 0
    findings: int = 0
    """Failed checks (or refusals) over all verifications."""
    missed: list[str] = field(default_factory=list)
    by_op: dict[str, int] = field(default_factory=dict)


def _verdict(root: Path) -> tuple[bool, str, int]:
    """(ok, every failed check's name and message, how many failed) of ``verify --strict``."""
    try:
        report = verify(str(root), strict=True)
    except VerifierError as exc:  # a refusal (exit 2/3) is a failure; its line names the file
        return False, exc.message, 1
    failed = [c for c in report.checks if c.status == "failed" or c in report.failures]
    return report.ok, "\n".join(f"{c.name}: {c.message}" for c in failed), len(failed)


def _run(bundle: Path, cases: list[Case], work: Path, tally: Tally) -> str:
    root, outside = work / "bundle", work / "outside"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(bundle, root)
    outside.mkdir()
    run_batch(cases, root, outside)
    ok, text, count = _verdict(root)
    tally.verifications += 1
    tally.findings += count
    return "" if ok else text


def check_all(bundle: Path, cases: list[Case], work: Path) -> Tally:
    tally = Tally(cases=len(cases))
    for group in batches(cases, BATCH):
        text = _run(bundle, group, work, tally)
        for case in group:
            tally.by_op[case.op] = tally.by_op.get(case.op, 0) + 1
            if any(n in text for n in case.named):
                continue
            alone = _run(bundle, [case], work, tally) if len(group) > 1 else text
            if not any(n in alone for n in case.named):
                tally.missed.append(f"{case.id}: {alone[:300] or 'verify --strict passed'}")
    shutil.rmtree(work, ignore_errors=True)
    return tally


def by_class(bundle: Path, cases: list[Case]) -> list[Case]:
    """One file of each kind (top folder, extension) and every reserved file."""
    if EVERY_FILE:
        return cases
    first: dict[tuple[str, str], str] = {}
    for path in files_of(bundle):
        head = path.split("/")[0] if "/" in path else path
        first.setdefault((head, Path(path).suffix), path)
    keep = set(first.values())
    return [c for c in cases if c.path.partition("#")[0] in keep]


def by_type(bundle: Path, cases: list[Case]) -> list[Case]:
    """Every member of the manifest, which the verifier reads member by member; of a trained
    model's configuration files, whose bytes its records pin whole, one member of each JSON
    type (an edit is chosen by the value's type: a bool flipped, a number incremented ...)."""
    if EVERY_FILE:
        return cases
    kept: list[Case] = []
    seen: set[tuple[str, str, str]] = set()
    for case in cases:
        file, _, member = case.path.partition("#")
        if file == "manifest.json":
            kept.append(case)
        elif file.startswith("models/clean-single/"):
            value = json.loads((bundle / file).read_bytes())[member]
            if (file, case.op, type(value).__name__) not in seen:
                seen.add((file, case.op, type(value).__name__))
                kept.append(case)
    return kept


def _report(name: str, tally: Tally) -> None:
    print(f"\n{name}: {tally.cases} cases, {tally.verifications} verifications, "
          f"{tally.findings} failed checks; by operation: {json.dumps(tally.by_op)}")


def test_the_honest_demo_bundle_passes_strict(demo: Demo) -> None:
    ok, text, _ = _verdict(demo.bundle)
    assert ok, text


def test_every_layout_operation_is_named(demo: Demo, tmp_path: Path) -> None:
    cases = by_class(demo.bundle, list(layout_cases(demo.bundle)))
    ops = {c.op for c in cases}
    assert ops >= {"delete", "duplicate", "rename-case", "case-twin", "swap", "hard-link",
                   "symlink", "unknown-file", "crlf", "reorder"}
    assert any(c.resealed for c in cases)
    tally = check_all(demo.bundle, cases, tmp_path / "work")
    _report("layout", tally)
    assert not tally.missed, "\n".join(tally.missed[:20])


def test_every_json_member_a_reader_sees_is_named(demo: Demo, tmp_path: Path) -> None:
    cases = by_type(demo.bundle, list(json_cases(demo.bundle)))
    assert {c.op for c in cases} == {"json-change", "json-duplicate", "json-drop"}
    assert any(c.path.startswith("manifest.json#") for c in cases)
    assert any(c.path.startswith("models/clean-single/config.json#") for c in cases)
    tally = check_all(demo.bundle, cases, tmp_path / "work")
    _report("json", tally)
    assert not tally.missed, "\n".join(tally.missed[:20])


@pytest.mark.parametrize("op", ["swap", "case-twin", "hard-link"])
def test_the_real_command_names_the_path(demo: Demo, tmp_path: Path, op: str) -> None:
    """A few cases through ``nscas verify --strict`` itself: exit 1, the path in the output."""
    weights = "models/clean-single/model.safetensors"
    (case,) = [c for c in layout_cases(demo.bundle) if c.op == op and c.path == weights
               and c.resealed == (op == "swap")]
    root, outside = tmp_path / "bundle", tmp_path / "outside"
    shutil.copytree(demo.bundle, root)
    outside.mkdir()
    run_batch([case], root, outside)
    verdict = nscas_verify(root, "--strict", "--expect", demo.report)
    assert verdict.code == 1, verdict.stdout[-2000:]
    assert any(n in verdict.stdout for n in case.named), verdict.stdout[-2000:]
