"""The seams of the store: what the layers above it (the checkpoint layer, the runner, recipes)
may ask of it. :class:`nscas.store.reading.StoreReader` is an :class:`ObjectReader`;
:class:`nscas.store.writer.Store` is both, an :class:`ObjectStore`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.reading import ObjectInfo


class ObjectReader(Protocol):
    """The read side of the store."""

    def has(self, oid: Digest) -> bool: ...
    def info(self, oid: Digest) -> ObjectInfo: ...
    def sha256(self, oid: Digest) -> str: ...
    def get_bytes(self, oid: Digest) -> bytes: ...
    def get_record(self, oid: Digest) -> dict[str, Any]: ...
    def open(self, oid: Digest) -> BinaryIO: ...
    def part_ids(self, oid: Digest) -> list[tuple[int, Digest]]: ...
    def materialise(self, oid: Digest, dest: Path) -> None: ...


class ObjectWriter(Protocol):
    """The write side of the store: objects and records go in, IDs come out."""

    def put_bytes(self, data: bytes) -> Digest: ...
    def put_file(self, path: Path) -> Digest: ...
    def put_tree(self, path: Path) -> Digest: ...
    def put_record(self, value: dict[str, Any]) -> Digest: ...


class ObjectStore(ObjectReader, ObjectWriter, Protocol):
    """Both sides: what a recipe is handed (``RunContext.store``)."""


def tree_record(store: ObjectReader, files: Mapping[str, Digest]) -> dict[str, Any]:
    """The tree/1 record value (docs/format.md §3.1) of stored objects by relative path: the
    one builder of tree/1 entries."""
    entries: dict[str, dict[str, Any]] = {}
    for path in sorted(files):
        oid = files[path]
        entries[path] = {"id": str(oid), "size": store.info(oid).size, "sha256": store.sha256(oid)}
    return {"nscas": "tree/1", "entries": entries}
