"""An object's bytes out of a store: a stream that checks each leaf as it is read, and a blob or
a tree/1 written to a new file or directory (``nscas get``), never over what is there."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import DestinationExists, IntegrityError, NoSpace
from nscas.objects.digests import Digest, DualHasher

if TYPE_CHECKING:
    from nscas.database.rows import ObjectInfo
    from nscas.store.reading import StoreReader


class LeafReader(io.RawIOBase):
    """The bytes of an object, leaf after leaf, the whole checked against its ID at the end."""

    def __init__(self, store: StoreReader, oid: Digest) -> None:
        self._it = store.leaves(oid)
        self._store = store
        self._buf = b""
        self._pos = 0
        self._hasher = DualHasher()
        self._oid = oid
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while self._pos >= len(self._buf):
            nxt = next(self._it, None)
            if nxt is None:
                if not self._done:
                    self._done = True
                    if self._hasher.digest() != self._oid:
                        raise IntegrityError(f"object {self._oid}", str(self._oid), str(self._hasher.digest()))
                return 0
            self._buf = self._store.read_leaf(*nxt)
            self._hasher.update(self._buf)
            self._pos = 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        return n


def materialise(store: StoreReader, oid: Digest, dest: Path) -> None:
    """Write a blob to a new file, or a tree/1 to a new (or empty) directory; never
    overwrite."""
    info = store.info(oid)
    if dest.is_symlink() or dest.exists():
        empty = dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir())
        if not (empty and info.kind == "tree/1"):
            raise DestinationExists(str(dest) if empty or not dest.is_dir()
                                    else f"{dest} (a directory that is not empty)")
    try:
        _materialise(store, oid, info, dest)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpace(str(dest.parent)) from None
        raise


def _materialise(store: StoreReader, oid: Digest, info: ObjectInfo, dest: Path) -> None:
    import tempfile  # only ``get`` needs it (3 ms of imports for every other read command)

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".nscas-get-", dir=dest.parent))
    try:
        if info.kind == "tree/1":
            out = tmp / "tree"
            out.mkdir()
            record = store.get_record(oid)
            for rel, entry in sorted(record["entries"].items()):
                target = out / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_blob(store, Digest.parse(entry["id"]), target)
        else:
            out = tmp / "blob"
            _write_blob(store, oid, out)
        try:
            os.replace(out, dest)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # filled meanwhile
                raise DestinationExists(str(dest)) from None
            raise
    finally:
        import shutil  # only writing a directory out needs it

        shutil.rmtree(tmp, ignore_errors=True)


def _write_blob(store: StoreReader, oid: Digest, target: Path) -> None:
    h = DualHasher()
    with target.open("wb") as f:
        for leaf in store.leaves(oid):
            chunk = store.read_leaf(*leaf)
            h.update(chunk)
            f.write(chunk)
    if h.digest() != oid:
        raise IntegrityError(f"object {oid}", str(oid), str(h.digest()))
