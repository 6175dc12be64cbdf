"""A team store's PostgreSQL database: connections for reads (libpq directly, as SQLite's reads
use ``sqlite3``), what its errors mean and its schema revision (the schema fsck compares is
nscas.database.pgschema's).

The reads in nscas.store.reading are written once, with ``?`` placeholders: :class:`PgConnection`
gives them the small part of ``sqlite3.Connection`` they use, over nscas.database.libpq (psycopg's import
alone takes longer than a read command may) or, where no libpq loads that way, over psycopg.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from nscas.database import libpq
from nscas.database.libpq import PgError, Rows
from nscas.errors import DamagedStore, ReadOnlyStore, StoreError
from nscas.redacting import redact

CONNECT_TIMEOUT_S = 10
# Every read connection's settings, whatever the URL says; UTF8, so that text decodes as such.
_OPTIONS = {"connect_timeout": str(CONNECT_TIMEOUT_S), "application_name": "nscas",
            "client_encoding": "UTF8"}
# A read sees one committed state of the store, as an SQLite read transaction in WAL mode does.
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_UNDEFINED_TABLE, _UNDEFINED_COLUMN = "42P01", "42703"
_READ_ONLY = frozenset({"25006", "42501"})  # read_only_sql_transaction, insufficient_privilege
_DISK_FULL = "53100"


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL of a libpq URL: the psycopg 3 driver."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


class Driver(Protocol):
    """One server connection in autocommit mode: nscas.database.libpq's, or :class:`_Psycopg`."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows: ...
    @property
    def ok(self) -> bool: ...
    @property
    def idle(self) -> bool: ...
    def close(self) -> None: ...


class PgConnection:
    """A read connection that reads like ``sqlite3.Connection``: ``execute`` with ``?``
    placeholders (its rows fetched at once), ``in_transaction``, ``rollback``, ``close``; every
    error a :class:`~nscas.database.libpq.PgError`. ``BEGIN`` opens a REPEATABLE READ READ ONLY
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
    """The same reads through psycopg, for where nscas.database.libpq finds no libpq to load."""

    def __init__(self, url: str) -> None:
        import psycopg  # only here: its import alone is what nscas.database.libpq avoids

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
    """A psycopg error (the writer's, through SQLAlchemy) as nscas.database.libpq's: the same fields."""
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
        self._lock = threading.Lock()
        self._abandoned = False
        self.thread = threading.Thread(target=self._run, args=(url,), name="nscas-connect",
                                       daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        try:
            if libpq.load() is not None:  # else connect() reads through psycopg, in its thread
                conn = PgConnection(url)
                with self._lock:
                    self.conn = conn
                    if self._abandoned:
                        conn.close()
        except BaseException as exc:  # raised where the connection is claimed
            self.error = exc

    def abandon(self) -> None:
        """Close the connection now if it is made, else as soon as it is: without waiting."""
        with self._lock:
            self._abandoned = True
            if self.conn is not None:
                self.conn.close()


_early: dict[str, _Early] = {}
_early_lock = threading.Lock()  # readers may open in several threads (the UI's server)


def connect_early(url: str) -> None:
    """Start connecting to ``url`` now, in a thread; the next :func:`connect` to it takes that
    connection. A read command calls this before it imports the reading code, so that loading
    libpq and the server's start of a session (a backend process, authentication) overlap that
    import: both run without the interpreter lock (ctypes releases it). Where libpq does not
    load, the thread makes nothing and :func:`connect` connects through psycopg itself (its
    import, in a thread, would hold the lock the whole time). The caller ends with
    :func:`drop_early`, whether or not a connect took the connection."""
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


def abandon_early(url: str) -> None:
    """:func:`drop_early` without waiting for a connection still being made: its thread closes
    it when it is (a server that is down would hold the caller for ``connect_timeout``)."""
    with _early_lock:
        early = _early.pop(url, None)
    if early is not None:
        early.abandon()


def connect(url: str, root: Path) -> PgConnection:
    """A read connection (the one :func:`connect_early` made, if it did), or the store's
    one-line error (unreachable, wrong password, ...)."""
    with _early_lock:
        early = _early.pop(url, None)
    try:
        if early is None:
            return PgConnection(url)
        early.thread.join()
        if early.error is not None:
            raise early.error  # a PgError becomes the store's line below; any other as it is
        return early.conn or PgConnection(url)  # no libpq loaded: through psycopg, here
    except PgError as exc:
        raise database_error(exc, root, url) from None


ERRORS = (PgError,)
"""What a :class:`PgConnection` raises."""


def database_error(exc: BaseException, root: Path, url: str | None = None) -> StoreError:
    """What an error PostgreSQL (or the connection to it) raised means, in one line: ``exc``
    is a :class:`~nscas.database.libpq.PgError` or, from the writer, a psycopg error."""
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
