"""The store's schema version: the one module that knows it, how to read it and what to refuse.

The standard library only (``sqlite3``) at import: readers check the version at open and must
not pay for SQLAlchemy; alembic is imported only to list the known revisions, on error paths and
by the writer (nscas.db).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nscas.errors import StoreError

SCHEMA_HEAD = "0003_lazy_sha256"
"""The alembic revision this code was written for; tests keep it equal to the migrations' head."""


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
        if rev not in known_revisions():  # alembic only on this error path
            raise newer_schema(rev, where)
        raise StoreError(f"store {where} has schema version {rev!r}; run 'nscas init --upgrade'")


def refuse_newer(db: Path, where: Path) -> None:
    """Before alembic upgrades a store: refuse one that a newer nscas wrote."""
    c = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
    try:
        rev = schema_revision(c)
    finally:
        c.close()
    if rev is not None and rev not in known_revisions():
        raise newer_schema(rev, where)
