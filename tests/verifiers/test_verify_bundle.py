"""``verify DIR`` on export bundles: offline, no store, every file re-hashed; tampered bundles
fail naming the check; a bundle without weights reports what it could not check as skipped."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from nscas.bundle.exporting import export_bundle
from nscas.objects.digests import Digest
from nscas.verifiers.core.results import Report
from nscas.verifiers.verify import exit_code, verify

from .conftest import Pipeline


@pytest.fixture(scope="module")
def bundles(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    target = Digest.parse(pipeline.receipt("eval-again"))
    export_bundle(pipeline.store, target, root / "full")
    export_bundle(pipeline.store, target, root / "light", weights=False)
    return {"full": root / "full", "light": root / "light"}


def statuses(report: Report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def failed(report: Report) -> set[str]:
    return {c.name for c in report.checks if c.status == "failed"}


def copy(bundle: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "bundle"
    shutil.copytree(bundle, dest)
    return dest


def test_a_full_bundle_verifies_offline(bundles: dict[str, Path], pipeline: Pipeline,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSCAS_STORE", raising=False)
    monkeypatch.setenv("NSCAS_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no store here or above
    report = verify(str(bundles["full"]))
    assert report.ok and exit_code(report) == 0, [c for c in report.failures]
    seen = statuses(report)
    for name in ("bundle.manifest", "bundle.files", "bundle.sha256sums", "bundle.measurements",
                 "integrity.hashes", "integrity.records", "integrity.omitted"):
        assert seen[name] == "passed", name
    label = f"evaluate.{pipeline.receipt('eval-again')[7:15]}"
    assert seen[f"{label}.claims.correct"] == "passed"
    assert seen[f"{label}.answers.decoded"] == "passed"
    checkpoint = pipeline.output("init", "checkpoint")
    assert seen[f"checkpoint.{checkpoint[7:15]}.params"] == "passed"
    # The commit receipt is not in the closure: the commitment cannot be dated offline.
    # No receipt here dates the commitment: the evaluation's link to it orders them.
    assert seen[f"{label}.ordering.time"] == "passed"


def test_the_store_and_the_bundle_agree(bundles: dict[str, Path], pipeline: Pipeline) -> None:
    from_store = verify(pipeline.receipt("eval-again"), store=pipeline.store_dir)
    from_bundle = verify(str(bundles["full"]))
    recomputed = {c.name: c.recomputed for c in from_store.checks if ".claims." in c.name}
    assert recomputed == {c.name: c.recomputed for c in from_bundle.checks
                          if ".claims." in c.name}


def test_a_bundle_without_weights_skips_what_needs_them(bundles: dict[str, Path],
                                                        pipeline: Pipeline) -> None:
    report = verify(str(bundles["light"]))
    assert report.ok
    seen = statuses(report)
    checkpoint = pipeline.output("init", "checkpoint")
    assert seen["integrity.omitted"] == "skipped"
    assert seen[f"checkpoint.{checkpoint[7:15]}.params"] == "skipped"
    strict = verify(str(bundles["light"]), strict=True)
    assert not strict.ok and exit_code(strict) == 1
    assert {"integrity.omitted", f"checkpoint.{checkpoint[7:15]}.params"} <= {
        c.name for c in strict.failures}


def test_an_edited_file_fails(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = copy(bundles["full"], tmp_path)
    edited = next((bundle / "evaluations").rglob("generations.jsonl"))
    edited.write_bytes(edited.read_bytes().replace(b'"text":"', b'"text":"{', 1))
    report = verify(str(bundle))
    assert {"integrity.hashes", "bundle.sha256sums", "bundle.measurements"} <= failed(report)
    assert exit_code(report) == 1


def test_a_missing_file_means_cannot_verify(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = copy(bundles["full"], tmp_path)
    (bundle / "tasks" / "test.jsonl").unlink()
    report = verify(str(bundle))
    assert {"integrity.missing", "bundle.files", "bundle.sha256sums"} <= failed(report)
    assert exit_code(report) == 3


def test_a_rewritten_manifest_fails(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = copy(bundles["full"], tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["objects"].pop("tasks/test.jsonl")
    manifest["objects"]["../escape.jsonl"] = entry
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=1))
    report = verify(str(bundle))
    bad = failed(report)
    assert {"bundle.manifest", "bundle.files", "bundle.sha256sums", "integrity.missing"} <= bad
    message = next(c.message for c in report.checks if c.name == "bundle.manifest")
    assert "'../escape.jsonl'" in message and "canonical" in message


def test_a_symbolic_link_is_refused(bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = copy(bundles["full"], tmp_path)
    target = bundle / "tasks" / "dev.jsonl"
    outside = tmp_path / "dev.jsonl"
    shutil.move(target, outside)
    os.symlink(outside, target)
    report = verify(str(bundle))
    assert "bundle.files" in failed(report)
    assert "integrity.hashes" in failed(report)
    message = next(c.message for c in report.checks if c.name == "integrity.hashes")
    assert "symbolic link" in message
