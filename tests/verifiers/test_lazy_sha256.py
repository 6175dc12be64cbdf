"""The verifiers on a store whose tensors' SHA-256 is lazy (docs/format.md §1.2): an unknown
value is nothing to compare, a recorded one must match the bytes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from nscas.objects.digests import Digest
from nscas.store.writer import init_store
from nscas.verifiers.records.closure import Objects
from nscas.verifiers.records.store import StoreSource


def _store_with_tensor(tmp_path: Path) -> tuple[Path, Digest]:
    weights = np.random.default_rng(3).standard_normal(4000).astype(np.float32)
    save_file({"w": weights}, str(tmp_path / "m.safetensors"))
    with init_store(tmp_path / "s") as store:
        store.put_file(tmp_path / "m.safetensors")
        tid = Digest.of(weights.tobytes())
        assert store.info(tid).sha256 is None
        return store.root, tid


def test_an_unknown_sha256_is_not_a_finding(tmp_path: Path) -> None:
    root, tid = _store_with_tensor(tmp_path)
    source = StoreSource(root)
    try:
        meta = source.meta(str(tid))
        assert meta is not None and meta.sha256 is None
        assert Objects(source).state(str(tid)).problem is None
    finally:
        source.close()


def test_a_tampered_recorded_sha256_is_found(tmp_path: Path) -> None:
    root, tid = _store_with_tensor(tmp_path)
    with init_store(root) as store:
        right = store.sha256(tid)  # recorded now
    source = StoreSource(root)
    try:
        assert source.meta(str(tid)).sha256 == right
        assert Objects(source).state(str(tid)).problem is None
    finally:
        source.close()
    db = sqlite3.connect(root / "nscas.db", isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO gc_session (token) VALUES (1)")  # the triggers' only way through
        db.execute("UPDATE object_sha256 SET sha256 = ? WHERE id = ?", ("0" * 64, tid.hex))
        db.execute("DELETE FROM gc_session")
        db.execute("COMMIT")
    finally:
        db.close()
    source = StoreSource(root)
    try:
        problem = Objects(source).state(str(tid)).problem
        assert problem is not None and f"recorded {'0' * 64}" in problem
    finally:
        source.close()
