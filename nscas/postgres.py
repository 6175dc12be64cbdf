"""A team store's PostgreSQL database: connections for reads (libpq directly, as SQLite's reads
use ``sqlite3``), what its errors mean, its schema revision and the schema fsck compares.

The reads in nscas.reading are written once, with ``?`` placeholders: :class:`PgConnection`
gives them the small part of ``sqlite3.Connection`` they use, over nscas.libpq (psycopg's import
alone takes longer than a read command may) or, where no libpq loads that way, over psycopg.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from nscas import libpq
from nscas.errors import DamagedStore, ReadOnlyStore, StoreError
from nscas.libpq import PgError, Rows
from nscas.revision import INDEXES, INSERT_ONLY_TABLES, TABLES, SchemaDifference
from nscas.storeconfig import redact

CONNECT_TIMEOUT_S = 10
# Every read connection's settings, whatever the URL says; UTF8, so that text decodes as such.
_OPTIONS = {"connect_timeout": str(CONNECT_TIMEOUT_S), "application_name": "nscas",
            "client_encoding": "UTF8"}
# A read sees one committed state of the store, as an SQLite read transaction in WAL mode does.
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
GUARD_FUNCTION = "nscas_insert_only"
"""The trigger function the migrations create for the insert-only tables on PostgreSQL."""

# Index names PostgreSQL gives keys and UNIQUE constraints (SQLite's are sqlite_autoindex_*).
PG_INDEXES: dict[str, str] = {
    **{name: table for name, table in INDEXES.items() if not name.startswith("sqlite_")},
    "alembic_version_pkc": "alembic_version", "objects_pkey": "objects",
    "objects_id_key": "objects", "parts_pkey": "parts", "links_pkey": "links",
    "object_sha256_pkey": "object_sha256", "refs_pkey": "refs", "ref_log_pkey": "ref_log",
    "gc_session_pkey": "gc_session",
}
TRUNCATE_FUNCTION = "nscas_no_truncate"
"""The statement-level trigger function that refuses TRUNCATE of an insert-only table (0004)."""
PG_TRIGGERS = {f"{t}_no_{v}": (t, v.upper())
               for t in INSERT_ONLY_TABLES for v in ("update", "delete", "truncate")}
_UNDEFINED_TABLE, _UNDEFINED_COLUMN = "42P01", "42703"
_READ_ONLY = frozenset({"25006", "42501"})  # read_only_sql_transaction, insufficient_privilege
_DISK_FULL = "53100"


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL of a libpq URL: the psycopg 3 driver."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


class Driver(Protocol):
    """One server connection in autocommit mode: nscas.libpq's, or :class:`_Psycopg`."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows: ...
    @property
    def ok(self) -> bool: ...
    @property
    def idle(self) -> bool: ...
    def close(self) -> None: ...


class PgConnection:
    """A read connection that reads like ``sqlite3.Connection``: ``execute`` with ``?``
    placeholders (its rows fetched at once), ``in_transaction``, ``rollback``, ``close``; every
    error a :class:`~nscas.libpq.PgError`. ``BEGIN`` opens a REPEATABLE READ READ ONLY
    transaction."""

    def __init__(self, url: str) -> None:
        self._c: Driver = libpq.connect(url, _OPTIONS) or _Psycopg(url)

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        return self._c.execute(_BEGIN_READ if sql == "BEGIN" else sql, args)

    @property
    def in_transaction(self) -> bool:
        return not self._c.idle

    def rollback(self) -> None:
        if self._c.ok:  # a broken connection has no transaction left to end
            self._c.execute("ROLLBACK")

    def close(self) -> None:
        self._c.close()


class _Psycopg:
    """The same reads through psycopg, for where nscas.libpq finds no libpq to load."""

    def __init__(self, url: str) -> None:
        import psycopg  # only here: its import alone is what nscas.libpq avoids

        try:
            self._c = psycopg.connect(url, autocommit=True, **_OPTIONS)
        except psycopg.Error as exc:
            raise pg_error(exc) from None

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        import psycopg

        try:
            cursor = self._c.execute(sql.replace("?", "%s"), tuple(args), prepare=False)
            return Rows(cursor.fetchall() if cursor.description is not None else [])
        except psycopg.Error as exc:
            raise pg_error(exc) from None

    @property
    def ok(self) -> bool:
        return not self._c.closed

    @property
    def idle(self) -> bool:
        from psycopg import pq

        return self._c.info.transaction_status == pq.TransactionStatus.IDLE

    def close(self) -> None:
        self._c.close()


def pg_error(exc: BaseException) -> PgError:
    """A psycopg error (the writer's, through SQLAlchemy) as nscas.libpq's: the same fields."""
    import psycopg

    if isinstance(exc, PgError):
        return exc
    assert isinstance(exc, psycopg.Error)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return PgError(first, sqlstate=exc.sqlstate,
                   operational=isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError))


class _Early:
    """A read connection being made by a thread of its own (:func:`connect_early`)."""

    def __init__(self, url: str) -> None:
        self.conn: PgConnection | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(url,), name="nscas-connect",
                                       daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        try:
            self.conn = PgConnection(url)
        except BaseException as exc:  # raised where the connection is claimed
            self.error = exc


_early: dict[str, _Early] = {}
_early_lock = threading.Lock()  # readers may open in several threads (the UI's server)


def connect_early(url: str) -> None:
    """Start connecting to ``url`` now, in a thread; the next :func:`connect` to it takes that
    connection. Opening a reader calls this before it imports the reading code, so the server's
    start of a session (a backend process, authentication) overlaps that import: libpq runs without the interpreter lock (ctypes releases it).
    Nothing happens where libpq does not load (psycopg's import would cost more than it saves).
    The caller ends with :func:`drop_early`, whether or not a connect took the connection."""
    if libpq.load() is None:
        return
    with _early_lock:
        if url not in _early:
            _early[url] = _Early(url)


