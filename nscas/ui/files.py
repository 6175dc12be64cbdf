"""A folder's files for download: the entries of a ``tree/1`` (a checkpoint's ``files``), and
the folder as one tar archive produced piece by piece.

The archive is a POSIX (pax) tar written with ``tarfile``'s own headers: each entry's header,
then its bytes read from the store a block at a time, then zeros to the next 512-byte
boundary, and two zero blocks at the end. Its length is known before the first byte (the
headers are small and the objects' sizes are the store's), so a download carries a
``Content-Length`` and needs no more memory than one block, whatever the folder's size.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from nscas.errors import InvalidInput, NotFound
from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader

BLOCK = tarfile.BLOCKSIZE
END = b"\0" * (2 * BLOCK)
"""The end-of-archive marker: two zero blocks."""
FOLDER_KINDS = ("checkpoint/1", "tree/1")


class NotAFolder(InvalidInput):
    """The object asked for as files is neither a tree nor a checkpoint."""

    def __init__(self, oid: Digest, kind: str | None) -> None:
        super().__init__(f"{oid} is {'a ' + kind if kind else 'a blob'}, not a folder: only "
                         "a checkpoint/1 or a tree/1 downloads as files")
        self.oid = oid
        self.kind = kind


@dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    path: str
    """The entry's relative POSIX path in its tree."""
    id: Digest
    size: int
    """The object's size as the store holds it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Folder:
    """The files a download holds: the tree's entries, in path order."""

    tree: Digest
    name: str
    """The archive's top folder and file name: ``<kind>-<16 hex>``."""
    entries: tuple[FileEntry, ...]

    def entry(self, path: str) -> FileEntry:
        found = next((e for e in self.entries if e.path == path), None)
        if found is None:
            raise NotFound(f"file {path[:200]!r} in tree {self.tree}")
        return found

    def headers(self) -> Iterator[tuple[bytes, FileEntry]]:
        """Each entry's tar header (pax when a name needs it), with the entry."""
        for e in self.entries:
            info = tarfile.TarInfo(f"{self.name}/{e.path}")
            info.size, info.mode, info.mtime = e.size, 0o644, 0
            yield info.tobuf(tarfile.PAX_FORMAT, encoding="utf-8", errors="strict"), e

    def tar_size(self) -> int:
        """The archive's length in bytes."""
        return sum(len(h) + _padded(e.size) for h, e in self.headers()) + len(END)


def folder(store: ObjectReader, oid: Digest) -> Folder:
    """The files of ``oid``: a checkpoint's ``files`` tree, or a tree itself. Every entry must
    be held by the store and have a safe relative path (a hostile store's ``../x`` is refused,
    not written into anyone's archive)."""
    kind = store.info(oid).kind
    if kind not in FOLDER_KINDS:
        raise NotAFolder(oid, kind)
    record = store.get_record(oid)
    tree = Digest.parse(record["files"]) if kind == "checkpoint/1" else oid
    entries: dict[str, Any] = store.get_record(tree).get("entries", {})
    ids = {path: Digest.parse(body["id"]) for path, body in sorted(entries.items())}
    out = []
    for path, fid in ids.items():
        if not safe_path(path):
            raise InvalidInput(f"tree {tree} names the file {path[:200]!r}, which is not a "
                               "relative path inside the folder")
        if not store.has(fid):
            raise NotFound(f"{fid} (the file {path[:200]!r} of tree {tree})")
        out.append(FileEntry(path=path, id=fid, size=store.info(fid).size))
    return Folder(tree=tree, name=f"{kind.partition('/')[0]}-{oid.hex[:16]}",
                  entries=tuple(out))


def safe_path(path: str) -> bool:
    """docs/format.md §3.1's rule for a tree path: relative POSIX, no empty, ``.`` or ``..``
    part, no backslash, no NUL."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file system can name it
        return False
    parts = path.split("/")
    return (bool(path) and not path.startswith("/") and "\\" not in path and "\0" not in path
            and all(p not in ("", ".", "..") for p in parts)
            and PurePosixPath(path).as_posix() == path)


def padding(size: int) -> bytes:
    """The zeros after ``size`` bytes of an entry, up to the next block boundary."""
    return b"\0" * (_padded(size) - size)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
