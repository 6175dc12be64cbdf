"""The SQLite store's own guards, checked from outside with the stdlib sqlite3 module."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from nscas.errors import StoreError
from nscas.store.opening import open_store
from nscas.store.writer import Store
from tests.store.helpers import build_records, raw_db, row_counts, write_safetensors


def test_wal_mode(store: Store) -> None:
    con = raw_db(store)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        con.close()


@pytest.mark.parametrize("table", ["objects", "parts", "links", "ref_log"])
def test_insert_only_tables_refuse_update_and_delete(store: Store, tmp_path: Path, table: str) -> None:
    receipt, _ = build_records(store)["receipt/1"]
    write_safetensors(tmp_path / "m.safetensors", {"a": np.arange(3000, dtype=np.float32)})
    store.put_file(tmp_path / "m.safetensors")
    store.ref_set("r", receipt)
    before = row_counts(store)
    assert min(before.values()) > 0
    column = {"objects": "size", "parts": "offset", "links": "path", "ref_log": "message"}[table]
    con = raw_db(store)
    try:
        for sql in (f"UPDATE {table} SET {column} = {column} || ''",
                    f"DELETE FROM {table}",
                    f"DELETE FROM {table} WHERE rowid = (SELECT max(rowid) FROM {table})"):
            with pytest.raises(sqlite3.IntegrityError, match=f"{table} is insert-only"):
                con.execute(sql)
        with pytest.raises(sqlite3.IntegrityError, match="insert-only"):
            store.execute_raw(f"DELETE FROM {table}")  # through the writer's connection too
    finally:
        con.close()
    assert row_counts(store) == before


def test_refs_table_is_the_only_mutable_one(store: Store) -> None:
    a, b = store.put_bytes(b"a"), store.put_bytes(b"b")
    store.ref_set("r", a)
    store.ref_set("r", b, expect=a)
    assert row_counts(store)["refs"] == 1
    assert row_counts(store)["ref_log"] == 2


def test_newer_schema_version_is_refused(store: Store) -> None:
    store.close()
    con = raw_db(store)
    con.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    con.close()
    with pytest.raises(StoreError, match="'9999_from_the_future', newer than this nscas knows"):
        open_store(store.root)


def test_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is not an nscas store"):
        open_store(tmp_path)
    (tmp_path / "nscas.db").write_bytes(b"")  # a database without the schema
    with pytest.raises(StoreError, match="not an initialised nscas store"):
        open_store(tmp_path)


def test_read_only_store_refuses_writes(store: Store) -> None:
    oid = store.put_bytes(b"kept")
    with open_store(store.root, readonly=True) as ro:
        assert ro.get_bytes(oid) == b"kept"
        with pytest.raises(StoreError, match="read-only"):
            ro.put_bytes(b"new")
