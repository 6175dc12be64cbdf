"""Where a store is, what its refs may be called, and which schema version it has.

The standard library only (``sqlite3``): readers and writers both start here, and a reader must
not pay for importing SQLAlchemy.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from nscas.errors import InvalidInput, StoreError

STORE_DIR = ".nscas"
DB_NAME = "nscas.db"
ENV_VAR = "NSCAS_STORE"
# The alembic revision this code was written for; tests keep it equal to the migrations' head.
SCHEMA_HEAD = "0002_lineage_indexes"
BUSY_TIMEOUT_MS = 60_000
REF_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
HEXISH = re.compile(r"(blake3:)?[0-9a-f]{8,}")


def find_store(start: Path | None = None) -> Path:
    """The store directory: ``$NSCAS_STORE``, else ``.nscas`` here or in a parent."""
    env = os.environ.get(ENV_VAR)
    if env:
        return store_dir_of(Path(env))
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / STORE_DIR / DB_NAME).is_file():
            return d / STORE_DIR
    raise StoreError("no nscas store here or in any parent directory (run 'nscas init' or pass --store)")


def store_dir_of(path: Path) -> Path:
    """Accept either a store directory or a directory holding ``.nscas``."""
    if (path / DB_NAME).is_file():
        return path
    if (path / STORE_DIR / DB_NAME).is_file():
        return path / STORE_DIR
    raise StoreError(f"{path} is not an nscas store (no {DB_NAME} in it or in {path / STORE_DIR})")


def check_ref_name(name: str) -> None:
    if not REF_NAME.fullmatch(name) or ".." in name or len(name) > 255:
        raise InvalidInput(
            f"invalid ref name {name!r}: use letters, digits, '.', '_', '-' in '/'-separated parts"
        )
    if HEXISH.fullmatch(name):
        raise InvalidInput(f"invalid ref name {name!r}: it would read as an object ID prefix")


def newer_schema(rev: str, where: Path) -> StoreError:
    """The error for a store whose schema a newer nscas wrote."""
    return StoreError(f"store {where} has schema version {rev!r}, newer than this nscas knows "
                      f"({SCHEMA_HEAD!r}); upgrade nscas")


def schema_revision(c: sqlite3.Connection) -> str | None:
    """The store's alembic revision, or None before its first migration."""
    if c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                 "AND name = 'alembic_version'").fetchone() is None:
        return None
    row = c.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


def check_revision(c: sqlite3.Connection, where: Path) -> None:
    """Refuse a store of another schema version than this code's."""
    rev = schema_revision(c)
    if rev is None:
        raise StoreError(f"{where} is not an initialised nscas store (run 'nscas init')")
    if rev != SCHEMA_HEAD:
        # alembic (and SQLAlchemy under it) only on this error path.
        from nscas.db import known_revisions

        if rev not in known_revisions():
            raise newer_schema(rev, where)
        raise StoreError(f"store {where} has schema version {rev!r}; run 'nscas init --upgrade'")
