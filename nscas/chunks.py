"""Chunk files on disk and how files are cut into objects (docs/format.md §5).

Only this module touches chunk files. A leaf object's bytes live in ``data/<2 hex>/<62 hex>``,
raw or zstd-compressed (only when that saves space). Files are written to ``tmp/`` first,
fsync'ed, re-read and re-hashed, then renamed into place: a crash leaves a stray temporary
file (removed by ``gc`` once older than its minimum age) or a complete verified chunk, never a
partial one.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import blake3

from nscas.durable import fsync_dir
from nscas.errors import IntegrityError, StoreError

CHUNK_SIZE = 16 << 20  # fixed-size chunks of large ordinary files
TENSOR_SPLIT = 32 << 20  # tensors larger than this are themselves stored as parts
SINGLE_MAX = 16 << 20  # ordinary files up to this size are one leaf object
INLINE_MAX = 4 << 10  # leaves this small live in the database row
_SAMPLE = 64 << 10  # bytes compressed first to decide whether zstd pays off
_MIN_SAVING = 0.9  # compress only if the sample shrinks below 90 %
_ZSTD_LEVEL = 3
_SAFETENSORS_HEADER_MAX = 100 << 20
_VERIFY_BLOCK = 4 << 20  # read-back block when re-hashing a chunk file just written


class Segment(NamedTuple):
    """A byte range of a file that becomes one object: ``tensor`` names safetensors tensors."""

    offset: int
    length: int
    tensor: str | None = None


def plan_segments(path: Path, size: int) -> list[Segment] | None:
    """How to cut a file into part objects; ``None`` means store it as a single leaf."""
    if path.suffix == ".safetensors":
        segments = _safetensors_segments(path, size)
        if segments is not None:
            return segments
    if size <= SINGLE_MAX:
        return None
    return [Segment(offset=o, length=min(CHUNK_SIZE, size - o)) for o in range(0, size, CHUNK_SIZE)]


def split_ranges(length: int) -> list[tuple[int, int]]:
    """Sub-ranges (offset, length) of a large tensor; a single range if it needs no split."""
    if length <= TENSOR_SPLIT:
        return [(0, length)]
    return [(o, min(TENSOR_SPLIT, length - o)) for o in range(0, length, TENSOR_SPLIT)]


def _safetensors_segments(path: Path, size: int) -> list[Segment] | None:
    """Header, then one segment per tensor in file order; None if the file is not well formed."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (hlen,) = struct.unpack("<Q", raw)
            if hlen > _SAFETENSORS_HEADER_MAX or 8 + hlen > size:
                return None
            header = json.loads(f.read(hlen))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    base = 8 + hlen
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            return None
        if not 0 <= start <= end:
            return None
        spans.append((start, end, name))
    spans.sort()
    segments = [Segment(offset=0, length=base)]
    cursor = 0
    for start, end, name in spans:
        if start != cursor:  # gaps or overlaps: not a layout we can cut at tensor boundaries
            return None
        if end > start:
            segments.append(Segment(offset=base + start, length=end - start, tensor=name))
        cursor = end
    if base + cursor != size:
        return None
    return segments


