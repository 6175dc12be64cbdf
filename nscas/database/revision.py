"""The store's schema version: the one module that knows it, how to read it and what to refuse;
the tables, indexes and triggers that version has (for fsck), and what SQLite's errors mean.

The standard library only (``sqlite3``) at import: readers check the version at open and must
not pay for SQLAlchemy; alembic is imported only to list the known revisions, on error paths and
by the writer (nscas.db).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from nscas.database.connections import Cursor
from nscas.errors import DamagedStore, NoSpace, ReadOnlyStore, StoreError
from nscas.store.locating import DB_NAME

SCHEMA_HEAD = "0006_chunk_bases"
"""The alembic revision this code was written for; tests keep it equal to the migrations' head."""

# What the migrations up to SCHEMA_HEAD create (tests/store/test_migrations.py compares these with
# a freshly migrated store and with nscas.database.schema): fsck reports every difference.
TABLES: dict[str, tuple[str, ...]] = {
    "alembic_version": ("version_num",),
    "objects": ("seq", "id", "size", "sha256", "kind", "storage", "codec", "stored_size", "data",
                "created", "base"),
    "parts": ("object_id", "idx", "offset", "part_id"),
    "links": ("parent", "path", "child"),
    "object_sha256": ("id", "sha256"),
    "refs": ("name", "target", "updated"),
    "ref_log": ("seq", "name", "old", "new", "at", "message"),
    "gc_session": ("token",),
}
INDEXES: dict[str, str] = {  # index -> its table; sqlite_autoindex_* come from UNIQUE and keys
    "ix_objects_records": "objects", "ix_objects_record_seq": "objects",
    "ix_objects_base": "objects",
    "ix_parts_part": "parts", "ix_links_child": "links", "ix_links_outputs": "links",
    "ix_ref_log_name": "ref_log",
    "sqlite_autoindex_alembic_version_1": "alembic_version",
    "sqlite_autoindex_objects_1": "objects", "sqlite_autoindex_parts_1": "parts",
    "sqlite_autoindex_links_1": "links", "sqlite_autoindex_object_sha256_1": "object_sha256",
    "sqlite_autoindex_refs_1": "refs",
}
INSERT_ONLY_TABLES = ("objects", "parts", "links", "ref_log", "object_sha256")


def _guard_sql(table: str, verb: str) -> str:
    return (f"CREATE TRIGGER {table}_no_{verb} BEFORE {verb.upper()} ON {table} "
            f"WHEN NOT EXISTS (SELECT 1 FROM gc_session) "
            f"BEGIN SELECT RAISE(ABORT, '{table} is insert-only'); END")


TRIGGERS: dict[str, str] = {f"{t}_no_{v}": _guard_sql(t, v)
                            for t in INSERT_ONLY_TABLES for v in ("update", "delete")}
"""Trigger name -> the exact statement the migrations create it with."""


class SchemaDifference(NamedTuple):
    """One way the store's schema differs from what the migrations create."""

    name: str  # the table, index or trigger
    problem: str  # missing-table, missing-column, missing-index, missing-trigger, changed-trigger,
    # extra-trigger, extra-object, gc-session-open
    detail: str
    harmful: bool = True  # False for an extra table or index: nothing nscas relies on changes


