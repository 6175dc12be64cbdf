"""The seams of the store: everything the layers above it (the checkpoint layer, runs, recipes,
bundle, remotes, signing, the UI) may ask of it. :class:`nscas.store.reading.StoreReader` is an
:class:`ObjectReader`; :class:`nscas.store.writer.Store` is both, an :class:`ObjectStore`.

Code above the store names these, not the classes, so that another implementation (a view of
some closures, a remote store) can stand in for them; mypy checks that the classes conform
wherever one is handed over (``RunContext(store=...)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.reading import Link, ObjectInfo, RefEntry


class Unread(Enum):
    """A leaf's base not read with it: ``read_leaf`` then reads it from the leaf's row."""

    UNREAD = "unread"


UNREAD = Unread.UNREAD


class ObjectFacts(Protocol):
    """What a tree/1 entry needs of each object: its row and its SHA-256 (a store, or bytes
    about to be stored)."""

    def info(self, oid: Digest) -> ObjectInfo: ...
    def sha256(self, oid: Digest) -> str: ...


class ObjectReader(ObjectFacts, Protocol):
    """The read side of the store."""

    @property
    def root(self) -> Path:
        """The store's directory (a team store's holds its store.toml)."""
        ...

    # Objects
    def has(self, oid: Digest) -> bool: ...
    def resolve(self, text_: str) -> Digest:
        """An ID from a full ID, a unique prefix or a ref name (a CLI argument)."""
        ...
    def get_bytes(self, oid: Digest) -> bytes: ...
    def get_record(self, oid: Digest) -> dict[str, Any]: ...
    def get_records(self, ids: Iterable[Digest]) -> dict[Digest, dict[str, Any]]: ...
    def open(self, oid: Digest) -> BinaryIO: ...
    def materialise(self, oid: Digest, dest: Path) -> None: ...
    def part_ids(self, oid: Digest) -> list[tuple[int, Digest]]: ...
    def leaves(self, oid: Digest) -> Iterator[tuple[Digest, str, bytes | None, int, Digest | None]]:
        """(ID, codec, inline bytes or None, recorded size, the base its row names) of each
        leaf, in order: what ``read_leaf`` takes."""
        ...
    def read_leaf(self, oid: Digest, codec: str, inline: bytes | None, size: int,
                  base: Digest | Unread | None = UNREAD) -> bytes: ...
    def kinds_of(self, ids: Iterable[Digest]) -> dict[Digest, str | None]: ...
    def log(self, *, kind: str | None = None, limit: int = 20,
            before: int | None = None) -> list[ObjectInfo]: ...

    # Links
    def links_from(self, oid: Digest) -> list[Link]: ...
    def links_to(self, oid: Digest, limit: int | None = None) -> list[Link]: ...
    def closure(self, roots: Iterable[Digest], *, with_parts: bool = False,
                with_bases: bool | None = None) -> set[Digest]: ...

    # Refs
    def ref_get(self, name: str) -> Digest | None: ...
    def ref_list(self, prefix: str = "") -> list[tuple[str, Digest]]: ...
    def ref_log(self, name: str | None = None, limit: int | None = None) -> list[RefEntry]: ...


class ObjectWriter(Protocol):
    """The write side of the store: objects and records go in, IDs come out."""

    def put_bytes(self, data: bytes) -> Digest: ...
    def put_file(self, path: Path, *, base: Digest | None = None) -> Digest:
        """A file; with ``base`` (its earlier version, stored) pieces may be stored as deltas."""
        ...
    def put_tree(self, path: Path, *, base: Digest | None = None) -> Digest:
        """A directory as tree/1; with ``base`` (a stored tree/1) files matched by path."""
        ...
    def put_record(self, value: dict[str, Any]) -> Digest: ...
    def put_records(self, values: Iterable[dict[str, Any]]) -> list[Digest]: ...
    def put_whole(self, oid: Digest, part_list: list[tuple[int, Digest]], *,
                  sha256: str | None) -> None:
        """An object of parts the store holds, ``oid`` checked by the caller (a push, a pull)."""
        ...
    def ref_set(self, name: str, target: Digest, *, expect: Digest | None = ...,
                message: str = "") -> None:
        """Point ``name`` at ``target``; with ``expect``, only if it still holds that value."""
        ...


class ObjectStore(ObjectReader, ObjectWriter, Protocol):
    """Both sides: what a recipe is handed (``RunContext.store``)."""


def tree_record(store: ObjectFacts, files: Mapping[str, Digest]) -> dict[str, Any]:
    """The tree/1 record value (docs/format.md §3.1) of stored objects by relative path: the
    one builder of tree/1 entries."""
    entries: dict[str, dict[str, Any]] = {}
    for path in sorted(files):
        oid = files[path]
        entries[path] = {"id": str(oid), "size": store.info(oid).size, "sha256": store.sha256(oid)}
    return {"nscas": "tree/1", "entries": entries}
