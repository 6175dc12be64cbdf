"""An SQLite store's connections, on the standard library's ``sqlite3``: read-only ones for the
reader (``mode=ro``, or ``immutable=1`` on a read-only mount), and the writer's, with nscas's
PRAGMAs and transactions that begin IMMEDIATE."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nscas.database.connections import Connection, Dialect
from nscas.database.revision import database_error
from nscas.errors import StoreError
from nscas.store.locating import BUSY_TIMEOUT_MS


class SqliteConnection(sqlite3.Connection):
    """``sqlite3.Connection``, naming its dialect for the queries that differ by engine."""

    dialect: Dialect = "sqlite"
    broken = False  # a file: no server to end it


class SqliteEngine:
    """The connections of the database at ``uri`` (a ``file:`` URI): read-only unless ``writer``."""

    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    retryable: tuple[type[BaseException], ...] = ()

    def __init__(self, uri: str, root: Path, *, writer: bool = False) -> None:
        self.uri = uri
        self.root = root
        self.writer = writer

    @classmethod
    def reader(cls, db: Path, root: Path, *, immutable: bool = False) -> SqliteEngine:
        return cls(f"{db.absolute().as_uri()}?mode=ro" + ("&immutable=1" if immutable else ""),
                   root)

    @classmethod
    def for_writes(cls, db: Path, root: Path) -> SqliteEngine:
        return cls(db.absolute().as_uri(), root, writer=True)

    def connect(self) -> SqliteConnection:
        # Autocommit mode, so that BEGIN is the transaction; the timeout is SQLite's busy
        # timeout (a reader waits only for a WAL checkpoint or recovery, if at all).
        c = sqlite3.connect(self.uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                            isolation_level=None, check_same_thread=False,
                            factory=SqliteConnection)
        if self.writer:
            try:
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("PRAGMA synchronous=FULL")
                c.execute("PRAGMA foreign_keys=ON")
            except BaseException:
                c.close()
                raise
        return c

    def begin(self, c: Connection, *, write: bool) -> None:
        # A writer takes the write lock at BEGIN: it never upgrades a read lock (and deadlocks).
        c.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def error(self, exc: BaseException) -> StoreError:
        assert isinstance(exc, sqlite3.Error)
        return database_error(exc, self.root)
