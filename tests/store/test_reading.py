"""The read-only store (nscas.store.reading): same answers as the writer, no writes, WAL snapshots."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nscas.errors import StoreError
from nscas.store import reading
from nscas.store.opening import open_store
from nscas.store.reading import StoreReader
from nscas.store.writer import Store
from tests.store.helpers import build_records, raw_db, small_chunks, write_safetensors


@pytest.fixture
def filled(store: Store, tmp_path: Path) -> Store:
    """Records of every kind, links, refs moved and logged, a file stored as parts."""
    built = build_records(store)
    with small_chunks():
        write_safetensors(tmp_path / "m.safetensors",
                          {"a": np.arange(4000, dtype=np.float32), "b": np.ones(9, dtype=np.int64)})
        store.put_file(tmp_path / "m.safetensors")
    receipt, _ = built["receipt/1"]
    ckpt, _ = built["checkpoint/1"]
    store.ref_set("experiments/a_b/run", receipt, message="first")
    store.ref_set("experiments/a_b/run", ckpt, expect=receipt, message="second")
    store.ref_set("experiments/axb/run", receipt)  # '_' in a prefix must not match 'x'
    store.ref_set("tags/v1", ckpt)
    return store


def _answers(s: StoreReader) -> dict[str, Any]:
    """Every read method's answer about every object of the store."""
    objects = list(s.iter_objects(batch=3))
    ids = [o.id for o in objects]
    out: dict[str, Any] = {
        "objects": objects,
        "counts": s.counts(),
        "refs": [s.ref_list(), s.ref_list("experiments/a_"), s.ref_list("tags/"),
                 s.ref_list("nothing")],
        "ref_log": [s.ref_log(), s.ref_log("experiments/a_b/run"), s.ref_log(limit=1)],
        "ref_get": [s.ref_get("tags/v1"), s.ref_get("absent")],
        "log": [s.log(), s.log(limit=2), s.log(kind="tree/1"),
                s.log(before=max(1, len(objects) - 3))],
        "kinds": s.kinds_of(ids),
        "closure": [s.closure(ids[-1:]), s.closure(ids, with_parts=True)],
    }
    for oid in ids:
        out[str(oid)] = (
            s.has(oid), s.info(oid), s.resolve(oid.hex[:10]), s.get_bytes(oid), list(s.leaves(oid)),
            s.part_ids(oid), s.part_rows(oid), s.inline_data(oid), s.links_from(oid),
            s.links_to(oid), s.links_to(oid, limit=1),
            s.get_record(oid) if s.info(oid).kind else None,
        )
        with s.open(oid) as f:
            assert f.read() == out[str(oid)][3]
    return out


def test_reader_and_writer_give_the_same_answers(filled: Store) -> None:
    with open_store(filled.root, readonly=True) as ro:
        assert type(ro) is StoreReader
        assert _answers(ro) == _answers(filled)
        # The cases above that the comparison alone would not pin down:
        assert [name for name, _ in ro.ref_list("experiments/a_")] == ["experiments/a_b/run"]
        assert ro.resolve("tags/v1") == ro.ref_get("tags/v1")
        assert [e.message for e in ro.ref_log("experiments/a_b/run")] == ["second", "first"]


def test_a_read_only_open_cannot_write(filled: Store) -> None:
    oid = filled.put_bytes(b"kept")
    with open_store(filled.root, readonly=True) as ro:
        assert not isinstance(ro, Store)
        for write in ("put_bytes", "put_record", "put_file", "ref_set", "delete_objects"):
            with pytest.raises(StoreError, match="read-only"):
                getattr(ro, write)
        with pytest.raises(AttributeError):
            ro.no_such_method  # noqa: B018 - only the writer's methods get the store's error
        # Below the methods too: SQLite itself refuses (the connection is opened mode=ro),
        # which the store reports as its own error.
        with pytest.raises(StoreError, match="read-only"), ro._read() as c:
            c.execute("INSERT INTO gc_session (token) VALUES (1)")
        assert ro.get_bytes(oid) == b"kept"


def test_the_reader_refuses_exactly_the_writers_own_methods() -> None:
    writer_only = {name for name, _ in inspect.getmembers(Store, inspect.isfunction)
                   if not name.startswith("_") and not hasattr(StoreReader, name)}
    assert writer_only == reading._WRITES


def test_a_reader_sees_each_commit_after_it_and_one_snapshot_within_a_read(store: Store) -> None:
    a = store.put_bytes(b"a")
    store.ref_set("r", a)
    with open_store(store.root, readonly=True) as ro:
        assert ro.ref_get("r") == a
        with ro._read() as c:  # one read transaction, as every reader method runs in
            before = c.execute("SELECT count(*) FROM objects").fetchone()[0]
            done = threading.Event()

            def write() -> None:
                store.ref_set("r", store.put_bytes(b"b"), expect=a)
                done.set()

            # WAL: the writer commits while the read transaction is open, without waiting.
            t = threading.Thread(target=write)
            t.start()
            assert done.wait(timeout=30)
            t.join()
            assert c.execute("SELECT count(*) FROM objects").fetchone()[0] == before
            assert c.execute("SELECT target FROM refs WHERE name = 'r'").fetchone()[0] == a.hex
        # The next read (on a pooled connection) sees the commit.
        assert ro.get_bytes(ro.resolve("r")) == b"b"
        assert ro.counts()["objects"] == before + 1


def test_an_unreadable_database_is_one_store_error(tmp_path: Path) -> None:
    (tmp_path / reading.DB_NAME).write_bytes(b"not a database, but long enough to be read" * 50)
    with pytest.raises(StoreError, match="cannot read the store database"):
        open_store(tmp_path, readonly=True)


def test_a_newer_schema_is_refused_by_the_reader_too(store: Store) -> None:
    store.close()
    con = raw_db(store)
    con.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    con.close()
    with pytest.raises(StoreError, match="'9999_from_the_future', newer than this nscas knows"):
        open_store(store.root, readonly=True)


def test_reads_from_many_threads_share_the_pool(filled: Store) -> None:
    ids = [o.id for o in filled.iter_objects()]
    with open_store(filled.root, readonly=True) as ro:
        expected = {oid: ro.get_bytes(oid) for oid in ids}
        errors: list[BaseException] = []

        def read() -> None:
            try:
                for _ in range(20):
                    for oid in ids:
                        assert ro.get_bytes(oid) == expected[oid]
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(ro._pool._idle) <= len(threads) + 1  # connections are reused, not one per read
