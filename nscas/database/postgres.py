"""A team store's PostgreSQL database on psycopg 3: its connections (the queries' ``?``
placeholders, autocommit mode so that ``BEGIN`` is the transaction), what its errors mean and its
schema revision (the schema fsck compares is nscas.database.pgschema's).

A read sees one committed state of the store, as an SQLite read transaction in WAL mode does:
REPEATABLE READ READ ONLY. A write runs READ COMMITTED; the store serialises what must be serial
with advisory locks (nscas.database.writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import make_conninfo

from nscas.database.connections import Connection, Cursor, Dialect
from nscas.errors import DamagedStore, ReadOnlyStore, StoreError
from nscas.redacting import redact

CONNECT_TIMEOUT_S = 10
# Every connection's settings, whatever the URL says; UTF8, so that text decodes as such.
_OPTIONS = {"connect_timeout": str(CONNECT_TIMEOUT_S), "application_name": "nscas",
            "client_encoding": "UTF8"}
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_UNDEFINED_TABLE, _UNDEFINED_COLUMN = "42P01", "42703"
_READ_ONLY = frozenset({"25006", "42501"})  # read_only_sql_transaction, insufficient_privilege
_DISK_FULL = "53100"


def sqlalchemy_url(url: str) -> str:
    """The SQLAlchemy URL of a libpq URL (for alembic): the psycopg 3 driver."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


class PgConnection:
    """A psycopg connection in autocommit mode that reads like ``sqlite3.Connection``:
    ``execute`` with ``?`` placeholders, ``executemany``, ``in_transaction``, ``close``."""

    dialect: Dialect = "postgresql"

    def __init__(self, url: str, *, settings: Mapping[str, str] | None = None) -> None:
        """``settings``: server settings of this session (``-c NAME=VALUE`` at its start)."""
        # The settings go into the conninfo (as connect would put them), not as keywords of
        # connect, whose own keywords (autocommit, context, ...) are typed otherwise.
        extra = {"options": " ".join(f"-c {k}={v}" for k, v in settings.items())} \
            if settings else {}
        self._c = psycopg.connect(make_conninfo(url, **_OPTIONS, **extra), autocommit=True)

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        # No statement of the queries holds a '?' or a '%' of its own: each is a placeholder.
        return self._c.execute(sql.replace("?", "%s"), tuple(args), prepare=False)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._c.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])

    @property
    def broken(self) -> bool:
        return self._c.closed or self._c.broken

    @property
    def in_transaction(self) -> bool:
        return (not self._c.closed
                and self._c.info.transaction_status != pq.TransactionStatus.IDLE)

    def close(self) -> None:
        self._c.close()


class PgEngine:
    """The connections of the database at ``url``, for the store at ``root``."""

    errors: tuple[type[BaseException], ...] = (psycopg.Error,)
    retryable: tuple[type[BaseException], ...] = (psycopg.errors.DeadlockDetected,)

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root

    def connect(self) -> Connection:
        """A connection, or the store's one-line error (unreachable, wrong password, ...)."""
        try:
            return PgConnection(self.url)
        except psycopg.Error as exc:
            raise self.error(exc) from None

    def begin(self, c: Connection, *, write: bool) -> None:
        c.execute("BEGIN" if write else _BEGIN_READ)

    def error(self, exc: BaseException) -> StoreError:
        return database_error(exc, self.root, self.url)


def database_error(exc: BaseException, root: Path, url: str | None = None) -> StoreError:
    """What an error PostgreSQL (or the connection to it) raised means, in one line."""
    assert isinstance(exc, psycopg.Error)
    message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    where = redact(url) if url else f"of the store {root}"
    if exc.sqlstate in _READ_ONLY:
        return ReadOnlyStore(str(root))
    if exc.sqlstate in (_UNDEFINED_TABLE, _UNDEFINED_COLUMN):
        return DamagedStore(str(root), message)
    if exc.sqlstate == _DISK_FULL:
        return StoreError(f"the database {where} has no space left: {message}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return StoreError(f"cannot reach the store database {where}: {message}")
    return StoreError(f"the store database {where} failed: {message}")


def schema_revision(c: Connection) -> str | None:
    """The store's alembic revision, or None before its first migration: one statement (the
    connection is in autocommit mode, so a missing table leaves no transaction to undo)."""
    try:
        row = c.execute("SELECT version_num FROM alembic_version").fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return row[0] if row else None
