"""Chunk codecs (docs/format.md §5.5.1): the plane stream, byte planes and XOR deltas, and the
writer's choice among them (§5.5.2). Pure functions of bytes: which chunk file, which base and
which row is the chunk layer's and the store's to say.

A plane stream of width W puts byte k of every W-byte value together (the sign-and-exponent
bytes of FP32 or BF16 apart from their mantissa bytes), which zstd then packs far better; a
delta XORs a leaf with its base's plain bytes first, so that what a fine-tune left unchanged
becomes zero bytes.
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
                          "xor1": 1, "xor2": 2, "xor4": 4, "xor8": 8}
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
    """True for the codecs whose chunk file names a base leaf (``xorW``)."""
    return codec.startswith("xor") and codec in WIDTHS


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
    (1: not a float tensor), ``base`` (ID, plain bytes of the same length) a leaf to XOR with."""
    import zstandard

    n = len(data)
    best: tuple[str, bytes | memoryview] = ("raw", data)
    if n < 1024:
        return best
    start = time.monotonic()
    candidates: list[tuple[str, Callable[[bytes | memoryview], bytes]]] = []
    if base is not None and len(base[1]) == n:
        head = bytes.fromhex(base[0].hex)
        other = base[1]
        candidates.append((f"xor{w}", lambda d: head + pack_planes(xor(d, other[:len(d)]), w)))
    if w > 1:
        candidates.append((f"planes{w}", lambda d: pack_planes(d, w)))
    candidates.append(("zstd", lambda d: zstandard.ZstdCompressor(level=_LEVEL).compress(d)))
    bound = (1 - MIN_SAVING) * n
    for codec, pack in candidates:
        if time.monotonic() - start > budget_s:
            break
        if n >= _SAMPLED:
            cut = _SAMPLE - _SAMPLE % w
            if len(pack(data[:cut])) > (1 - MIN_SAVING) * cut + (HEADER if is_delta(codec) else 0):
                continue
        stored = pack(data)
        if len(stored) <= bound and len(stored) < len(best[1]):
            best = (codec, stored)
    return best
