"""``verify`` on an untampered store: every receipt of a real pipeline passes, with the claims
recomputed (not merely echoed) and the skipped checks named."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest

from nscas.objects.digests import Digest
from nscas.verifiers.core.errors import MissingObject
from nscas.verifiers.core.results import Report
from nscas.verifiers.records.sources import BadTarget, SourceError
from nscas.verifiers.verify import exit_code, verify

from .conftest import Pipeline


def by_name(report: Report) -> dict[str, dict]:
    return {c["name"]: c for c in report.to_dict()["checks"]}


def test_the_last_evaluation_verifies(pipeline: Pipeline) -> None:
    receipt = pipeline.receipt("eval-again")
    report = verify(receipt, store=pipeline.store_dir)
    checks = by_name(report)
    assert report.ok and exit_code(report) == 0, report.summary()
    label = f"evaluate.{receipt[7:15]}"
    base = f"evaluate.{pipeline.receipt('eval-seed')[7:15]}"
    for name in ("integrity.missing", "integrity.hashes", "integrity.records",
                 "integrity.trees", f"{label}.answers.checks", f"{label}.answers.decoded",
                 f"{label}.answers.prompts", f"{label}.ordering.commitment",
                 f"{label}.ordering.closure", f"{label}.ordering.time",
                 f"{base}.ordering.time", f"{label}.statistics.baseline"):
        assert checks[name]["status"] == "passed", name
    # The claims are recomputed from the generations, not echoed.
    claims = pipeline.record(receipt)["claims"]
    for claim in claims:
        check = checks[f"{label}.claims.{claim}"]
        assert check["status"] == "passed", claim
        assert check["recomputed"] == pytest.approx(claims[claim]["value"]), claim
    assert checks[f"{label}.claims.documents"]["recomputed"] == 16
    assert checks[f"{label}.claims.exact_one_sided_p"]["recomputed"] == float(Fraction(1))
    # The baseline (linked as an input) is verified too.
    assert checks[f"{base}.claims.documents"]["status"] == "passed"
    # Losses need the model: reported as skipped, never passed.
    assert checks[f"{label}.retention.losses"]["status"] == "skipped"
    assert {c["status"] for c in checks.values()} == {"passed", "skipped"}


def test_strict_passes_a_complete_store(pipeline: Pipeline) -> None:
    # Retention losses need a model run: not rechecked, named, and no reason to fail --strict.
    report = verify(pipeline.receipt("eval-again"), store=pipeline.store_dir, strict=True)
    assert report.ok and exit_code(report) == 0
    # ... and so are the params only a rerun could recheck (batch size, precision, threads).
    assert {n.split(".")[-1] for n in report.not_rechecked("model")} == {"losses", "rerun"}
    assert report.not_rechecked("weights") == []


def test_the_prepare_receipt_regenerates_every_task(pipeline: Pipeline) -> None:
    receipt = pipeline.receipt("prepare")
    report = verify(receipt, store=pipeline.store_dir, strict=True)
    assert report.ok, [c for c in report.failures]
    checks = by_name(report)
    label = f"prepare.{receipt[7:15]}"
    assert checks[f"{label}.claims.counts"]["recomputed"] == {"test": 16, "dev": 8, "train": 32}
    assert checks[f"{label}.claims.counts_by_variant"]["recomputed"]["test"] == {
        "0": 4, "1": 4, "2": 4, "3": 4}
    damaged = pipeline.record(pipeline.output("prepare", "damaged"))
    assert checks[f"{label}.claims.damaged_count"]["recomputed"] == sum(
        int(i, 16) % 4 == 0 for i in damaged["ids"])
    test_set = pipeline.output("prepare", "test")
    assert checks[f"tasks.test.{test_set[7:15]}.regenerated"]["recomputed"] == 16
    assert checks[f"tasks.train-damaged.{damaged_id(pipeline)[7:15]}.damaged_fail_checker"][
        "status"] == "passed"


def damaged_id(pipeline: Pipeline) -> str:
    return pipeline.output("prepare", "damaged")


def test_init_tokenizer_and_commit_receipts_verify(pipeline: Pipeline) -> None:
    for step in ("init", "tokenizer", "commit"):
        report = verify(pipeline.receipt(step), store=pipeline.store_dir, strict=True)
        assert report.ok, (step, [c for c in report.failures])
    checks = by_name(verify(pipeline.receipt("init"), store=pipeline.store_dir))
    label = f"init.{pipeline.receipt('init')[7:15]}"
    params = pipeline.record(pipeline.output("init", "checkpoint"))["params"]
    assert checks[f"{label}.claims.parameter_digest"]["recomputed"] == params
    # sha256_stream in registration order is rebuilt from the file alone and matches torch's.
    claimed = pipeline.record(pipeline.receipt("init"))["claims"]["sha256_stream"]["value"]
    assert checks[f"{label}.claims.sha256_stream"]["recomputed"] == claimed


def test_targets_by_ref_and_prefix(pipeline: Pipeline) -> None:
    receipt = pipeline.receipt("commit")
    pipeline.store.ref_set("experiments/verify/commit", Digest.parse(receipt))
    for target in ("experiments/verify/commit", receipt[7:19], receipt[:19]):
        report = verify(target, store=pipeline.store_dir)
        assert report.ok
        assert any(c.name.startswith(f"commit.{receipt[7:15]}.") for c in report.checks)


def test_unusable_targets_raise_with_exit_codes(pipeline: Pipeline, tmp_path) -> None:
    with pytest.raises(BadTarget) as bad:
        verify("no/such/ref", store=pipeline.store_dir)
    assert bad.value.exit_code == 2
    with pytest.raises(BadTarget):
        verify("abc", store=pipeline.store_dir)  # too short for a prefix
    with pytest.raises(MissingObject) as missing:
        verify("blake3:" + "0" * 64, store=pipeline.store_dir)
    assert missing.value.exit_code == 3
    with pytest.raises(SourceError) as no_store:
        verify(pipeline.receipt("commit"), store=tmp_path)
    assert no_store.value.exit_code == 2
    with pytest.raises(BadTarget):
        verify(str(tmp_path), store=pipeline.store_dir)  # a directory that is not a bundle


def test_verifiers_import_no_store_code() -> None:
    code = ("import sys, nscas.verifiers.verify\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic') or m in "
            "('nscas.store.writer', 'nscas.objects.digests', 'nscas.objects.canonical', 'nscas.objects.kinds', 'nscas.runs.runner', "
            "'nscas.errors', 'nscas.objects.chunks', 'nscas.bundle.exporting') or m.startswith('nscas.recipes')]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
