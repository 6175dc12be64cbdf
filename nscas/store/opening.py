"""Opening a store: the one entry point that picks the reader or the writer.

``open_store(readonly=True)`` gives a :class:`~nscas.store.reading.StoreReader`, which imports no
SQLAlchemy; the writer, :class:`~nscas.store.writer.Store`, is imported only when asked for. Creating
or upgrading a store is the writer's (``nscas.store.writer.init_store``).
"""

from __future__ import annotations

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
    :class:`StoreReader`, which imports no SQLAlchemy; else the writer, :class:`Store`. Its
    ``store.toml``, if it has one, is read here once, for the command's whole run."""
    root = store_dir_of(path) if path is not None else find_store()
    config = read_config(root)
    if readonly:
        from nscas.store.reading import StoreReader

        return StoreReader(root, config)
    from nscas.store.writer import Store

    return Store(root, config=config)
