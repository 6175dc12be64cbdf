"""A read connection to PostgreSQL over libpq itself, bound through ctypes.

Why hand-bound: a read command (``log``, ``lineage``) may take 0.2 s in all, and importing
psycopg alone takes 0.2-0.5 s on the dev VM (psycopg.pq, its error classes, asyncio, ssl);
ctypes and libpq load in about 10 ms. libpq is the C library psycopg wraps, the one that speaks
PostgreSQL's protocol (authentication, TLS, ``connect_timeout``, ``.pgpass``, service files);
this module binds only the calls a read needs and converts text results by type. Parameters go
as text values of ``PQexecParams`` (one statement, never SQL formatted with values).

The library is the system's ``libpq.so.5`` or the copy psycopg's wheel carries (found without
importing psycopg); :func:`load` returns None where neither loads, and nscas.database.postgres then reads
through psycopg. Writes stay on SQLAlchemy + psycopg.
"""

from __future__ import annotations

import binascii
import ctypes
import os
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

_P = ctypes.c_void_p
_CONNECTION_OK = 0
_PGRES_COMMAND_OK, _PGRES_TUPLES_OK = 1, 2
_TRANS_IDLE = 0
_DIAG_SQLSTATE, _DIAG_MESSAGE_PRIMARY = ord("C"), ord("M")
# The SQLSTATE classes psycopg raises as OperationalError (psycopg.errors._base_exc_map): the
# server or the connection to it failed, not the statement. No SQLSTATE at all: the same.
_OPERATIONAL = frozenset({"08", "27", "28", "2F", "38", "39", "3B", "40", "53", "54", "55", "57",
                          "58"})
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "PQconnectdbParams": (_P, [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p),
                               ctypes.c_int]),
    "PQstatus": (ctypes.c_int, [_P]),
    "PQerrorMessage": (ctypes.c_char_p, [_P]),
    "PQfinish": (None, [_P]),
    "PQtransactionStatus": (ctypes.c_int, [_P]),
    "PQsetNoticeProcessor": (_P, [_P, _P, _P]),
    "PQexecParams": (_P, [_P, ctypes.c_char_p, ctypes.c_int, _P, ctypes.POINTER(ctypes.c_char_p),
                          _P, _P, ctypes.c_int]),
    "PQresultStatus": (ctypes.c_int, [_P]),
    "PQresultErrorMessage": (ctypes.c_char_p, [_P]),
    "PQresultErrorField": (ctypes.c_char_p, [_P, ctypes.c_int]),
    "PQntuples": (ctypes.c_int, [_P]),
    "PQnfields": (ctypes.c_int, [_P]),
    "PQftype": (ctypes.c_uint, [_P, ctypes.c_int]),
    # Text-format values end in NUL and hold none (bytea comes as hex): c_char_p reads them.
    "PQgetvalue": (ctypes.c_char_p, [_P, ctypes.c_int, ctypes.c_int]),
    "PQgetisnull": (ctypes.c_int, [_P, ctypes.c_int, ctypes.c_int]),
    "PQclear": (None, [_P]),
    "PQunescapeBytea": (_P, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]),
    "PQfreemem": (None, [_P]),
}
# libpq prints notices (a WARNING from the server) on stderr unless told otherwise; only the CLI
# prints, so they are dropped, as psycopg sends them to logging. Kept here: C holds a pointer.
_DROP_NOTICE = ctypes.CFUNCTYPE(None, _P, ctypes.c_char_p)(lambda _arg, _message: None)


class PgError(Exception):
    """An error of PostgreSQL or of the connection to it: ``operational`` when the server or the
    connection failed (unreachable, wrong password, shut down) rather than the statement."""

    def __init__(self, message: str, *, sqlstate: str | None, operational: bool) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.operational = operational


def _candidates() -> Iterator[str]:
    """Where libpq may be, cheapest first: the dynamic loader's own search, the copy in
    psycopg's binary wheel, then ctypes.util's search (20 ms of imports, so last)."""
    yield "libpq.so.5"
    yield "libpq.5.dylib"
    from importlib.util import find_spec

    spec = find_spec("psycopg_binary")  # finds the package without importing it
    if spec is not None and spec.origin is not None:
        package = Path(spec.origin).parent  # the wheel's libraries: Linux's, then macOS's
        yield from sorted(str(p) for p in package.parent.glob("psycopg_binary.libs/libpq*.so*"))
        yield from sorted(str(p) for p in package.glob(".dylibs/libpq*.dylib"))
    import ctypes.util

    found = ctypes.util.find_library("pq")
    if found:
        yield found