def schema_differences(c: sqlite3.Connection) -> list[SchemaDifference]:
    """Every difference between the store's tables, indexes and triggers and :data:`TABLES`,
    :data:`INDEXES` and :data:`TRIGGERS`; and a row left in ``gc_session``, which would open
    the insert-only tables to every writer."""
    have = {(kind, name): (table, sql) for kind, name, table, sql in c.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master")}
    out: list[SchemaDifference] = []
    for table, columns in TABLES.items():
        if ("table", table) not in have:
            out.append(SchemaDifference(name=table, problem="missing-table",
                                        detail=f"table {table} is missing"))
            continue
        present = {row[1] for row in c.execute(f'PRAGMA table_info("{table}")')}
        out.extend(SchemaDifference(name=f"{table}.{col}", problem="missing-column",
                                    detail=f"column {col} of table {table} is missing")
                   for col in columns if col not in present)
    gone = {d.name for d in out if d.problem == "missing-table"}  # with its indexes, triggers
    for index, table in INDEXES.items():
        if ("index", index) not in have and table not in gone:
            out.append(SchemaDifference(name=index, problem="missing-index",
                                        detail=f"index {index} on {table} is missing"))
    for trigger, sql in TRIGGERS.items():
        found = have.get(("trigger", trigger))
        if found is None and _guarded_table(trigger) in gone:
            continue
        if found is None:
            out.append(SchemaDifference(name=trigger, problem="missing-trigger",
                                        detail=f"trigger {trigger} is missing: {_guarded_table(trigger)} "
                                               "is no longer insert-only"))
        elif " ".join((found[1] or "").split()) != sql:
            out.append(SchemaDifference(name=trigger, problem="changed-trigger",
                                        detail=f"trigger {trigger} is not the one the migrations "
                                               f"create: {found[1]}"))
    for (kind, name), (table, sql) in sorted(have.items()):
        if kind == "trigger" and name not in TRIGGERS:
            out.append(SchemaDifference(name=name, problem="extra-trigger",
                                        detail=f"trigger {name} on {table}, which no migration "
                                               f"creates: {sql}"))
        elif ((kind == "table" and name not in TABLES and not name.startswith("sqlite_"))
              or (kind == "index" and name not in INDEXES) or kind == "view"):
            out.append(SchemaDifference(name=name, problem="extra-object", harmful=False,
                                        detail=f"{kind} {name}, which no migration creates"))
    if ("table", "gc_session") in have and c.execute("SELECT 1 FROM gc_session").fetchone():
        out.append(SchemaDifference(name="gc_session", problem="gc-session-open",
                                    detail="gc_session holds a row outside any gc: the "
                                           "insert-only tables accept updates and deletes"))
    return out


def _guarded_table(trigger: str) -> str:
    """The table an insert-only trigger guards (``objects_no_update`` -> ``objects``)."""
    return trigger.rsplit("_no_", 1)[0]


def database_error(exc: sqlite3.Error, root: Path) -> StoreError:
    """What an error SQLite raised means for the store at ``root``, in one line."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    message = str(exc)
    if name == "SQLITE_FULL" or name == "SQLITE_IOERR_SHMSIZE" or "disk is full" in message:
        return NoSpace(str(root))  # SHMSIZE: the -shm file could not grow (ENOSPC)
    if name.startswith("SQLITE_READONLY") or "readonly database" in message:
        return ReadOnlyStore(str(root))
    if name.startswith("SQLITE_IOERR") and _full(root):
        return NoSpace(str(root))
    if name in ("SQLITE_NOTADB", "SQLITE_CANTOPEN"):
        return StoreError(f"cannot read the store database {root / DB_NAME}: {message}")
    if (name.startswith("SQLITE_CORRUPT")
            or message.startswith(("no such table", "no such column", "no such index",
                                   "no such trigger", "malformed database schema"))):
        return DamagedStore(str(root), message)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreError(f"the store database {root / DB_NAME} stayed locked by another "
                          f"process ({message}); try again")
    return StoreError(f"the store database {root / DB_NAME} failed: {message}")


def _full(root: Path) -> bool:
    import shutil  # only an error needs it

    try:
        return shutil.disk_usage(root).free == 0
    except OSError:
        return False


def migrations_dir() -> str:
    """The directory of the alembic scripts (the ``nscas.migrations`` package)."""
    import nscas.migrations

    return str(Path(nscas.migrations.__file__).parent)


def known_revisions() -> set[str]:
    """Every revision the migrations know (alembic walks its scripts)."""
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory(migrations_dir()).walk_revisions()}


def newer_schema(rev: str, where: Path) -> StoreError:
    """The error for a store whose schema a newer nscas wrote."""
    return StoreError(f"store {where} has schema version {rev!r}, newer than this nscas knows "
                      f"({SCHEMA_HEAD!r}); upgrade nscas")


class Executes(Protocol):
    """What reading the revision needs of a SQLite connection: ``sqlite3``'s own, or the
    engine's (nscas.database.connections.Connection)."""

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Cursor: ...


def schema_revision(c: Executes) -> str | None:
    """The store's alembic revision, or None before its first migration."""
    if c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                 "AND name = 'alembic_version'").fetchone() is None:
        return None
    row = c.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


def check_revision(c: Executes, where: Path, rev: str | None = "") -> None:
    """Refuse a store of another schema version than this code's (``rev``: the revision as
    already read, e.g. from a team store's PostgreSQL; else read from ``c``)."""
    rev = schema_revision(c) if rev == "" else rev
    if rev is None:
        raise StoreError(f"{where} is not an initialised nscas store (run 'nscas init')")
    if rev != SCHEMA_HEAD:
        if rev not in known_revisions():  # alembic only on this error path
            raise newer_schema(rev, where)
        raise StoreError(f"store {where} has schema version {rev!r}; run 'nscas init --upgrade'")


def refuse_newer(db: Path, where: Path) -> None:
    """Before alembic upgrades a store: refuse one that a newer nscas wrote."""
    try:
        c = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
        try:
            rev = schema_revision(c)
        finally:
            c.close()
    except sqlite3.Error as exc:
        raise database_error(exc, where) from None
    if rev is not None and rev not in known_revisions():
        raise newer_schema(rev, where)
