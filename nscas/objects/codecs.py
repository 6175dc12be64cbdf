"""Chunk codecs (docs/format.md §5.5.1): the plane stream, byte planes, XOR and integer-difference
deltas, and the writer's choice among them (§5.5.2). Pure functions of bytes: which chunk file, which base and
which row is the chunk layer's and the store's to say.

A plane stream of width W puts byte k of every W-byte value together (the sign-and-exponent
bytes of FP32 or BF16 apart from their mantissa bytes), which zstd then packs far better; a
delta XORs a leaf with its base's plain bytes first, so that what a fine-tune left unchanged
becomes zero bytes; a ``subW`` delta subtracts the base's W-byte values as integers instead,
so that a small step of a float stays a small number (XOR turns a carry into flipped bits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zstandard

    from nscas.objects.digests import Digest

HEADER = 32
"""A delta's chunk file starts with the raw BLAKE3 digest of its base leaf."""
CHAIN_MAX = 8
"""D: a leaf is at most this many deltas deep (a chain of D deltas ends in a non-delta leaf)."""
WIDTHS: dict[str, int] = {"planes2": 2, "planes4": 4, "planes8": 8,
                          "xor1": 1, "xor2": 2, "xor4": 4, "xor8": 8,
                          "sub2": 2, "sub4": 4, "sub8": 8}
"""The plane width W of each codec that has one."""
CODECS = frozenset({"raw", "zstd", *WIDTHS})
"""Every codec a chunk file may be in."""
MIN_SAVING = 0.03
"""A codec other than raw is kept only if it saves at least this share of the plain size."""
BUDGET_S = 2.0
"""Seconds of encoding per leaf after which no further candidate is tried."""
_LEVEL = 3
_DEEP_LEVEL = 9  # §5.5.1 lets each frame have a level of its own: see _smallest_frame
_DEEP_BELOW = 0.35
_NOISE = 0.95
_SAMPLE = 64 << 10  # bytes of a large leaf tried first, to skip a candidate that cannot pay
_SAMPLED = 4 * _SAMPLE  # leaves at least this large are sampled first


_DTYPE_WIDTHS = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


def dtype_width(dtype: str | None) -> int:
    """The plane width the writer tries for a tensor of ``dtype`` (1: none, not a float)."""
    return _DTYPE_WIDTHS.get(dtype or "", 1)


def check_known(oid: Digest, codec: str) -> None:
    """Refuse a codec this format does not define, before anything is read."""
    if codec not in CODECS:
        from nscas.errors import CodecError

        raise CodecError(oid, f"a codec of docs/format.md §5.5.1 ({', '.join(sorted(CODECS))})",
                         f"unknown codec {codec!r} in its row")


def is_delta(codec: str) -> bool:
    """True for the codecs whose chunk file names a base leaf (``xorW``, ``subW``)."""
    return codec.startswith(("xor", "sub")) and codec in WIDTHS


def is_sub(codec: str) -> bool:
    """True for the integer-difference deltas (``subW``), whose plane stream is not one of
    their plain bytes (no XOR of streams decodes them)."""
    return codec.startswith("sub") and codec in WIDTHS


