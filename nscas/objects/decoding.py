"""Decoding a stored leaf (docs/format.md §5.5), bounded by the size its row states: raw,
zstd, byte planes and XOR or integer-difference deltas to a base, from memory or a stream, to plain bytes, their
digest, or blocks. Nothing here produces more than the row's size, or holds more than a leaf.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import blake3

from nscas.errors import CodecError, DecodeBoundExceeded, IntegrityError
from nscas.objects import codecs
from nscas.objects.codecs import Base
from nscas.objects.digests import Digest, Readable
from nscas.objects.segments import LEAF_MAX

_VERIFY_BLOCK = 4 << 20  # block of a streamed decode or a read-back
_FRAME_BLOCK = 512 << 10
"""Block of a plane stream between zstd and its un-planing or XOR: small enough to stay in the
CPU's cache between the two (a 32 MiB sub4 leaf's stream: 42 ms in 4 MiB blocks, 33 in 512 KiB)."""
ZSTD_WINDOW_MAX = 1 << 25
"""The largest zstd window a chunk may ask for (a leaf never needs more): decoding memory."""


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
    checks what it is used for. None for a codec of another width, a ``subW`` delta (its stream
    is not of its plain bytes), or a delta whose base has no such stream."""
    if codecs.width(codec) != w or codec not in codecs.CODECS or codecs.is_sub(codec):
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
        if len(stored) > stored_max(limit):
            raise IntegrityError(f"object {oid}", "stored bytes its size allows",
                                 f"more in {where}")
        # Every frame in memory at once: zstd then decodes each frame straight into the
        # buffer (3 ms of a 32 MiB leaf's 25 less than through a stream of 1 MiB reads).
        return _inflate(memoryview(stored), oid, limit, where)
    _check_header(capped, codec, oid, where, base)
    assert base is not None
    stream = base.stream(w) if base.stream is not None else None
    if stream is None or len(stream) != limit:
        return None
    _xor_frames(capped, stream, oid, limit, where)
    return stream


def read_capped(src: Readable, oid: Digest, size: int, *, where: str,
                expect: int | None = None) -> bytes:
    """All stored bytes of a stream, refused past :func:`stored_max` of ``size``. ``expect``:
    how many there should be (a chunk file's length), so that the one buffer a file's
    ``read(n)`` allocates is of that length, not of the cap: a read of the cap then shrunk took
    10 ms of page faults for a 32 MiB leaf's 20 MB, against 1 ms (issue 41)."""
    limit = min(max(size, 0), LEAF_MAX)
    cap = codecs.HEADER + stored_max(limit)
    want = cap + 1 if expect is None else min(max(expect, 0), cap) + 1
    data = _read_exactly(src, want)  # one request: a file's read(n) fills one buffer
    if len(data) == want and want <= cap:  # longer than expected: the rest, still capped
        data += _read_exactly(src, cap + 1 - want)
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


def _frames(src: Readable | memoryview) -> Readable:
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
    if codecs.is_sub(codec):
        return _unsub(capped, codec, oid, limit, where, base, fast=fast)
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
        loading = pool.submit(_base_plain, base, fast)
        plain = _unplane_stream(capped, codec, oid, limit, where)
        other = loading.result()
    if len(other) != limit:
        raise CodecError(oid, f"a base of {limit} bytes", f"{len(other)} bytes of {base.id}",
                         problem="bad-base")
    codecs.xor_into(plain, other)
    return plain


def _base_plain(base: Base, fast: bool) -> bytes | memoryview:
    """A base's plain bytes: unchecked where ``fast`` and it can (the caller checks what they
    make with :func:`check_plain`, which then names a corrupt base), else checked."""
    return base.plain() if fast and base.plain is not None else base.load()


def _unsub(capped: Readable, codec: str, oid: Digest, limit: int, where: str, base: Base, *,
           fast: bool) -> memoryview:
    """The plain bytes of a ``subW`` leaf whose header was checked: its residual's plane stream
    un-planed into one buffer while the base decodes on a thread of its own, then each value
    un-zig-zagged and added to the base's. ``fast``: the base as its unchecked plane stream of
    width W where it has one (the caller then checks with :func:`check_plain`), else its
    checked plain bytes."""
    from concurrent.futures import ThreadPoolExecutor

    w = codecs.width(codec)

    def load() -> tuple[memoryview | None, bytes | memoryview | None]:
        stream = base.stream(w) if fast and base.stream is not None else None
        if stream is not None and len(stream) == limit:
            return stream, None
        return None, _base_plain(base, fast)

    with ThreadPoolExecutor(1, thread_name_prefix="nscas-base") as pool:
        loading = pool.submit(load)
        target = _unplane_stream(capped, codec, oid, limit, where)
        stream, plain = loading.result()
    if plain is not None and len(plain) != limit:
        raise CodecError(oid, f"a base of {limit} bytes", f"{len(plain)} bytes of {base.id}",
                         problem="bad-base")
    codecs.unsub_into(target, w, plain=plain, stream=stream)
    return target


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


def _inflate(capped: Readable | memoryview, oid: Digest, limit: int, where: str) -> memoryview:
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


def _frame_blocks(capped: Readable, oid: Digest, limit: int, where: str
                  ) -> Iterator[tuple[int, memoryview]]:
    """The content of the zstd frames of ``capped`` as (offset, block) pairs, exactly ``limit``
    bytes in all; each block is valid until the next is asked for. One byte past the bound is
    the most ever inflated: a bomb never gets further."""
    import zstandard

    block = bytearray(min(_FRAME_BLOCK, limit + 1) or 1)
    view = memoryview(block)
    got = 0
    reader = _frames(capped)
    try:
        while n := reader.readinto(view[:min(len(block), limit + 1 - got)]):
            if got + n > limit:
                raise DecodeBoundExceeded(oid, limit, where)
            yield got, view[:n]
            got += n
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"object {oid}", str(oid),
                             f"undecodable zstd data in {where} ({exc})") from None
    if got < limit:
        raise CodecError(oid, f"a plane stream of {limit} bytes, as its record says",
                         f"{got} bytes from {where}", problem="size-mismatch")


def _xor_frames(capped: Readable, stream: memoryview, oid: Digest, limit: int,
                where: str) -> None:
    """XOR the content of the zstd frames of ``capped`` (exactly ``limit`` bytes, block by
    block, never one more) into ``stream``."""
    import numpy as np

    dst = np.frombuffer(stream, dtype=np.uint8)
    for at, block in _frame_blocks(capped, oid, limit, where):
        part = dst[at:at + len(block)]
        np.bitwise_xor(part, np.frombuffer(block, dtype=np.uint8), out=part)


def _unplane_stream(capped: Readable, codec: str, oid: Digest, limit: int,
                    where: str) -> memoryview:
    """The plain bytes of a plane stream of exactly ``limit`` bytes in zstd frames."""
    plain = codecs.buffer(limit)
    unplane = codecs.Unplaner(plain, codecs.width(codec))
    for at, block in _frame_blocks(capped, oid, limit, where):
        unplane.put(at, block)  # straight to its places: no second leaf-sized buffer
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


def _hash_hex(data: bytes | bytearray | memoryview) -> str:
    threads = blake3.blake3.AUTO if len(data) >= (1 << 20) else 1
    return blake3.blake3(data, max_threads=threads).hexdigest()