def drop_early(url: str) -> None:
    """Close the connection :func:`connect_early` made, unless a :func:`connect` took it."""
    with _early_lock:
        early = _early.pop(url, None)
    if early is not None:
        early.thread.join()
        if early.conn is not None:
            early.conn.close()


def connect(url: str, root: Path) -> PgConnection:
    """A read connection (the one :func:`connect_early` made, if it did), or the store's
    one-line error (unreachable, wrong password, ...)."""
    with _early_lock:
        early = _early.pop(url, None)
    try:
        if early is None:
            return PgConnection(url)
        early.thread.join()
        if early.conn is None:  # a PgError becomes the store's line below; others as they were
            raise early.error or PgError("connection failed", sqlstate=None, operational=True)
        return early.conn
    except PgError as exc:
        raise database_error(exc, root, url) from None


ERRORS = (PgError,)
"""What a :class:`PgConnection` raises."""


def database_error(exc: BaseException, root: Path, url: str | None = None) -> StoreError:
    """What an error PostgreSQL (or the connection to it) raised means, in one line: ``exc``
    is a :class:`~nscas.libpq.PgError` or, from the writer, a psycopg error."""
    err = exc if isinstance(exc, PgError) else pg_error(exc)
    where = redact(url) if url else f"of the store {root}"
    if err.sqlstate in _READ_ONLY:
        return ReadOnlyStore(str(root))
    if err.sqlstate in (_UNDEFINED_TABLE, _UNDEFINED_COLUMN):
        return DamagedStore(str(root), err.message)
    if err.sqlstate == _DISK_FULL:
        return StoreError(f"the database {where} has no space left: {err.message}")
    if err.operational:
        return StoreError(f"cannot reach the store database {where}: {err.message}")
    return StoreError(f"the store database {where} failed: {err.message}")


def schema_revision(c: PgConnection) -> str | None:
    """The store's alembic revision, or None before its first migration: one statement (the
    connection is in autocommit mode, so a missing table leaves no transaction to undo)."""
    try:
        row = c.execute("SELECT version_num FROM alembic_version").fetchone()
    except PgError as exc:
        if exc.sqlstate == _UNDEFINED_TABLE:
            return None
        raise
    return row[0] if row else None


def schema_differences(c: PgConnection) -> list[SchemaDifference]:
    """The PostgreSQL form of :func:`nscas.revision.schema_differences`: tables, columns,
    indexes and the insert-only triggers (each calling :data:`GUARD_FUNCTION` before its verb)."""
    columns: dict[str, set[str]] = {}
    for table, column in c.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema()"):
        columns.setdefault(table, set()).add(column)
    out: list[SchemaDifference] = []
    for table, wanted in TABLES.items():
        if table not in columns:
            out.append(SchemaDifference(name=table, problem="missing-table",
                                        detail=f"table {table} is missing"))
            continue
        out.extend(SchemaDifference(name=f"{table}.{col}", problem="missing-column",
                                    detail=f"column {col} of table {table} is missing")
                   for col in wanted if col not in columns[table])
    gone = {d.name for d in out if d.problem == "missing-table"}
    indexes = {name for (name,) in c.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
    out.extend(SchemaDifference(name=index, problem="missing-index",
                                detail=f"index {index} on {table} is missing")
               for index, table in PG_INDEXES.items() if index not in indexes and table not in gone)
    triggers = {name: (table, sql) for name, table, sql in c.execute(
        "SELECT t.tgname, r.relname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
        "JOIN pg_class r ON r.oid = t.tgrelid JOIN pg_namespace n ON n.oid = r.relnamespace "
        "WHERE NOT t.tgisinternal AND n.nspname = current_schema()")}
    for name, (table, verb) in PG_TRIGGERS.items():
        found = triggers.get(name)
        if found is None:
            if table not in gone:
                out.append(SchemaDifference(name=name, problem="missing-trigger",
                                            detail=f"trigger {name} is missing: {table} is no "
                                                   "longer insert-only"))
        elif found[1] != guard_trigger_def(table, verb):
            out.append(SchemaDifference(name=name, problem="changed-trigger",
                                        detail=f"trigger {name} is not the one the migrations "
                                               f"create: {found[1]}"))
    for name, (table, sql) in sorted(triggers.items()):
        if name not in PG_TRIGGERS:
            out.append(SchemaDifference(name=name, problem="extra-trigger",
                                        detail=f"trigger {name} on {table}, which no migration "
                                               f"creates: {sql}"))
    out.extend(SchemaDifference(name=t, problem="extra-object", harmful=False,
                                detail=f"table {t}, which no migration creates")
               for t in sorted(set(columns) - set(TABLES)))
    out.extend(SchemaDifference(name=i, problem="extra-object", harmful=False,
                                detail=f"index {i}, which no migration creates")
               for i in sorted(indexes - set(PG_INDEXES)))
    if "gc_session" not in gone and c.execute("SELECT 1 FROM gc_session").fetchone():
        out.append(SchemaDifference(name="gc_session", problem="gc-session-open",
                                    detail="gc_session holds a row outside any gc: the "
                                           "insert-only tables accept updates and deletes"))
    return out


def guard_trigger_def(table: str, verb: str) -> str:
    """``pg_get_triggerdef`` of the insert-only trigger on ``table`` for ``verb``: per row for
    UPDATE and DELETE (gc's session lets them through), per statement for TRUNCATE (never)."""
    if verb == "TRUNCATE":
        return (f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON public.{table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {TRUNCATE_FUNCTION}()")
    return (f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON public.{table} "
            f"FOR EACH ROW EXECUTE FUNCTION {GUARD_FUNCTION}()")
