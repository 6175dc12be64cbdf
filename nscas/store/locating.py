"""Where a store is and what its refs may be called (the schema version: nscas.database.revision).

The standard library only: readers and writers both start here, and a reader must
not pay for importing SQLAlchemy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from nscas.errors import InvalidInput, StoreError

if TYPE_CHECKING:
    import sqlite3

STORE_DIR = ".nscas"
DB_NAME = "nscas.db"
CONFIG_NAME = "store.toml"  # a team store's config (nscas.store.config): PostgreSQL + object storage
ENV_VAR = "NSCAS_STORE"
CEILING_VAR = "NSCAS_CEILING_DIRECTORIES"  # where the search upwards stops (like git's)
BUSY_TIMEOUT_MS = 60_000
REF_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
HEXISH = re.compile(r"(blake3:)?[0-9a-f]{8,}")
TAG_PREFIX = "tags/"  # refs named so never move once set


def is_tag(name: str) -> bool:
    return name.startswith(TAG_PREFIX)


def find_store(start: Path | None = None) -> Path:
    """The store directory: ``$NSCAS_STORE`` (a store directory, a directory holding
    ``.nscas``, or a team store's ``store.toml``), else ``.nscas`` here or in a parent, up to
    the nearest ceiling of ``$NSCAS_CEILING_DIRECTORIES`` (searched, never gone above)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return store_dir_of(Path(env))
    here = (start or Path.cwd()).resolve()
    ceilings = ceiling_directories()
    searched = here
    for d in (here, *here.parents):
        searched = d
        if is_store_dir(d / STORE_DIR):
            return d / STORE_DIR
        if d in ceilings:
            raise StoreError(f"no nscas store in {here} or its parents up to {d} (the ceiling "
                             f"{CEILING_VAR} sets); run 'nscas init' or pass --store")
    raise StoreError(f"no nscas store in {here} or any parent directory up to {searched} "
                     "(run 'nscas init' or pass --store)")


def ceiling_directories() -> frozenset[Path]:
    """The directories of ``$NSCAS_CEILING_DIRECTORIES`` (``os.pathsep``-separated, like
    ``GIT_CEILING_DIRECTORIES``), resolved; an empty or relative entry is ignored."""
    entries = os.environ.get(CEILING_VAR, "").split(os.pathsep)
    return frozenset(Path(e).resolve() for e in entries if e and os.path.isabs(e))


def store_dir_of(path: Path) -> Path:
    """Accept a store directory, a directory holding ``.nscas``, or a ``store.toml``."""
    if path.name == CONFIG_NAME and path.is_file():
        return path.parent
    if is_store_dir(path):
        return path
    if is_store_dir(path / STORE_DIR):
        return path / STORE_DIR
    raise StoreError(f"{path} is not an nscas store (no {DB_NAME} or {CONFIG_NAME} in it or in "
                     f"{path / STORE_DIR})")


def is_store_dir(path: Path) -> bool:
    """Whether ``path`` holds an SQLite store's database or a team store's config."""
    return (path / DB_NAME).is_file() or (path / CONFIG_NAME).is_file()


def store_writable(root: Path) -> bool:
    """Whether this process may write the store at ``root``: its directory (chunk files, and
    SQLite's ``-wal`` and ``-shm`` files) and its database. False on a read-only mount, for
    root too (``access`` reports EROFS whatever the permissions)."""
    if (root / CONFIG_NAME).is_file():  # a team store: the database says (ReadOnlyStore on write)
        return os.access(root, os.W_OK)
    return os.access(root, os.W_OK) and os.access(root / DB_NAME, os.W_OK)


def check_ref_name(name: str) -> None:
    if not REF_NAME.fullmatch(name) or ".." in name or len(name) > 255:
        raise InvalidInput(
            f"invalid ref name {name!r}: use letters, digits, '.', '_', '-' in '/'-separated parts"
        )
    if HEXISH.fullmatch(name):
        raise InvalidInput(f"invalid ref name {name!r}: it would read as an object ID prefix")


def immutable_open_ok(root: Path, exc: sqlite3.Error) -> bool:
    """Whether a read-only open that failed with ``exc`` may be retried ``immutable=1``.

    A WAL-mode database is read through its ``-shm`` file, which SQLite creates when missing;
    on a read-only mount (or a full disk) it cannot. ``immutable=1`` reads the database file
    alone, with no locks: right only when no commit waits in the ``-wal`` file, and when no
    writer has it open (every writer holds the ``-shm`` file, so none exists). A ``-wal`` with
    commits in it is refused: read without them, the store would look older than it is.
    """
    if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_CANTOPEN", "SQLITE_IOERR_SHMSIZE"):
        return False
    db = root / DB_NAME
    if Path(f"{db}-shm").exists():
        return False
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_CANTOPEN" and store_writable(root):
        return False  # not for want of a -shm file
    wal = Path(f"{db}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise StoreError(f"the store at {root} is read-only and commits wait in {wal.name}, which "
                         f"SQLite cannot read without {db.name}-shm; open the store once where it "
                         "is writable")
    return True
