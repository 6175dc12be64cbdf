"""Opening a store: the one entry point that picks the reader or the writer.

``open_store(readonly=True)`` gives a :class:`~nscas.store.reading.StoreReader`, which imports no
SQLAlchemy; the writer, :class:`~nscas.store.writer.Store`, is imported only when asked for. Creating
or upgrading a store is the writer's (``nscas.store.writer.init_store``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from nscas.store.config import read_config
from nscas.store.locating import find_store, store_dir_of

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader
    from nscas.store.writer import Store


@overload
def open_store(path: Path | None = None, *, readonly: Literal[False] = False) -> Store: ...
@overload
def open_store(path: Path | None = None, *, readonly: bool) -> StoreReader: ...
def open_store(path: Path | None = None, *, readonly: bool = False) -> StoreReader:
    """The store at ``path`` (default: found upwards from here): with ``readonly`` a
    :class:`StoreReader`, which imports no SQLAlchemy; else the writer, :class:`Store`."""
    root = store_dir_of(path) if path is not None else find_store()
    if readonly:
        config = read_config(root)
        if config is None:
            from nscas.store.reading import StoreReader

            return StoreReader(root)
        from nscas.database import postgres

        postgres.connect_early(config.database)  # its server starts a session while we import
        try:
            from nscas.store.reading import StoreReader

            return StoreReader(root)  # takes that connection first
        finally:
            postgres.drop_early(config.database)  # unless the reader failed before it could
    from nscas.store.writer import Store

    return Store(root)


@contextmanager
def connecting(path: Path | None = None) -> Iterator[None]:
    """Start connecting to the team store at ``path`` (default: found upwards from here) now,
    for a reader opened inside this block to take: a read command enters it before it imports
    the code it runs, so that the server's start of a session overlaps those imports too. An
    SQLite store: nothing to do. A store that cannot be found or read is left for
    :func:`open_store` to report, as it does without this block; a connection that no reader
    took is closed at its end, without waiting for one still being made (``nscas log --help``
    is typer's to answer, at once, whether or not the server answers)."""
    try:
        root = store_dir_of(path) if path is not None else find_store()
        config = read_config(root)
    except Exception:  # whatever it is, open_store says it, in its own words
        config = None
    if config is None:
        yield
        return
    from nscas.database import postgres

    postgres.connect_early(config.database)
    try:
        yield
    finally:
        postgres.abandon_early(config.database)