@cache
def _dl() -> ctypes.CDLL | None:
    """The C library's ``dlopen`` and ``dlerror``, or None where the process has none."""
    try:
        dl = ctypes.CDLL(None)  # what the process has loaded: the C library's own functions
        dl.dlopen.restype, dl.dlopen.argtypes = _P, [ctypes.c_char_p, ctypes.c_int]
        dl.dlerror.restype, dl.dlerror.argtypes = ctypes.c_char_p, []
    except (OSError, AttributeError, TypeError):
        return None
    return dl


def _open(name: str) -> ctypes.CDLL:
    """``ctypes.CDLL(name)``, the library loaded by a call to the C library's ``dlopen``:
    ctypes releases the interpreter lock during a foreign call, but holds it while
    ``ctypes.CDLL`` loads a library. Loading libpq and the 20-odd libraries it needs takes
    longer than anything else a read command's connection thread does before it connects
    (nscas.database.postgres.connect_early), and the command's own thread waits for the lock that long
    unless the loading runs without it."""
    dl = _dl()
    if dl is None:
        return ctypes.CDLL(name)
    handle = dl.dlopen(name.encode(), os.RTLD_NOW | ctypes.DEFAULT_MODE)  # what CDLL asks for
    if not handle:
        raise OSError((dl.dlerror() or b"cannot load " + name.encode()).decode(errors="replace"))
    return ctypes.CDLL(name, handle=handle)


@cache
def load() -> ctypes.CDLL | None:
    """libpq with every function this module calls declared, or None where none loads."""
    for name in _candidates():
        try:
            lib = _open(name)
            for func, (restype, argtypes) in _SIGNATURES.items():
                f = getattr(lib, func)
                f.restype, f.argtypes = restype, argtypes
        except (OSError, AttributeError):  # not there, or too old to have a function we call
            continue
        return lib
    return None


def _bytea(value: bytes) -> bytes:
    if value.startswith(b"\\x"):  # bytea_output = hex, PostgreSQL's default
        return binascii.unhexlify(value[2:])
    lib = load()  # bytea_output = escape: libpq's own decoder
    assert lib is not None
    size = ctypes.c_size_t()
    p = lib.PQunescapeBytea(value, ctypes.byref(size))
    if not p:
        raise MemoryError("PQunescapeBytea")
    try:
        return ctypes.string_at(p, size.value)
    finally:
        lib.PQfreemem(p)


def _text(value: bytes) -> str:
    return value.decode()


# Type OID -> what psycopg returns for it, for every type nscas's reads produce (bpchar IDs,
# varchar and text, name from the catalogs, integers, double precision, bytea) and a few more.
_CONVERT: dict[int, Callable[[bytes], Any]] = {
    16: lambda v: v == b"t", 17: _bytea, 18: _text, 19: _text, 25: _text, 1042: _text,
    1043: _text, 20: int, 21: int, 23: int, 26: int, 700: float, 701: float,
}


def _param(value: Any) -> bytes | None:
    """A parameter as PostgreSQL's text input for it (the server infers its type)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        return repr(value).replace("inf", "Infinity").encode()  # 'nan' reads as NaN
    if isinstance(value, bytes | bytearray | memoryview):
        return b"\\x" + binascii.hexlify(value)
    raise TypeError(f"no PostgreSQL text form for a parameter of type {type(value).__name__}")


def numbered(sql: str) -> str:
    """``?`` placeholders as libpq's ``$1, $2, ...`` (nscas's SQL has no ``?`` in literals)."""
    parts = sql.split("?")
    return "".join(f"{p}${i}" for i, p in enumerate(parts[:-1], 1)) + parts[-1]


class Rows:
    """A statement's rows, all fetched: the part of a cursor the reads use."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


