"""Chunk files on disk (docs/format.md §5).

Only this module touches chunk files. A leaf object's bytes live in ``data/<2 hex>/<62 hex>``,
in one of the codecs of nscas.objects.codecs (raw, zstd, byte planes, XOR deltas to a base;
decoded by nscas.objects.decoding; files are cut into leaves by nscas.objects.segments).
Files are written to ``tmp/`` first,
fsync'ed, re-read and re-hashed, then renamed into place: a crash leaves a stray temporary
file (removed by ``gc`` once older than its minimum age) or a complete verified chunk, never a
partial one.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from nscas.errors import IntegrityError, StoreError
from nscas.objects.codecs import Base
from nscas.objects.decoding import (
    check_plain,
    decode_stream,
    plain_digest,
    read_capped,
)
from nscas.objects.digests import Digest, is_hex_id
from nscas.objects.durable import fsync_dir

INLINE_MAX = 4 << 10  # leaves this small live in the database row
_VERIFY_BLOCK = 4 << 20  # read-back block when re-hashing a chunk file just written


class ChunkBackend(Protocol):
    """Where leaf objects' bytes live: :class:`ChunkFiles` (a directory, local or shared) or
    :class:`nscas.store.s3.S3Chunks` (an S3 prefix). Every write goes to a temporary name, is
    verified, then published; every read is checked against the ID. ``size`` is the plain size
    the leaf's row records: no read or check decodes more than that (:func:`plain_blocks`).
    Leaves are named by their :class:`Digest`; hex appears only in file names and keys."""

    def ensure(self) -> None: ...
    def exists(self, oid: Digest) -> bool: ...
    def write(self, oid: Digest, stored: bytes | memoryview, codec: str, *, size: int,
              written: Callable[[], object] = ..., sha256: bool = True,
              base: Base | None = None) -> str | None: ...
    def read(self, oid: Digest, codec: str, size: int, *, base: Base | None = None) -> bytes: ...
    def read_stored(self, oid: Digest, size: int) -> bytes: ...
    def verify(self, oid: Digest, codec: str, size: int, *,
               base: Base | None = None) -> tuple[Digest, int]: ...
    def stored_size(self, oid: Digest) -> int | None: ...
    def location(self, oid: Digest) -> str: ...
    def remove(self, oid: Digest, *, before: float | None = None) -> bool: ...
    def iter_ids(self) -> Iterator[Digest]: ...
    def chunk_written_before(self, oid: Digest, before: float) -> bool: ...
    def temporary_files(self) -> list[Path]: ...
    def written_before(self, path: Path, before: float) -> bool: ...
    def remove_temporary(self, path: Path, *, before: float | None = None) -> bool: ...


class ChunkFiles:
    """The ``data/`` and ``tmp/`` directories of a store."""

    def __init__(self, root: Path) -> None:
        self.data = root / "data"
        self.tmp = root / "tmp"

    def ensure(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, oid: Digest) -> Path:
        return self.data / oid.hex[:2] / oid.hex[2:]

    def exists(self, oid: Digest) -> bool:
        return self.path(oid).is_file()

    def stored_size(self, oid: Digest) -> int | None:
        """The size of the chunk file, or None if there is none."""
        path = self.path(oid)
        return path.stat().st_size if path.is_file() else None

    def location(self, oid: Digest) -> str:
        return f"chunk file {self.path(oid)}"

    def chunk_written_before(self, oid: Digest, before: float) -> bool:
        return _written_before(self.path(oid), before)

    def write(self, oid: Digest, stored: bytes | memoryview, codec: str, *, size: int,
              written: Callable[[], object] = lambda: None, sha256: bool = True,
              base: Base | None = None) -> str | None:
        """Write a leaf durably: temp file, fsync, re-read and re-hash, rename, fsync dir.

        Returns the SHA-256 of the plain bytes, computed from the re-read that checks them
        against their ID (None without ``sha256``). ``written`` is called once ``stored`` is in
        the temporary file: the caller may reuse its buffer from then on.
        """
        import tempfile  # here, not at the top: read commands (log, lineage) never write

        final = self.path(oid)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=oid.hex[:16] + ".", dir=self.tmp)
        tmp = Path(tmp_name)
        try:
            try:
                _write_all(fd, stored)
                written()
                os.fsync(fd)
            finally:
                os.close(fd)
            sha = _new_sha256() if sha256 else None
            got = self._rehash_file(tmp, codec, oid, size, sha, base)
            if got != oid:
                raise IntegrityError(f"chunk written for {oid}", str(oid), str(got))
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(final.parent)
        return sha.hexdigest() if sha is not None else None

    def _rehash_file(self, path: Path, codec: str, oid: Digest, size: int, also: Any,
                     base: Base | None) -> Digest:
        """BLAKE3 of a chunk file's plain bytes, read back in blocks so memory stays bounded."""
        try:
            return self._digest(path, codec, oid, size, also, base)[0]
        except IntegrityError as exc:
            raise IntegrityError(f"chunk written for {oid}", exc.expected, exc.actual) from None

    def verify(self, oid: Digest, codec: str, size: int, *,
               base: Base | None = None) -> tuple[Digest, int]:
        """(BLAKE3 ID, size) of a stored leaf's plain bytes, streamed in bounded memory.

        Raises ``IntegrityError`` if the chunk file is missing, its zstd data does not decode,
        or it decodes to more than ``size`` bytes.
        """
        return self._digest(self.path(oid), codec, oid, size, base=base)

    def _digest(self, path: Path, codec: str, oid: Digest, size: int,
                also: Any = None, base: Base | None = None) -> tuple[Digest, int]:
        with self._open(path, oid) as f:
            return plain_digest(f, codec, oid, size, where=f"chunk file {path}", also=also,
                                base=base)

    @staticmethod
    def _open(path: Path, oid: Digest) -> io.BufferedReader:
        try:
            return path.open("rb")
        except FileNotFoundError:
            raise IntegrityError(f"object {oid}", str(oid),
                                 f"no chunk file at {path}") from None

    def read(self, oid: Digest, codec: str, size: int, *, base: Base | None = None) -> bytes:
        """The plain bytes of a leaf, at most ``size`` of them, checked against its ID."""
        path = self.path(oid)
        with self._open(path, oid) as f:
            data = decode_stream(f, codec, oid, size, where=f"chunk file {path}", base=base)
        check_plain(data, oid, base)
        return data

    def read_stored(self, oid: Digest, size: int) -> bytes:
        """A chunk file's stored bytes as they are (a transfer sends them), at most as many as
        a leaf of ``size`` plain bytes may take in any codec."""
        path = self.path(oid)
        with self._open(path, oid) as f:
            return read_capped(f, oid, size, where=f"chunk file {path}",
                               expect=os.fstat(f.fileno()).st_size)

    def remove(self, oid: Digest, *, before: float | None = None) -> bool:
        """Delete a chunk file (only if last written at or before ``before``); True if deleted."""
        return _unlink(self.path(oid), before)

    def iter_ids(self) -> Iterator[Digest]:
        """The IDs chunk files are named by; a file named otherwise is no chunk (left alone)."""
        if not self.data.is_dir():
            return
        for sub in sorted(self.data.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    if is_hex_id(sub.name + f.name):
                        yield Digest(sub.name + f.name)

    def temporary_files(self) -> list[Path]:
        """Files in ``tmp/``: a write in progress, or one a crash interrupted."""
        return sorted(self.tmp.iterdir()) if self.tmp.is_dir() else []

    @staticmethod
    def written_before(path: Path, before: float) -> bool:
        """True if ``path`` (a chunk or temporary file) was last written at or before ``before``."""
        return _written_before(path, before)

    def remove_temporary(self, path: Path, *, before: float | None = None) -> bool:
        if path.parent != self.tmp:
            raise StoreError(f"{path} is not a temporary file of this store")
        return _unlink(path, before)


def _new_sha256() -> Any:
    """A SHA-256 hasher; hashlib is imported here, so that read commands need not load
    OpenSSL (3 ms of every start-up)."""
    import hashlib

    return hashlib.sha256()


def _written_before(path: Path, before: float) -> bool:
    """True if ``path`` was last modified at or before ``before`` (False if it is gone)."""
    try:
        return path.stat().st_mtime <= before
    except FileNotFoundError:
        return False


def _unlink(path: Path, before: float | None) -> bool:
    # The age check and the unlink are two steps: a writer replacing this very file in between
    # loses it. gc passes ``before`` = now - min_age, so that needs a write at the exact moment
    # gc removes the same, long-unused chunk.
    if before is not None and not _written_before(path, before):
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]
