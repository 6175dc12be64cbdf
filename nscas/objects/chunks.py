"""Chunk files on disk and how files are cut into objects (docs/format.md §5).

Only this module touches chunk files. A leaf object's bytes live in ``data/<2 hex>/<62 hex>``,
in one of the codecs of nscas.objects.codecs (raw, zstd, byte planes, XOR deltas to a base). Files are written to ``tmp/`` first,
fsync'ed, re-read and re-hashed, then renamed into place: a crash leaves a stray temporary
file (removed by ``gc`` once older than its minimum age) or a complete verified chunk, never a
partial one.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import blake3

from nscas.errors import CodecError, DecodeBoundExceeded, IntegrityError, StoreError
from nscas.objects import codecs
from nscas.objects.codecs import Base
from nscas.objects.digests import Digest, Readable, is_hex_id
from nscas.objects.durable import fsync_dir

CHUNK_SIZE = 16 << 20  # fixed-size chunks of large ordinary files
TENSOR_SPLIT = 32 << 20  # tensors larger than this are themselves stored as parts
SINGLE_MAX = 16 << 20  # ordinary files up to this size are one leaf object
INLINE_MAX = 4 << 10  # leaves this small live in the database row
_SAFETENSORS_HEADER_MAX = 100 << 20
_VERIFY_BLOCK = 4 << 20  # read-back block when re-hashing a chunk file just written
LEAF_MAX = max(SINGLE_MAX, CHUNK_SIZE, TENSOR_SPLIT)
"""No leaf the store writes is larger: a row claiming more is read as claiming this."""
ZSTD_WINDOW_MAX = 1 << 25
"""The largest zstd window a chunk may ask for (a leaf never needs more): decoding memory."""


class Segment(NamedTuple):
    """A byte range of a file that becomes one object: ``tensor`` names safetensors tensors."""

    offset: int
    length: int
    tensor: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


def tensor_layout(header: bytes) -> dict[str, tuple[str, tuple[int, ...], int, int]] | None:
    """(dtype, shape, start, end) of each tensor of a safetensors header (its JSON after the
    8 length bytes), offsets within the data section; None if it is not one."""
    try:
        value = json.loads(header)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, info in value.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
            dtype = str(info.get("dtype", ""))
            shape = tuple(int(x) for x in info.get("shape", ()))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        out[name] = (dtype, shape, start, end)
    return out


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
            layout = tensor_layout(f.read(hlen))
    except OSError:
        return None
    if layout is None:
        return None
    base = 8 + hlen
    spans = sorted((start, end, name, dtype, shape)
                   for name, (dtype, shape, start, end) in layout.items())
    segments = [Segment(offset=0, length=base)]
    cursor = 0
    for start, end, name, dtype, shape in spans:
        if start != cursor or end < start:  # gaps or overlaps: not cut at tensor boundaries
            return None
        if end > start:
            segments.append(Segment(offset=base + start, length=end - start, tensor=name,
                                    dtype=dtype, shape=shape))
        cursor = end
    if base + cursor != size:
        return None
    return segments


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
            return read_capped(f, oid, size, where=f"chunk file {path}")

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


def decode(stored: bytes | memoryview, codec: str, oid: Digest, size: int, *,
           where: str = "", base: Base | None = None) -> bytes:
    """The plain bytes of a stored leaf held in memory, at most ``size`` (checked against its
    ID by the caller)."""
    return decode_stream(io.BytesIO(stored), codec, oid, size, where=where, base=base)


def check_plain(data: bytes | bytearray | memoryview, oid: Digest, base: Base | None) -> None:
    """Check a leaf's decoded bytes against its ID. A delta decoded through its base's
    unchecked plane stream (:attr:`Base.stream`) that fails has its base checked first, so that
    a corrupt base is named as the corrupt one, as when it is decoded on its own."""
    got = _hash_hex(data)
    if got != oid.hex:
        if base is not None:
            base.load()  # raises the base's IntegrityError if it is the base that is wrong
        raise IntegrityError(f"object {oid}", str(oid), f"blake3:{got}")


def plane_stream(stored: bytes, codec: str, oid: Digest, size: int, w: int, *,
                 where: str = "", base: Base | None = None) -> memoryview | None:
    """The plane stream for width ``w`` of a leaf of ``size`` plain bytes held in memory as
    ``stored`` (``raw`` or ``zstd`` for W = 1, ``planesW``, or ``xorW`` with ``base`` its
    checked base row), bounded like every decode, not checked against its ID: the caller
    checks what it is used for. None for a codec of another width, or a delta whose base has no
    such stream."""
    if codecs.width(codec) != w or codec not in codecs.CODECS:
        return None
    where = where or f"the chunk of {oid}"
    limit = min(max(size, 0), LEAF_MAX)
    delta = codecs.is_delta(codec)
    capped = _Capped(io.BytesIO(stored), (codecs.HEADER if delta else 0) + stored_max(limit),
                     oid, where)
    if codec == "raw":
        data = capped.read(limit + 1)
        if len(data) != limit:
            return None  # wrong: the checked path says how
        out = codecs.buffer(limit)
        out[:] = data
        return out
    if not delta:
        return _inflate(capped, oid, limit, where)
    _check_header(capped, codec, oid, where, base)
    assert base is not None
    stream = base.stream(w) if base.stream is not None else None
    if stream is None or len(stream) != limit:
        return None
    _xor_frames(capped, stream, oid, limit, where)
    return stream


def read_capped(src: Readable, oid: Digest, size: int, *, where: str) -> bytes:
    """All stored bytes of a stream, refused past :func:`stored_max` of ``size``."""
    limit = min(max(size, 0), LEAF_MAX)
    cap = codecs.HEADER + stored_max(limit)
    data = _read_exactly(src, cap + 1)  # one request: a file's read(n) fills one buffer
    if len(data) > cap:
        raise IntegrityError(f"object {oid}", "stored bytes its size allows", f"more in {where}")
    return data


def decode_stream(src: Readable, codec: str, oid: Digest, size: int, *, where: str = "",
                  base: Base | None = None) -> bytes:
    """The plain bytes a stream of stored bytes decodes to, at most ``size`` of them.

    Read in one request of ``size + 1`` bytes, so that the leaf is allocated once (a file's or
    a zstd reader's ``read(n)`` fills one buffer): blocks joined, or a bytearray copied to
    bytes, would hold a leaf twice, and a reader streaming two models holds one leaf of each.
    A delta may decode through its base's unchecked plane stream: the caller checks what comes
    out with :func:`check_plain`, which names a corrupt base.
    """
    import zstandard

    where = where or f"the chunk of {oid}"
    limit = min(max(size, 0), LEAF_MAX)
    if codec in codecs.WIDTHS:
        # The leaf's one buffer, as it is: bytes() of it would hold the leaf twice.
        return _decode_planes(src, codec, oid, limit, where, base,  # type: ignore[return-value]
                              fast=True)
    # Raw stored bytes are the plain bytes: reading one past the bound caps both at once.
    reader = src if codec == "raw" else _decoder(
        _Capped(src, stored_max(limit), oid, where), codec, oid)
    parts: list[bytes] = []
    want = limit + 1
    try:
        while want > 0:
            block = reader.read(want)
            if not block:
                break
            parts.append(block)
            want -= len(block)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object {oid}", str(oid),
                             f"undecodable zstd data in {where} ({exc})") from None
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) > limit:
        raise DecodeBoundExceeded(oid, limit, where)
    return data


def plain_digest(src: Readable, codec: str, oid: Digest, size: int, *, where: str = "",
                 also: Any = None, base: Base | None = None) -> tuple[Digest, int]:
    """(BLAKE3 ID, size) of the plain bytes a stream decodes to, at most ``size``; ``also``
    (a hashlib object) is fed the same blocks."""
    # One thread per leaf: callers hash several at once (fsck) or run in a pool (put).
    h = blake3.blake3()
    got = 0
    for block in plain_blocks(src, codec, oid, size, where=where, base=base):
        h.update(block)
        if also is not None:
            also.update(block)
        got += len(block)
    return Digest(h.hexdigest()), got


def stored_max(size: int) -> int:
    """The most stored bytes a leaf of ``size`` plain bytes may take in any codec: raw is the
    size itself, zstd at most ZSTD_compressBound of it; more is refused unread."""
    return size + (size >> 7) + (64 << 10)


def plain_blocks(src: Readable, codec: str, oid: Digest, size: int, *,
                 where: str = "", base: Base | None = None) -> Iterator[memoryview]:
    """The plain bytes of a stored leaf, in blocks of one reused buffer, bounded by its record.

    Every codec decodes through here (raw and zstd streamed through :func:`_decoder`; planes
    and deltas, which need the whole plane stream, one leaf at a time through
    :func:`_decode_planes`): ``size`` (the row's plain size, capped at :data:`LEAF_MAX`) bounds
    what comes out, one byte past it is a :class:`DecodeBoundExceeded` naming the chunk, and the
    stored bytes read are bounded by :func:`stored_max`. Fewer bytes than ``size`` simply end
    early for raw and zstd (the caller's hash and size checks judge them); a plane stream must
    be exactly ``size`` bytes.
    """
    import zstandard

    where = where or f"the chunk of {oid}"
    limit = min(max(size, 0), LEAF_MAX)
    if codec in codecs.WIDTHS:
        whole = memoryview(_decode_planes(src, codec, oid, limit, where, base))
        for at in range(0, len(whole), _VERIFY_BLOCK):
            yield whole[at:at + _VERIFY_BLOCK]
        return
    reader = _decoder(_Capped(src, stored_max(limit), oid, where), codec, oid)
    buf = bytearray(max(1, min(_VERIFY_BLOCK, limit + 1)))
    view = memoryview(buf)
    produced = 0
    try:
        while True:
            # Ask for at most one byte past the bound: a bomb never gets to inflate further.
            n = reader.readinto(view[:min(len(buf), limit + 1 - produced)])
            if not n:
                return
            produced += n
            if produced > limit:
                raise DecodeBoundExceeded(oid, limit, where)
            yield view[:n]
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object {oid}", str(oid),
                             f"undecodable zstd data in {where} ({exc})") from None


def _decoder(src: Readable, codec: str, oid: Digest) -> Readable:
    """A reader of the plain bytes of stored bytes in ``codec``."""
    if codec == "raw":
        return src
    if codec == "zstd":
        return _frames(src)
    codecs.check_known(oid, codec)
    raise CodecError(oid, "raw or zstd", f"codec {codec!r} here")  # planes: _decode_planes


def _frames(src: Readable) -> Readable:
    """The decoded content of the zstd frames of ``src``, concatenated."""
    import zstandard

    # Streaming into a bounded buffer, never ZstdDecompressor.decompress: that allocates
    # whatever size the frame header claims. Across frames, so that bytes after the frame
    # are decoded too (and fail) rather than ignored.
    dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_WINDOW_MAX)
    # zstandard's stubs ask for IO[bytes]; it calls only read(), which _Capped has.
    return dctx.stream_reader(src, read_size=1 << 20,  # type: ignore[arg-type]
                              read_across_frames=True)


def _decode_planes(src: Readable, codec: str, oid: Digest, limit: int, where: str,
                   base: Base | None, *, fast: bool = False) -> bytearray | memoryview:
    """The plain bytes of a ``planesW`` or ``xorW`` chunk (docs/format.md §5.5.1): the header
    checked against the row's base first, then a plane stream of exactly ``limit`` bytes
    decoded into one buffer, un-planed, and for a delta XORed with the base's plain bytes
    (checked against the base's ID by ``base.load``) once the header names it. ``fast``: a
    delta XORs its stream into the base's unchecked plane stream instead, where the base has
    one, and un-planes once (the caller then checks with :func:`check_plain`)."""
    delta = codecs.is_delta(codec)
    capped = _Capped(src, (codecs.HEADER if delta else 0) + stored_max(limit), oid, where)
    if not delta:
        return _unplane_stream(capped, codec, oid, limit, where)
    _check_header(capped, codec, oid, where, base)
    assert base is not None
    w = codecs.width(codec)
    stream = base.stream(w) if fast and base.stream is not None else None
    if stream is not None and len(stream) == limit:
        # The base's plane stream XOR this leaf's is this leaf's plane stream: one un-planing
        # instead of two, no base plain bytes and no hash of them (check_plain covers both).
        _xor_frames(capped, stream, oid, limit, where)
        return stream if w == 1 else codecs.unplanes(stream, w)
    from concurrent.futures import ThreadPoolExecutor

    # The base decodes on a thread of its own while this leaf's stream does (zstd and BLAKE3
    # let go of the GIL): a delta's get then takes about as long as its longer link, not both.
    with ThreadPoolExecutor(1, thread_name_prefix="nscas-base") as pool:
        loading = pool.submit(base.load)
        plain = _unplane_stream(capped, codec, oid, limit, where)
        other = loading.result()
    if len(other) != limit:
        raise CodecError(oid, f"a base of {limit} bytes", f"{len(other)} bytes of {base.id}",
                         problem="bad-base")
    codecs.xor_into(plain, other)
    return plain


def _check_header(capped: Readable, codec: str, oid: Digest, where: str,
                  base: Base | None) -> None:
    """A delta's 32-byte header read and checked against the base its row names."""
    if base is None:
        raise CodecError(oid, "the base its row names", f"a {codec} chunk without one")
    head = _read_exactly(capped, codecs.HEADER)
    if len(head) < codecs.HEADER:
        raise CodecError(oid, "a 32-byte base header", f"{len(head)} bytes in {where}",
                         problem="bad-base")
    if head != bytes.fromhex(base.id.hex):
        raise CodecError(oid, f"base {base.id} (its row's)",
                         f"blake3:{head.hex()} in the header of {where}", problem="bad-base")


def _inflate(capped: Readable, oid: Digest, limit: int, where: str) -> memoryview:
    """The content of the zstd frames of ``capped``, exactly ``limit`` bytes, decoded straight
    into one buffer; one byte more is never inflated."""
    import zstandard

    out = view = codecs.buffer(limit)
    got = 0
    reader = _frames(capped)
    try:
        while got < limit and (n := reader.readinto(view[got:])):
            got += n
        if got == limit and reader.readinto(bytearray(1)):
            raise DecodeBoundExceeded(oid, limit, where)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object {oid}", str(oid),
                             f"undecodable zstd data in {where} ({exc})") from None
    if got < limit:
        raise CodecError(oid, f"a plane stream of {limit} bytes, as its record says",
                         f"{got} bytes from {where}", problem="size-mismatch")
    return out


def _xor_frames(capped: Readable, stream: memoryview, oid: Digest, limit: int,
                where: str) -> None:
    """XOR the content of the zstd frames of ``capped`` (exactly ``limit`` bytes, block by
    block, never one more) into ``stream``."""
    import numpy as np
    import zstandard

    block = bytearray(min(_VERIFY_BLOCK, limit + 1) or 1)
    view = memoryview(block)
    dst = np.frombuffer(stream, dtype=np.uint8)
    src = np.frombuffer(block, dtype=np.uint8)
    got = 0
    reader = _frames(capped)
    try:
        while n := reader.readinto(view[:min(len(block), limit + 1 - got)]):
            if got + n > limit:
                raise DecodeBoundExceeded(oid, limit, where)
            part = dst[got:got + n]
            np.bitwise_xor(part, src[:n], out=part)
            got += n
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object {oid}", str(oid),
                             f"undecodable zstd data in {where} ({exc})") from None
    if got < limit:
        raise CodecError(oid, f"a plane stream of {limit} bytes, as its record says",
                         f"{got} bytes from {where}", problem="size-mismatch")


def _unplane_stream(capped: Readable, codec: str, oid: Digest, limit: int,
                    where: str) -> memoryview:
    """The plain bytes of a plane stream of exactly ``limit`` bytes in zstd frames."""
    import zstandard

    plain = codecs.buffer(limit)
    unplane = codecs.Unplaner(plain, codecs.width(codec))
    block = bytearray(min(_VERIFY_BLOCK, limit + 1) or 1)
    view = memoryview(block)
    got = 0
    reader = _frames(capped)
    try:
        while True:
            # Ask for at most one byte past the bound: a bomb never gets to inflate further.
            n = reader.readinto(view[:min(len(block), limit + 1 - got)])
            if not n:
                break
            if got + n > limit:
                raise DecodeBoundExceeded(oid, limit, where)
            unplane.put(got, view[:n])  # straight to its places: no second leaf-sized buffer
            got += n
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object {oid}", str(oid),
                             f"undecodable zstd data in {where} ({exc})") from None
    if got < limit:
        raise CodecError(oid, f"a plane stream of {limit} bytes, as its record says",
                         f"{got} bytes from {where}", problem="size-mismatch")
    return plain


def _read_exactly(src: Readable, n: int) -> bytes:
    """``n`` bytes of ``src``, fewer only at its end."""
    parts: list[bytes] = []
    while n > 0:
        block = src.read(n)
        if not block:
            break
        parts.append(block)
        n -= len(block)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Capped(io.RawIOBase):
    """A stored-bytes stream that refuses to be read past ``cap`` bytes."""

    def __init__(self, src: Readable, cap: int, oid: Digest, where: str) -> None:
        self._src, self._left, self._oid, self._where = src, cap, oid, where

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        want = min(len(view), self._left + 1)
        data = self._src.read(want)
        if len(data) > self._left:
            raise IntegrityError(f"object {self._oid}", "stored bytes its size allows",
                                 f"more in {self._where}")
        view[:len(data)] = data
        self._left -= len(data)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        # Straight from the source: a buffer filled, then copied to bytes, copies twice.
        want = min(self._left + 1, 1 << 20) if n is None or n < 0 else min(n, self._left + 1)
        data = self._src.read(want)
        if len(data) > self._left:
            raise IntegrityError(f"object {self._oid}", "stored bytes its size allows",
                                 f"more in {self._where}")
        self._left -= len(data)
        return data


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


def _hash_hex(data: bytes | bytearray | memoryview) -> str:
    threads = blake3.blake3.AUTO if len(data) >= (1 << 20) else 1
    return blake3.blake3(data, max_threads=threads).hexdigest()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]