class Connection:
    """One libpq connection in autocommit mode (each statement commits unless a BEGIN is open)."""

    def __init__(self, lib: ctypes.CDLL, url: str, options: dict[str, str]) -> None:
        self._lib = lib
        self._conn: int | None = None
        # The URL first, expanded by libpq (expand_dbname); the options after it override it.
        keys = [b"dbname", *(k.encode() for k in options), None]
        values = [url.encode(), *(v.encode() for v in options.values()), None]
        conn = lib.PQconnectdbParams((ctypes.c_char_p * len(keys))(*keys),
                                     (ctypes.c_char_p * len(values))(*values), 1)
        if not conn:
            raise MemoryError("PQconnectdbParams")
        if lib.PQstatus(conn) != _CONNECTION_OK:
            message = _first_line(lib.PQerrorMessage(conn))
            lib.PQfinish(conn)
            raise PgError(f"connection failed: {message}", sqlstate=None, operational=True)
        lib.PQsetNoticeProcessor(conn, ctypes.cast(_DROP_NOTICE, _P), None)
        self._conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        """Run one statement with ``?`` placeholders; its rows (none for a command)."""
        if not self._conn:
            raise PgError("the connection is closed", sqlstate=None, operational=True)
        lib = self._lib
        values = (ctypes.c_char_p * max(len(args), 1))(*map(_param, args))
        res = lib.PQexecParams(self._conn, numbered(sql).encode(), len(args), None, values,
                               None, None, 0)
        if not res:  # out of memory, or the connection is gone
            raise PgError(_first_line(lib.PQerrorMessage(self._conn)), sqlstate=None,
                          operational=True)
        try:
            status = lib.PQresultStatus(res)
            if status == _PGRES_COMMAND_OK:
                return Rows([])
            if status != _PGRES_TUPLES_OK:
                raise self._error(res)
            return Rows(self._rows(res))
        finally:
            lib.PQclear(res)

    def _rows(self, res: int) -> list[tuple[Any, ...]]:
        lib = self._lib
        get, isnull = lib.PQgetvalue, lib.PQgetisnull
        columns = range(lib.PQnfields(res))
        converts = []
        for c in columns:
            oid = lib.PQftype(res, c)
            if oid not in _CONVERT:
                raise TypeError(f"no conversion for PostgreSQL type OID {oid} (column {c})")
            converts.append((c, _CONVERT[oid]))
        # An empty value is either '' or NULL: only then is PQgetisnull asked.
        return [tuple(convert(v) if (v := get(res, r, c)) or not isnull(res, r, c) else None
                      for c, convert in converts)
                for r in range(lib.PQntuples(res))]

    def _error(self, res: int) -> PgError:
        lib = self._lib
        state = lib.PQresultErrorField(res, _DIAG_SQLSTATE)
        sqlstate = state.decode() if state else None
        primary = lib.PQresultErrorField(res, _DIAG_MESSAGE_PRIMARY)
        message = (primary.decode(errors="replace") if primary
                   else _first_line(lib.PQresultErrorMessage(res) or lib.PQerrorMessage(self._conn)))
        return PgError(message, sqlstate=sqlstate,
                       operational=sqlstate is None or sqlstate[:2] in _OPERATIONAL)

    @property
    def ok(self) -> bool:
        """Open, and not broken (a server gone away leaves the connection bad)."""
        return bool(self._conn) and self._lib.PQstatus(self._conn) == _CONNECTION_OK

    @property
    def idle(self) -> bool:
        """No transaction open (nor a statement running)."""
        return not self._conn or self._lib.PQtransactionStatus(self._conn) == _TRANS_IDLE

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn:
            self._lib.PQfinish(conn)

    def __del__(self) -> None:
        self.close()


def _first_line(message: bytes | None) -> str:
    """libpq's message, first line, spaces collapsed (``FATAL:  password ...``)."""
    text_ = (message or b"").decode(errors="replace").strip()
    return " ".join(text_.splitlines()[0].split()) if text_ else "unknown error"


def connect(url: str, options: dict[str, str]) -> Connection | None:
    """A connection over libpq, or None where libpq cannot be loaded (the caller falls back)."""
    lib = load()
    return None if lib is None else Connection(lib, url, options)

