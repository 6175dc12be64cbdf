"""Export of a store whose tensors have no SHA-256 yet (docs/format.md §1.2): the bundle's
SHA-256 values come from the bytes it writes; a reader records none, the writer records them."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from nscas.bundle.exporting import export_bundle
from nscas.store.opening import open_store
from tests.export.conftest import Published


def _unknown(root: Path) -> int:
    with sqlite3.connect(root / "nscas.db") as db:
        return db.execute("SELECT count(*) FROM objects o WHERE o.sha256 IS NULL AND NOT EXISTS"
                          " (SELECT 1 FROM object_sha256 s WHERE s.id = o.id)").fetchone()[0]


def _check(bundle: Path) -> dict:
    run = subprocess.run(["sha256sum", "-c", "--strict", "SHA256SUMS"], cwd=bundle,
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((bundle / "manifest.json").read_text())


def test_a_reader_exports_correct_sums_and_records_nothing(published: Published,
                                                           tmp_path: Path) -> None:
    root = published.store.root
    before = _unknown(root)
    assert before > 0  # the checkpoints' tensors
    with open_store(root, readonly=True) as reader:
        export_bundle(reader, published.target, tmp_path / "full")
        export_bundle(reader, published.target, tmp_path / "bare", weights=False)
    assert _unknown(root) == before
    full, bare = _check(tmp_path / "full"), _check(tmp_path / "bare")
    for oid, entry in {**full["derived"], **bare["omitted"]}.items():
        assert entry["sha256"] == published.store.sha256(published.store.resolve(oid))


def test_the_writer_records_what_an_export_computed(published: Published, tmp_path: Path) -> None:
    export_bundle(published.store, published.target, tmp_path / "bare", weights=False)
    _check(tmp_path / "bare")
    # The omitted tensors had to be read for their SHA-256: recorded now, read never again.
    omitted = json.loads((tmp_path / "bare" / "manifest.json").read_text())["omitted"]
    for oid, entry in omitted.items():
        assert published.store.info(published.store.resolve(oid)).sha256 == entry["sha256"]
