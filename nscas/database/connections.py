"""The one seam between the store and its database: a DB-API connection of either engine, and
the pool that hands them out inside a read or a write transaction.

Both engines' connections take ``?`` placeholders and run in autocommit mode, so that ``BEGIN``
is the transaction: SQLite's ``sqlite3`` (nscas.database.sqlite) and psycopg 3
(nscas.database.postgres). Every statement they run is one of nscas.database.queries's or
nscas.database.writes's; SQLAlchemy is the schema's and the migrations' only (its import alone
costs more than a read command may take).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Protocol

from nscas.errors import StoreError

Dialect = Literal["sqlite", "postgresql"]


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What the queries use of a connection: ``sqlite3.Connection``'s names, on both engines."""

    dialect: Dialect

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor: ...
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...
    @property
    def in_transaction(self) -> bool: ...
    @property
    def broken(self) -> bool:
        """Whether the connection can run no more statements (the server ended it)."""
        ...
    def close(self) -> None: ...


class Engine(Protocol):
    """How to make a connection of one database, begin its transactions and say its errors."""

    errors: tuple[type[BaseException], ...]
    """What its connections raise."""
    retryable: tuple[type[BaseException], ...]
    """Errors a write transaction may simply run again (PostgreSQL's deadlock victim)."""

    def connect(self) -> Connection: ...
    def begin(self, c: Connection, *, write: bool) -> None: ...
    def error(self, exc: BaseException) -> StoreError:
        """What ``exc`` (one of :attr:`errors`) means for the store, in one line."""
        ...


class Pool:
    """Connections of one engine, reused across calls and threads. A pool rather than one
    connection per thread: a generator (a store's ``leaves``) may hold its transaction open
    while the same thread runs other reads."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connect: Callable[[], Connection] = engine.connect
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def read(self, *, snapshot: bool = True) -> Iterator[Connection]:
        """A connection inside a read transaction (``snapshot=False``: none, for a read of one
        statement, which is atomic on both engines); the engine's errors become the store's."""
        c = self._take()
        try:
            if c is None:
                c = self._connect()
            if snapshot:
                self.engine.begin(c, write=False)
            yield c
        except self.engine.errors as exc:
            raise self.engine.error(exc) from None
        finally:
            if c is not None:
                self.release(c)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A connection inside a write transaction, committed at the end of the block and rolled
        back if it raises; the engine's errors become the store's, but for :attr:`Engine.retryable`."""
        c = self._take()
        try:
            if c is None:
                c = self._connect()
            self.engine.begin(c, write=True)
            yield c
            c.execute("COMMIT")
        except self.engine.retryable:
            raise
        except self.engine.errors as exc:
            raise self.engine.error(exc) from None
        finally:
            if c is not None:
                self.release(c)

    def open(self) -> None:
        """Make a connection now, into the pool: a database that cannot be opened (or
        reached) fails here, in the store's words, not at the first statement."""
        try:
            c = self._connect()
        except self.engine.errors as exc:
            raise self.engine.error(exc) from None
        self.release(c)

    def _take(self) -> Connection | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def release(self, c: Connection) -> None:
        """Back into the pool, its transaction (if any is left open) rolled back; a connection
        that cannot roll back (the server closed it) is closed instead."""
        if c.broken:
            c.close()
            return
        if c.in_transaction:
            try:
                c.execute("ROLLBACK")
            except self.engine.errors:
                c.close()
                return
        with self._lock:
            keep = not self._closed
            if keep:
                self._idle.append(c)
        if not keep:
            c.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()