def width(codec: str) -> int:
    """The plane width W of ``codec`` (1 where bytes are not planed)."""
    return WIDTHS.get(codec, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Base:
    """The base leaf of a delta: its ID (what the chunk file's header must name) and how to get
    its plain bytes, checked against that ID, once the header agrees."""

    id: Digest
    load: Callable[[], bytes]
    stream: Callable[[int], memoryview | None] | None = None
    """Its plane stream for a width W, decoded but not checked against its ID, or None where
    its codec has none of that width: a delta then XORs the two streams and un-planes once
    (planes of a XOR b = planes of a XOR planes of b). Safe unchecked because the delta's own
    plain bytes are checked, and they are wrong if the base's are; only then is ``load`` used,
    to say which of the two is corrupt (:func:`nscas.objects.decoding.check_plain`)."""
    plain: Callable[[], bytes | memoryview] | None = None
    """Its plain bytes, decoded but not checked against its ID (safe for the same reason), for
    a delta that has no use for a plane stream of the base's (a ``subW`` base has none)."""


# ----------------------------------------------------------------- the plane stream

def planes(data: bytes | bytearray | memoryview, w: int) -> bytes:
    """The plane stream of ``data`` for width ``w``: plane 0 ‖ … ‖ plane w-1 ‖ the tail."""
    if w == 1:
        return bytes(data)
    import numpy as np

    n = len(data)
    q = n // w
    arr = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(n, dtype=np.uint8)
    rows, grid = out[:q * w].reshape(w, q), arr[:q * w].reshape(q, w)
    for k in range(w):  # a plane at a time: about 4 x faster than one strided transpose
        rows[k] = grid[:, k]
    out[q * w:] = arr[q * w:]
    return out.tobytes()


def unplanes(stream: bytes | bytearray | memoryview, w: int) -> memoryview:
    """The bytes whose plane stream for width ``w`` is ``stream`` (the inverse of planes)."""
    n = len(stream)
    out = buffer(n)
    if w == 1:
        out[:] = stream
        return out
    import numpy as np

    q = n // w
    src = np.frombuffer(stream, dtype=np.uint8)
    dst = np.frombuffer(out, dtype=np.uint8)
    grid, rows = dst[:q * w].reshape(q, w), src[:q * w].reshape(w, q)
    for k in range(w):  # a plane at a time: about 4 x faster than one strided transpose
        grid[:, k] = rows[k]
    dst[q * w:] = src[q * w:]
    return out


def buffer(n: int) -> memoryview:
    """A writable, uninitialised buffer of ``n`` bytes for a decoded leaf. numpy's: it asks
    the kernel for huge pages, and a fresh 32 MiB bytearray costs about 4 x the page-fault
    time (20 ms of system time on the dev VM), then zeroes what is overwritten anyway."""
    import numpy as np

    return np.empty(n, dtype=np.uint8).data


class Unplaner:
    """Un-planes a plane stream block by block straight into ``out`` (its plain bytes), so
    that decoding holds one leaf, not the stream and the leaf."""

    def __init__(self, out: bytearray | memoryview, w: int) -> None:
        import numpy as np

        self._out = np.frombuffer(out, dtype=np.uint8)
        self._w = w
        self._q = len(out) // w
        self._grid = self._out[:self._q * w].reshape(self._q, w)

    def put(self, at: int, block: bytes | bytearray | memoryview) -> None:
        """The stream's bytes [at, at + len(block)), at most the leaf's length in all."""
        import numpy as np

        src = np.frombuffer(block, dtype=np.uint8)
        w, q = self._w, self._q
        while len(src):
            if w == 1 or at >= q * w:  # the tail (or W = 1): in place
                self._out[at:at + len(src)] = src
                return
            k, i = divmod(at, q)  # plane k, value i
            n = min(len(src), q - i)
            self._grid[i:i + n, k] = src[:n]
            src, at = src[n:], at + n


def xor_into(target: bytearray | memoryview, other: bytes | bytearray | memoryview) -> None:
    """``target`` ^= ``other``, byte by byte (both of one length)."""
    import numpy as np

    dst = np.frombuffer(target, dtype=np.uint8)
    np.bitwise_xor(dst, np.frombuffer(other, dtype=np.uint8), out=dst)


def xor(a: bytes | memoryview, b: bytes | memoryview) -> bytearray:
    out = bytearray(a)
    xor_into(out, b)
    return out


_SUB_BLOCK = 1 << 16  # values per step of un-subtracting: a few blocks stay in the CPU's cache


def sub_residual(data: bytes | bytearray | memoryview, other: bytes | bytearray | memoryview,
                 w: int) -> memoryview:
    """The ``subW`` residual of ``data`` against its base's plain bytes ``other`` (same
    length): each W-byte little-endian value minus the base's, mod 2^8W, zig-zag coded (0, -1,
    1, -2, ... as 0, 1, 2, 3, ...), then the n mod W tail bytes XOR the base's."""
    import numpy as np

    n, q = len(data), len(data) // w
    out = buffer(n)
    signed = np.frombuffer(out, dtype=f"<i{w}", count=q)
    np.subtract(np.frombuffer(data, dtype=f"<u{w}", count=q),
                np.frombuffer(other, dtype=f"<u{w}", count=q), out=signed.view(f"<u{w}"))
    sign = signed >> (8 * w - 1)  # all ones where negative: arithmetic shift
    np.left_shift(signed, 1, out=signed)
    np.bitwise_xor(signed, sign, out=signed)
    tail = np.frombuffer(out, dtype=np.uint8)[q * w:]
    np.bitwise_xor(np.frombuffer(data, dtype=np.uint8)[q * w:],
                   np.frombuffer(other, dtype=np.uint8)[q * w:], out=tail)
    return out


def unsub_into(target: memoryview, w: int, *, plain: bytes | bytearray | memoryview | None = None,
               stream: bytes | bytearray | memoryview | None = None) -> None:
    """``target`` (a ``subW`` residual, un-planed) becomes the leaf's plain bytes: each value
    un-zig-zagged and added to the base's, mod 2^8W, and the tail XORed with the base's. The
    base is given as its plain bytes, or as its plane stream of width ``w`` (un-planed here a
    block at a time, so that no second leaf-sized buffer is needed)."""
    import numpy as np

    n = len(target)
    q = n // w
    values = np.frombuffer(target, dtype=f"<u{w}", count=q)
    src = plain if plain is not None else stream
    assert src is not None and len(src) == n
    raw = np.frombuffer(src, dtype=np.uint8)
    rows = raw[:q * w].reshape(w, q) if plain is None else None
    words = np.frombuffer(src, dtype=f"<u{w}", count=q) if plain is not None else None
    grid = np.empty((min(_SUB_BLOCK, q), w), dtype=np.uint8)
    low = np.empty(min(_SUB_BLOCK, q), dtype=f"<u{w}")
    for i in range(0, q, _SUB_BLOCK):
        m = min(_SUB_BLOCK, q - i)
        if rows is not None:
            for k in range(w):
                grid[:m, k] = rows[k, i:i + m]
            base = grid[:m].reshape(-1).view(f"<u{w}")
        else:
            assert words is not None
            base = words[i:i + m]
        z, bit = values[i:i + m], low[:m]
        np.bitwise_and(z, 1, out=bit)
        np.negative(bit, out=bit)  # 0 or all ones (unsigned, wrapping)
        np.right_shift(z, 1, out=z)
        np.bitwise_xor(z, bit, out=z)
        np.add(z, base, out=z)  # unsigned: wraps mod 2^8W
    tail = np.frombuffer(target, dtype=np.uint8)[q * w:]
    np.bitwise_xor(tail, raw[q * w:], out=tail)


# ----------------------------------------------------------------- encoding

def pack_planes(data: bytes | bytearray | memoryview, w: int) -> bytes:
    """zstd frames whose decoded content is the plane stream of ``data``: one frame per plane
    (each plane's bytes alike, so each gets statistics and a level of its own,
    :func:`_smallest_frame`), the tail in the last; one plane copied at a time."""
    import numpy as np
    import zstandard

    # One compressor per level for all planes: each allocates its tables once, not per frame.
    cctx = {lv: zstandard.ZstdCompressor(level=lv) for lv in (1, _LEVEL, _DEEP_LEVEL)}
    if w == 1:
        return _smallest_frame(data, cctx)
    q = len(data) // w
    arr = np.frombuffer(data, dtype=np.uint8)
    grid = arr[:q * w].reshape(q, w)
    frames = [_smallest_frame(np.ascontiguousarray(grid[:, k]).data, cctx) for k in range(w - 1)]
    frames.append(_smallest_frame(np.concatenate([grid[:, w - 1], arr[q * w:]]).data, cctx))
    return b"".join(frames)


def _smallest_frame(plane: bytes | bytearray | memoryview,
                    cctx: dict[int, zstandard.ZstdCompressor]) -> bytes:
    """A plane's zstd frame: zstd-1 first, then the smaller of that and a second try where
    one can pay: zstd-9 for a plane that packs below :data:`_DEEP_BELOW` of its size (exponent
    planes, a fine-tune's sparse residual: quick to search deeper), zstd-3 for one between that
    and :data:`_NOISE` (a plane above is near-random mantissa bytes: no level packs it). On
    SmolLM2-135M (docs/benchmarks.md §10) zstd-1 packs exponent planes tighter than zstd-3, and
    zstd-9 a BF16 child's residual 8 % tighter."""
    best = cctx[1].compress(plane)
    ratio = len(best) / max(len(plane), 1)
    if ratio < _NOISE:
        level = _DEEP_LEVEL if ratio < _DEEP_BELOW else _LEVEL
        again = cctx[level].compress(plane)
        best = again if len(again) < len(best) else best
    return best


def choose(data: bytes | memoryview, *, w: int, base: tuple[Digest, bytes] | None = None,
           budget_s: float = BUDGET_S) -> tuple[str, bytes | memoryview]:
    """(codec, stored bytes) for a new chunk-file leaf: the candidate of fewest stored bytes,
    ``raw`` unless another saves :data:`MIN_SAVING`; ``w`` is the width of the tensor's dtype
    (1: not a float tensor), ``base`` (ID, plain bytes of the same length) a leaf to delta
    against: ``xorW``, and for a float ``subW``, of which a large leaf packs in full only the
    one whose sample packs smaller (on SmolLM2-135M, docs/benchmarks.md §10, ``subW`` is the
    smaller for every tensor of an FP32 and a BF16 child)."""
    import zstandard

    n = len(data)
    best: tuple[str, bytes | memoryview] = ("raw", data)
    if n < 1024:
        return best
    start = time.monotonic()
    cut = _SAMPLE - _SAMPLE % w
    candidates: list[tuple[str, Callable[[bytes | memoryview], bytes]]] = []
    if base is not None and len(base[1]) == n:
        deltas = _delta_candidates(bytes.fromhex(base[0].hex), base[1], w)
        if n >= _SAMPLED and len(deltas) > 1:
            deltas = [min(deltas, key=lambda c: len(c[1](data[:cut])))]
        candidates += deltas
    if w > 1:
        candidates.append((f"planes{w}", lambda d: pack_planes(d, w)))
    candidates.append(("zstd", lambda d: zstandard.ZstdCompressor(level=_LEVEL).compress(d)))
    bound = (1 - MIN_SAVING) * n
    for codec, pack in candidates:
        if time.monotonic() - start > budget_s:
            break
        slack = HEADER if is_delta(codec) else 0
        if n >= _SAMPLED and len(pack(data[:cut])) > (1 - MIN_SAVING) * cut + slack:
            continue
        stored = pack(data)
        if len(stored) <= bound and len(stored) < len(best[1]):
            best = (codec, stored)
    return best


def _delta_candidates(head: bytes, other: bytes, w: int
                      ) -> list[tuple[str, Callable[[bytes | memoryview], bytes]]]:
    """The deltas of a leaf against its base's plain bytes ``other``: (codec, pack)."""
    out: list[tuple[str, Callable[[bytes | memoryview], bytes]]] = [
        (f"xor{w}", lambda d: head + pack_planes(xor(d, other[:len(d)]), w))]
    if f"sub{w}" in WIDTHS:
        out.append((f"sub{w}", lambda d: head + pack_planes(sub_residual(d, other[:len(d)], w),
                                                            w)))
    return out
