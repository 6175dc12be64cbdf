"""Import: the same IDs in a fresh store, a clean deep fsck, weights left out, from the tar too."""

from __future__ import annotations

import json
from pathlib import Path

from nscas.bundle.exporting import export_bundle
from nscas.bundle.importing import import_bundle
from nscas.objects.digests import Digest
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck
from tests.export.conftest import Published


def _ids(bundle: Path) -> set[Digest]:
    m = json.loads((bundle / "manifest.json").read_bytes())
    return ({Digest.parse(e["id"]) for e in m["objects"].values()}
            | {Digest.parse(d) for d in m["derived"]})


def test_import_gives_the_same_ids_and_a_clean_store(published: Published, fresh_store: Store,
                                                     tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "b")
    report = import_bundle(fresh_store, tmp_path / "b")
    closure = published.store.closure([published.target])
    assert set(report.imported) == closure and report.present == 0
    assert (report.omitted, report.skipped, report.complete) == ((), (), True)
    assert fresh_store.closure([published.target]) == closure
    for oid in closure:
        assert fresh_store.get_bytes(oid) == published.store.get_bytes(oid)
        assert fresh_store.info(oid).kind == published.store.info(oid).kind
    check = fsck(fresh_store, deep=True)
    assert check.ok and check.findings == (), check.findings
    again = import_bundle(fresh_store, tmp_path / "b")  # idempotent
    assert again.imported == () and again.present == len(closure)
    # Re-exporting from the new store gives the same bundle.
    export_bundle(fresh_store, published.target, tmp_path / "c")
    for p in (tmp_path / "b").rglob("*"):
        if p.is_file():
            assert (tmp_path / "c" / p.relative_to(tmp_path / "b")).read_bytes() == p.read_bytes()


def test_import_without_weights_reports_what_it_left_out(published: Published, fresh_store: Store,
                                                         tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "b", weights=False)
    report = import_bundle(fresh_store, tmp_path / "b")
    weights = {*published.weight_files, *published.tensors}
    assert set(report.omitted) == weights
    s = published.store
    ck_records = set()
    for ck in (published.seed, published.trained):
        rec = s.get_record(ck)
        ck_records |= {ck, Digest.parse(rec["files"]), Digest.parse(rec["params"])}
    # The checkpoints, their trees and params, and everything above them (the receipts, the
    # actions that take them, the commitment naming them) cannot be imported.
    assert ck_records <= set(report.skipped)
    assert {published.target, published.baseline, published.train_receipt} <= set(report.skipped)
    assert not report.complete
    imported = set(report.imported)
    assert not imported & weights and not imported & set(report.skipped)
    assert published.journal_entries in imported
    for oid in report.skipped + report.omitted:
        assert not fresh_store.has(oid)
    assert imported | set(report.skipped) | weights == s.closure([published.target])
    assert fsck(fresh_store, deep=True).ok


def test_import_from_the_tar(published: Published, fresh_store: Store, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "b")
    report = import_bundle(fresh_store, tmp_path / "b" / "measurements.tar.gz")
    assert set(report.omitted) == {*published.weight_files, *published.tensors}
    assert published.target in report.skipped
    assert published.journal_entries in report.imported
    assert fsck(fresh_store, deep=True).ok
    # The tar brings in everything of the bundle but the weights and what needs them.
    weights = {*published.weight_files, *published.tensors}
    assert set(report.imported) == _ids(tmp_path / "b") - weights - set(report.skipped)
