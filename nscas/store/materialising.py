"""An object's bytes out of a store: a stream that checks each leaf as it is read, and a blob or
a tree/1 written to a new file or directory (``nscas get``), never over what is there.

Leaves decode a few at a time on threads of their own (zstd, numpy and BLAKE3 let go of the
GIL), in order, while the caller hashes and writes the ones before: a delta-coded checkpoint's
get then costs about its decoding spread over the cores, not the sum of its leaves. Memory stays
bounded: at most :data:`AHEAD` decoded leaves (each at most a leaf's size, with its base while
it decodes) wait at once.
"""

from __future__ import annotations

import errno
import io
import os
from collections import deque
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from nscas.errors import DestinationExists, IntegrityError, NoSpace
from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from concurrent.futures import Future

    from nscas.database.rows import ObjectInfo
    from nscas.store.reading import StoreReader

AHEAD = 4
"""Leaves decoded ahead of the one being read (and threads decoding them), at most."""

Leaf = tuple[Digest, str, bytes | None, int, Digest | None]


def decoded_leaves(store: StoreReader, leaves: list[Leaf], *,
                   ahead: int = AHEAD) -> Generator[bytes, None, None]:
    """The plain bytes of ``leaves`` in order, each checked against its ID; the first decodes
    here, the rest up to ``ahead`` at once on a pool, so that a reader of only the first leaf
    (a safetensors header) decodes no other."""
    if not leaves:
        return
    yield store.read_leaf(*leaves[0])
    rest = leaves[1:]
    if len(rest) <= 1 or ahead <= 1:
        for leaf in rest:
            yield store.read_leaf(*leaf)
        return
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(ahead, os.cpu_count() or 1, len(rest)))
    pool = ThreadPoolExecutor(workers, thread_name_prefix="nscas-leaf")
    pending: deque[Future[bytes]] = deque()
    todo = iter(rest)
    try:
        for leaf in todo:
            pending.append(pool.submit(store.read_leaf, *leaf))
            if len(pending) >= ahead:
                break
        while pending:
            data = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(store.read_leaf, *nxt))
            yield data
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _object_hash_needed(oid: Digest, leaves: list[Leaf]) -> bool:
    """False where the object is its one leaf: read_leaf checked exactly those bytes already."""
    return not (len(leaves) == 1 and leaves[0][0] == oid)


class LeafReader(io.RawIOBase):
    """The bytes of an object, leaf after leaf, the whole checked against its ID at the end."""

    def __init__(self, store: StoreReader, oid: Digest) -> None:
        leaves = list(store.leaves(oid))
        self._it = decoded_leaves(store, leaves)
        self._buf = memoryview(b"")
        self._pos = 0
        self._hasher = blake3.blake3(max_threads=blake3.blake3.AUTO) \
            if _object_hash_needed(oid, leaves) else None
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
                    self._check()
                return 0
            self._buf = memoryview(nxt)
            if self._hasher is not None:
                self._hasher.update(self._buf)
            self._pos = 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        return n

    def _check(self) -> None:
        if self._hasher is not None and self._hasher.hexdigest() != self._oid.hex:
            raise IntegrityError(f"object {self._oid}", str(self._oid),
                                 f"blake3:{self._hasher.hexdigest()}")

    def close(self) -> None:
        if not self.closed:
            self._it.close()  # stops the decoding ahead, if any
        super().close()


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
    leaves = list(store.leaves(oid))
    h = blake3.blake3(max_threads=blake3.blake3.AUTO) if _object_hash_needed(oid, leaves) else None
    with target.open("wb") as f:
        for chunk in decoded_leaves(store, leaves):
            if h is not None:
                h.update(chunk)
            f.write(chunk)
    if h is not None and h.hexdigest() != oid.hex:
        raise IntegrityError(f"object {oid}", str(oid), f"blake3:{h.hexdigest()}")