class ChunkBackend(Protocol):
    """Where leaf objects' bytes live: :class:`ChunkFiles` (a directory, local or shared) or
    :class:`nscas.s3.S3Chunks` (an S3 prefix). Every write goes to a temporary name, is
    verified, then published; every read is checked against the ID."""

    def ensure(self) -> None: ...
    def exists(self, hex_id: str) -> bool: ...
    def encode(self, data: memoryview | bytes) -> tuple[str, bytes | memoryview]: ...
    def write(self, hex_id: str, stored: bytes | memoryview, codec: str, *,
              written: Callable[[], object] = ..., sha256: bool = True) -> str | None: ...
    def read(self, hex_id: str, codec: str) -> bytes: ...
    def verify(self, hex_id: str, codec: str) -> tuple[str, int]: ...
    def stored_size(self, hex_id: str) -> int | None: ...
    def location(self, hex_id: str) -> str: ...
    def remove(self, hex_id: str, *, before: float | None = None) -> bool: ...
    def iter_ids(self) -> Iterator[str]: ...
    def chunk_written_before(self, hex_id: str, before: float) -> bool: ...
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

    def path(self, hex_id: str) -> Path:
        return self.data / hex_id[:2] / hex_id[2:]

    def exists(self, hex_id: str) -> bool:
        return self.path(hex_id).is_file()

    def encode(self, data: memoryview | bytes) -> tuple[str, bytes | memoryview]:
        return encode(data)

    def stored_size(self, hex_id: str) -> int | None:
        """The size of the chunk file, or None if there is none."""
        path = self.path(hex_id)
        return path.stat().st_size if path.is_file() else None

    def location(self, hex_id: str) -> str:
        return f"chunk file {self.path(hex_id)}"

    def chunk_written_before(self, hex_id: str, before: float) -> bool:
        return _written_before(self.path(hex_id), before)

    def write(self, hex_id: str, stored: bytes | memoryview, codec: str, *,
              written: Callable[[], object] = lambda: None, sha256: bool = True) -> str | None:
        """Write a leaf durably: temp file, fsync, re-read and re-hash, rename, fsync dir.

        Returns the SHA-256 of the plain bytes, computed from the re-read that checks them
        against their ID (None without ``sha256``). ``written`` is called once ``stored`` is in
        the temporary file: the caller may reuse its buffer from then on.
        """
        import tempfile  # here, not at the top: read commands (log, lineage) never write

        final = self.path(hex_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=hex_id[:16] + ".", dir=self.tmp)
        tmp = Path(tmp_name)
        try:
            try:
                _write_all(fd, stored)
                written()
                os.fsync(fd)
            finally:
                os.close(fd)
            sha = _new_sha256() if sha256 else None
            got = self._rehash_file(tmp, codec, hex_id, sha)
            if got != hex_id:
                raise IntegrityError(f"chunk written for {hex_id}", f"blake3:{hex_id}", f"blake3:{got}")
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(final.parent)
        return sha.hexdigest() if sha is not None else None

    def _rehash_file(self, path: Path, codec: str, hex_id: str, also: Any) -> str:
        """BLAKE3 of a chunk file's plain bytes, read back in blocks so memory stays bounded."""
        try:
            return _plain_digest(path, codec, hex_id, also)[0]
        except IntegrityError as exc:
            raise IntegrityError(f"chunk written for {hex_id}", exc.expected, exc.actual) from None

    def verify(self, hex_id: str, codec: str) -> tuple[str, int]:
        """(BLAKE3 hex, size) of a stored leaf's plain bytes, streamed in bounded memory.

        Raises ``IntegrityError`` if the chunk file is missing or its zstd data does not decode.
        """
        return _plain_digest(self.path(hex_id), codec, hex_id)

    def read(self, hex_id: str, codec: str) -> bytes:
        """The plain bytes of a leaf, checked against its ID."""
        try:
            stored = self.path(hex_id).read_bytes()
        except FileNotFoundError:
            raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}",
                                 f"no chunk file at {self.path(hex_id)}") from None
        data = self._decode(stored, codec, hex_id)
        got = _hash_hex(data)
        if got != hex_id:
            raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}", f"blake3:{got}")
        return data

    def _decode(self, stored: bytes, codec: str, hex_id: str = "") -> bytes:
        return decode(stored, codec, hex_id)

    def remove(self, hex_id: str, *, before: float | None = None) -> bool:
        """Delete a chunk file (only if last written at or before ``before``); True if deleted."""
        return _unlink(self.path(hex_id), before)

    def iter_ids(self) -> Iterator[str]:
        if not self.data.is_dir():
            return
        for sub in sorted(self.data.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    yield sub.name + f.name

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


def encode(data: memoryview | bytes) -> tuple[str, bytes | memoryview]:
    """(codec, stored bytes): zstd only when a sample shows it saves space."""
    if len(data) >= 1024:
        import zstandard  # here, as in decode: commands that read only records never need it

        # A compressor per call: zstd contexts must not be shared between writer threads.
        cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
        sample = bytes(data[:_SAMPLE])
        if len(cctx.compress(sample)) < _MIN_SAVING * len(sample):
            packed = cctx.compress(data)  # a buffer, not bytes(data): no 32 MiB copy
            if len(packed) < _MIN_SAVING * len(data):
                return "zstd", packed
    return "raw", data


def decode(stored: bytes, codec: str, hex_id: str = "") -> bytes:
    """The plain bytes of a stored leaf (checked against its ID by the caller)."""
    if codec == "raw":
        return stored
    if codec == "zstd":
        import zstandard

        # Streaming, not ZstdDecompressor.decompress: that allocates whatever size the frame
        # header claims, and one flipped bit there asks for terabytes (MemoryError).
        dobj = zstandard.ZstdDecompressor().decompressobj(write_size=1 << 20)
        try:
            data = dobj.decompress(stored)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}",
                                 f"undecodable zstd data ({exc})") from None
        if not dobj.eof or dobj.unused_data:
            raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}",
                                 "truncated zstd data or bytes after its end")
        return data
    raise StoreError(f"unknown codec {codec!r} for object {hex_id}")


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


def _plain_digest(path: Path, codec: str, hex_id: str,
                  also: Any = None) -> tuple[str, int]:
    """(BLAKE3 hex, size) of a chunk file's plain bytes, read in blocks (zstd decoded);
    ``also`` (a hashlib object) is fed the same blocks."""
    if codec not in ("raw", "zstd"):
        raise StoreError(f"unknown codec {codec!r} for object {hex_id}")
    import zstandard

    # One thread per file: callers hash several files at once (fsck) or run in a pool (put).
    h = blake3.blake3()
    feed = [h.update] if also is None else [h.update, also.update]
    size = 0
    buf = bytearray(_VERIFY_BLOCK)
    view = memoryview(buf)
    try:
        with path.open("rb") as f:
            if codec == "raw":
                while n := f.readinto(buf):
                    for update in feed:
                        update(view[:n])
                    size += n
            else:
                # Bounded output per read: a corrupt frame may describe far more data than it
                # holds. Across frames, so that bytes after the frame are decoded too (and fail)
                # rather than ignored: the same bytes must pass here that pass a read.
                src = zstandard.ZstdDecompressor().stream_reader(
                    f, read_size=_VERIFY_BLOCK, read_across_frames=True)
                while n := src.readinto(buf):
                    for update in feed:
                        update(view[:n])
                    size += n
    except FileNotFoundError:
        raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}",
                             f"no chunk file at {path}") from None
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object blake3:{hex_id}", f"blake3:{hex_id}",
                             f"undecodable zstd data ({exc})") from None
    return h.hexdigest(), size


def _hash_hex(data: bytes | memoryview) -> str:
    threads = blake3.blake3.AUTO if len(data) >= (1 << 20) else 1
    return blake3.blake3(data, max_threads=threads).hexdigest()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]
