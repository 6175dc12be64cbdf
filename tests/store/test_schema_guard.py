"""The database under someone else's hands: fsck finds every ref moved behind the ref log's
back and every table, column, index or trigger dropped or added by hand; the store's commands
answer a damaged schema with one error naming it, never SQLite's traceback."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import pytest

from nscas.database import revision
from nscas.database.schema import INSERT_ONLY, metadata
from nscas.errors import DamagedStore, StoreError
from nscas.objects.digests import Digest
from nscas.store.opening import open_store
from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck, gc
from tests.store.helpers import raw_db


def test_the_expected_schema_is_what_the_migrations_create(store: Store) -> None:
    con = raw_db(store)
    try:
        rows = con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        columns = {t: tuple(r[1] for r in con.execute(f'PRAGMA table_info("{t}")'))
                   for kind, t, _, _ in rows if kind == "table"}
    finally:
        con.close()
    assert columns == revision.TABLES
    assert {n: t for kind, n, t, _ in rows if kind == "index"} == revision.INDEXES
    assert {n: " ".join(sql.split()) for kind, n, _, sql in rows if kind == "trigger"} == revision.TRIGGERS
    # ... and what nscas.database.schema declares (the migrations' own test holds those two equal)
    assert {t.name: tuple(c.name for c in t.columns) for t in metadata.sorted_tables} == {
        t: c for t, c in revision.TABLES.items() if t != "alembic_version"}
    assert set(revision.INSERT_ONLY_TABLES) == set(INSERT_ONLY)
    assert store.schema_differences() == []


def _refs(store: Store) -> tuple[Digest, Digest]:
    a, b = store.put_bytes(b"release"), store.put_bytes(b"something else")
    store.ref_set("tags/v1", a)
    store.ref_set("exp/best", a)
    return a, b


TAMPER: dict[str, tuple[Callable[[Digest, Digest], list[str]], str, str]] = {
    # name: (SQL run behind the store's back, the problem fsck reports, its object)
    "tag-updated": (lambda a, b: [f"UPDATE refs SET target = '{b.hex}' WHERE name = 'tags/v1'"],
                    "ref-log-mismatch", "tags/v1"),
    "ref-updated": (lambda a, b: [f"UPDATE refs SET target = '{b.hex}' WHERE name = 'exp/best'"],
                    "ref-log-mismatch", "exp/best"),
    "ref-deleted": (lambda a, b: ["DELETE FROM refs WHERE name = 'exp/best'"],
                    "missing-ref", "exp/best"),
    "ref-inserted": (lambda a, b: [f"INSERT INTO refs VALUES ('exp/sneaky', '{b.hex}', 0)"],
                     "unlogged-ref", "exp/sneaky"),
    "tag-moved-with-a-forged-log": (
        lambda a, b: [f"INSERT INTO ref_log (name, old, new, at, message) VALUES "
                      f"('tags/v1', '{a.hex}', '{b.hex}', 0, 'forged')",
                      f"UPDATE refs SET target = '{b.hex}' WHERE name = 'tags/v1'"],
        "tag-moved", "tags/v1"),
    "log-chain-broken": (
        lambda a, b: [f"INSERT INTO ref_log (name, old, new, at, message) VALUES "
                      f"('exp/best', '{b.hex}', '{a.hex}', 0, 'forged')"],
        "ref-log-chain", "exp/best"),
    "trigger-dropped": (lambda a, b: ["DROP TRIGGER objects_no_update"],
                        "missing-trigger", "objects_no_update"),
    "trigger-replaced": (
        lambda a, b: ["DROP TRIGGER ref_log_no_delete",
                      "CREATE TRIGGER ref_log_no_delete BEFORE DELETE ON ref_log BEGIN SELECT 1; END"],
        "changed-trigger", "ref_log_no_delete"),
    "trigger-added": (
        lambda a, b: [f"CREATE TRIGGER sneaky AFTER INSERT ON ref_log BEGIN "
                      f"UPDATE refs SET target = '{b.hex}'; END"],
        "extra-trigger", "sneaky"),
    "table-dropped": (lambda a, b: ["DROP TABLE ref_log"], "missing-table", "ref_log"),
    "column-dropped": (lambda a, b: ["ALTER TABLE refs DROP COLUMN updated"],
                       "missing-column", "refs.updated"),
    "index-dropped": (lambda a, b: ["DROP INDEX ix_parts_part"], "missing-index", "ix_parts_part"),
    "gc-session-left-open": (lambda a, b: ["INSERT INTO gc_session VALUES (7)"],
                             "gc-session-open", "gc_session"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_fsck_finds_what_was_done_behind_the_stores_back(store: Store, case: str) -> None:
    a, b = _refs(store)
    assert fsck(store).ok
    sql, problem, name = TAMPER[case]
    con = raw_db(store)
    try:
        for statement in sql(a, b):
            con.execute(statement)
    finally:
        con.close()
    with open_store(store.root, readonly=True) as reader:  # the reader fsck runs on
        report = fsck(reader)
    assert not report.ok
    assert (name, problem) in {(f.object, f.problem) for f in report.errors}, report.findings
    if case == "tag-updated":
        [finding] = report.errors
        assert "tags never move" in finding.detail and str(b) in finding.detail


def test_an_added_table_is_a_note_not_an_error(store: Store) -> None:
    con = raw_db(store)
    try:
        con.execute("CREATE TABLE notes (x)")
    finally:
        con.close()
    report = fsck(store)
    assert report.ok
    assert [(f.object, f.problem, f.severity) for f in report.findings] == [
        ("notes", "extra-object", "note")]


def test_a_dropped_table_is_one_finding_and_every_other_check_still_runs(store: Store) -> None:
    _refs(store)
    con = raw_db(store)
    try:
        con.execute("DROP TABLE ref_log")
        con.execute("DROP TRIGGER parts_no_delete")
    finally:
        con.close()
    report = fsck(store, deep=True)
    problems = [(f.object, f.problem) for f in report.findings]
    assert problems == [("ref_log", "missing-table"), ("parts_no_delete", "missing-trigger"),
                        (None, "check-skipped")], problems
    assert report.objects == 2 and report.deep_checked == 2


@pytest.mark.parametrize("readonly", [True, False])
def test_reads_and_writes_on_a_damaged_schema_name_it_in_one_line(store: Store,
                                                                  readonly: bool) -> None:
    a, _ = _refs(store)
    con = raw_db(store)
    try:
        con.execute("DROP TABLE ref_log")
    finally:
        con.close()
    with open_store(store.root, readonly=readonly) as s:
        with pytest.raises(DamagedStore) as err:
            s.ref_log()
        assert err.value.message == (f"the store database at {store.root} is damaged "
                                     "(no such table: ref_log); run 'nscas fsck'")
        if not readonly:
            with pytest.raises(DamagedStore, match="no such table: ref_log"):
                s.ref_set("exp/other", a)
        assert s.ref_get("tags/v1") == a  # what does not need the table still works


def test_gc_refuses_a_store_whose_guards_are_gone(store: Store) -> None:
    store.put_bytes(b"unreachable")
    con = raw_db(store)
    try:
        con.execute("DROP TRIGGER objects_no_delete")
    finally:
        con.close()
    with pytest.raises(DamagedStore, match="trigger objects_no_delete is missing"):
        gc(store, min_age=0)
    assert store.counts()["objects"] == 1


def test_sqlite_errors_become_store_errors() -> None:
    from pathlib import Path

    root = Path("/somewhere/.nscas")

    def err(name: str, message: str) -> sqlite3.Error:
        exc = sqlite3.OperationalError(message)
        exc.sqlite_errorname = name  # type: ignore[attr-defined]
        return exc

    cases = {
        ("SQLITE_FULL", "database or disk is full"): "no space left on device at /somewhere/.nscas",
        ("SQLITE_IOERR_SHMSIZE", "disk I/O error"): "no space left on device at /somewhere/.nscas",
        ("SQLITE_READONLY", "attempt to write a readonly database"): "the store at /somewhere/.nscas is read-only",
        ("SQLITE_ERROR", "no such table: refs"): "is damaged (no such table: refs); run 'nscas fsck'",
        ("SQLITE_CORRUPT", "database disk image is malformed"): "is damaged (database disk image is malformed)",
        ("SQLITE_BUSY", "database is locked"): "stayed locked",
    }
    for (name, message), needle in cases.items():
        mapped = revision.database_error(err(name, message), root)
        assert isinstance(mapped, StoreError) and needle in mapped.message, (name, mapped.message)


def test_gc_still_runs_without_an_index(store: Store) -> None:
    store.put_bytes(b"unreachable")
    con = raw_db(store)
    try:
        con.execute("DROP INDEX ix_parts_part")
    finally:
        con.close()
    assert len(gc(store, min_age=0).objects) == 1
    assert [f.problem for f in fsck(store).findings] == ["missing-index"]


@pytest.mark.parametrize("how", ["drop", "replace", "when-false"])
@pytest.mark.parametrize("trigger", sorted(revision.TRIGGERS))
def test_every_guard_switched_off_any_way_is_a_finding(store: Store, trigger: str, how: str) -> None:
    """SQLite has no DISABLE TRIGGER: a guard is off when dropped or re-created to do nothing."""
    assert fsck(store).ok
    table, verb = trigger.rsplit("_no_", 1)
    redo = {"drop": None,
            "replace": f"CREATE TRIGGER {trigger} BEFORE {verb.upper()} ON {table} BEGIN SELECT 1; END",
            "when-false": revision.TRIGGERS[trigger].replace(" WHEN ", " WHEN 0 AND ", 1)}[how]
    con = raw_db(store)
    try:
        con.execute(f"DROP TRIGGER {trigger}")
        if redo is not None:
            con.execute(redo)
    finally:
        con.close()
    with open_store(store.root, readonly=True) as reader:
        found = {(f.object, f.problem) for f in fsck(reader).errors}
    assert (trigger, "missing-trigger" if how == "drop" else "changed-trigger") in found, found
