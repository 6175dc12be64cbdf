"""A tensor object's SHA-256 is computed lazily and recorded once (docs/format.md §1.2)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config

from nscas.database.revision import SCHEMA_HEAD, migrations_dir
from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.reading import StoreReader
from nscas.store.writer import Store, init_store
from nscas.upkeep.fsck import fsck, gc
from tests.store.helpers import b3, random_f32, raw_db, raw_update, sha256, write_safetensors


def _model(store: Store, tmp_path: Path) -> tuple[Digest, Digest, bytes]:
    """(file ID, ID of a tensor in a chunk file of its own, that tensor's bytes)."""
    tensors = {"w": random_f32(3000, seed=7), "b": random_f32(5, seed=8)}
    write_safetensors(tmp_path / "m.safetensors", tensors)
    oid = store.put_file(tmp_path / "m.safetensors")
    raw = tensors["w"].tobytes()
    return oid, Digest.parse(b3(raw)), raw


def _recorded(store: Store) -> dict[str, str]:
    with raw_db(store) as db:
        return dict(db.execute("SELECT id, sha256 FROM object_sha256"))


def test_add_records_the_file_and_leaves_the_tensor(store: Store, tmp_path: Path) -> None:
    oid, tid, raw = _model(store, tmp_path)
    assert store.info(oid).sha256 == hashlib.sha256((tmp_path / "m.safetensors").read_bytes()).hexdigest()
    assert store.info(tid).sha256 is None
    assert store.sha256(tid) == sha256(raw)
    assert _recorded(store) == {tid.hex: sha256(raw)}
    assert store.info(tid).sha256 == sha256(raw)
    assert store.sha256(tid) == sha256(raw)  # the second time from the row
    assert fsck(store, deep=True).ok and fsck(store, full=True).ok


def test_a_reader_computes_and_records_nothing(store: Store, tmp_path: Path) -> None:
    _, tid, raw = _model(store, tmp_path)
    with open_store(store.root, readonly=True) as reader:
        assert isinstance(reader, StoreReader) and not isinstance(reader, Store)
        assert reader.sha256(tid) == sha256(raw)
        assert reader.info(tid).sha256 is None
    with Store(store.root, readonly=True) as ro:
        assert ro.sha256(tid) == sha256(raw)
    assert _recorded(store) == {}


def test_the_recorded_values_are_insert_only(store: Store, tmp_path: Path) -> None:
    _, tid, _raw = _model(store, tmp_path)
    store.sha256(tid)
    for sql in ("UPDATE object_sha256 SET sha256 = '0'", "DELETE FROM object_sha256"):
        with pytest.raises(Exception, match="object_sha256 is insert-only"):
            store.execute_raw(sql)
    with pytest.raises(Exception, match="objects is insert-only"):
        store.execute_raw(f"UPDATE objects SET sha256 = '{'0' * 64}' WHERE id = '{tid.hex}'")


def test_fsck_checks_a_recorded_value(store: Store, tmp_path: Path) -> None:
    _, tid, _raw = _model(store, tmp_path)
    store.sha256(tid)
    raw_update(store, "UPDATE object_sha256 SET sha256 = ? WHERE id = ?", ("0" * 64, tid.hex))
    assert fsck(store).ok  # rows read no bytes
    for report in (fsck(store, deep=True), fsck(store, full=True)):
        assert [(f.object, f.problem) for f in report.errors] == [(str(tid), "sha256-mismatch")]


def test_gc_removes_the_recorded_value_with_its_object(store: Store, tmp_path: Path) -> None:
    oid, tid, _raw = _model(store, tmp_path)
    store.sha256(tid)
    removed = gc(store, min_age=0)
    assert oid in removed.objects and tid in removed.objects
    assert _recorded(store) == {}


def test_a_store_of_schema_0002_upgrades_and_keeps_its_sha256(tmp_path: Path) -> None:
    root = tmp_path / "old" / ".nscas"
    init_store(tmp_path / "old").close()  # the chunk directories; the database made again below
    # The database at 0002, as an nscas of that schema made it, with one object.
    (root / "nscas.db").unlink()
    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{root / 'nscas.db'}")
    command.upgrade(cfg, "0002_lineage_indexes")
    data = b"stored under schema 0002"
    with sqlite3.connect(root / "nscas.db", isolation_level=None) as db:
        db.execute("INSERT INTO objects (id, size, sha256, kind, storage, codec, stored_size, data,"
                   " created) VALUES (?, ?, ?, NULL, 'inline', 'raw', ?, ?, 0)",
                   (b3(data)[7:], len(data), sha256(data), len(data), data))
    with pytest.raises(Exception, match="init --upgrade"):
        open_store(tmp_path / "old")
    init_store(tmp_path / "old").close()
    with open_store(tmp_path / "old") as store:
        oid = Digest.parse(b3(data))
        assert store.get_bytes(oid) == data and store.info(oid).sha256 == sha256(data)
        _, tid, raw = _model(store, tmp_path)
        assert store.info(tid).sha256 is None and store.sha256(tid) == sha256(raw)
        with raw_db(store) as db:
            assert db.execute("SELECT version_num FROM alembic_version").fetchone()[0] == SCHEMA_HEAD
            triggers = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
            assert {"objects_no_update", "objects_no_delete", "object_sha256_no_update",
                    "object_sha256_no_delete"} <= triggers
        assert fsck(store, full=True).ok
        with pytest.raises(Exception, match="objects is insert-only"):
            store.execute_raw("DELETE FROM objects")


def test_downgrade_refuses_while_a_sha256_is_unknown(store: Store, tmp_path: Path) -> None:
    _, tid, raw = _model(store, tmp_path)
    cfg = Config()
    cfg.set_main_option("script_location", migrations_dir())
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{store.root / 'nscas.db'}")
    with pytest.raises(RuntimeError, match="no SHA-256 yet"):
        command.downgrade(cfg, "0002_lineage_indexes")
    # The later revisions' downgrades ran before the refusal: back to this nscas's schema to
    # record the SHA-256 through the store, then down again.
    command.upgrade(cfg, "head")
    store.sha256(tid)
    command.downgrade(cfg, "0002_lineage_indexes")
    with raw_db(store) as db:
        row = db.execute("SELECT sha256 FROM objects WHERE id = ?", (tid.hex,)).fetchone()
    assert row[0] == sha256(raw)
