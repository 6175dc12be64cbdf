"""Chunk codecs (docs/format.md §5.5, §5.5.1), decoded from the spec's text alone.

A chunk file holds one leaf in the codec its row names: ``raw``, ``zstd`` (frames),
``planesW`` (the plane stream of width W in zstd frames), ``xorW`` (a 32-byte header naming
the base leaf, then the residual's plane stream in zstd frames; plain = residual XOR base) or
``subW`` (the same layout; each W-byte value of the residual is a zig-zag coded difference, so
plain value = base value + difference mod 2^8W, and the tail bytes XOR the base's).
``decode_leaf`` checks every row of the leaf's chain first (codec known, a delta's header
present and equal to its row's base, the base a chunk-file leaf of the same size, at most
``DEPTH`` deltas, no cycle), and only then decodes, from the chain's non-delta end up, each
link bounded by its record (stored bytes, zstd window, plain size) and each base checked
against its ID. It holds at most the running plain bytes and one link's stream at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import blake3
import zstandard

from .objects import READ_CHUNK
from .sources import Unreadable

LEAF_LIMIT = 32 << 20
"""The largest leaf (§5.5): a row claiming more is read as claiming this."""
WINDOW_LIMIT = 32 << 20
"""The largest zstd window a chunk's frame may need (§5.5)."""
HEADER = 32
"""A delta's header: the raw BLAKE3 digest of its base."""
DEPTH = 8
"""The most deltas in one chain (D, §5.5.1)."""
SLACK = 64 << 10
"""What stored bytes may exceed ``size + size/128`` by (§5.5)."""

WIDTHS = {"raw": 0, "zstd": 0, "planes2": 2, "planes4": 4, "planes8": 8,
          "xor1": 1, "xor2": 2, "xor4": 4, "xor8": 8, "sub2": 2, "sub4": 4, "sub8": 8}
"""Every codec of §5.5.1 and its width W (0: no planes)."""


def is_delta(codec: str) -> bool:
    return codec.startswith(("xor", "sub")) and codec in WIDTHS


def add_differences(residual: bytes, base: bytes, width: int) -> bytes:
    """The plain bytes of a ``subW`` leaf from its un-planed residual and its base's plain
    bytes (§5.5.1): value i is base value i plus the zig-zag decoded residual value i, mod
    2^(8W), little-endian; the n mod W tail bytes are the residual's XOR the base's."""
    import numpy as np

    q = len(residual) // width
    kind = np.dtype(f"<u{width}")
    z = np.frombuffer(residual, kind, count=q)
    # zig-zag: 2d for d >= 0, -2d - 1 for d < 0; so d = z / 2, or -(z + 1) / 2 for z odd.
    difference = (z >> kind.type(1)) ^ (kind.type(0) - (z & kind.type(1)))
    values = np.frombuffer(base, kind, count=q) + difference  # unsigned: wraps mod 2^(8W)
    tail = bytes(r ^ b for r, b in zip(residual[q * width:], base[q * width:], strict=True))
    body: bytes = values.astype(kind).tobytes()
    return body + tail


class CodecRefused(Unreadable):
    """A chunk-file leaf whose row or bytes break §5.5.1; ``problem`` names the class
    (``unknown-codec``, ``no-header``, ``base-mismatch``, ``missing-base``, ``base-size``,
    ``chain-too-deep``, ``cycle``, ``bomb``, ``short``, ``wrong-bytes``,
    ``stored-too-large``, ``window-too-large``, ``corrupt``)."""

    def __init__(self, object_id: str, problem: str, why: str, *, missing: bool = False) -> None:
        super().__init__(object_id, why, missing=missing)
        self.problem = problem


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkRow:
    """What a leaf's row of the objects table says, as read (values of any type)."""

    id: str
    """64 hex digits."""
    size: object
    storage: object
    codec: object
    base: object
    """The ``base`` column: 64 hex digits, or None (NULL, or a store without the column)."""


class ChunkFiles(Protocol):
    """A store's rows and chunk files, as the decoder needs them."""

    has_bases: bool
    """Whether the objects table has the ``base`` column (migration ``0006_chunk_bases``)."""

    def chunk_row(self, hex_id: str) -> ChunkRow | None:
        """The leaf's row; None when the store has no row of that ID."""

    def chunk_head(self, hex_id: str, n: int) -> bytes:
        """The first ``n`` bytes of the chunk file (fewer if it is shorter)."""

    def chunk_bytes(self, hex_id: str, limit: int) -> tuple[bytes, str]:
        """At most ``limit + 1`` bytes of the chunk file, and where they were read."""


def plain_limit(size: object) -> int:
    """The most plain bytes a row lets a read produce (§5.5)."""
    if isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= LEAF_LIMIT:
        return size
    return LEAF_LIMIT


def stored_limit(size: object, codec: str) -> int:
    """The most bytes the chunk file of a leaf of ``size`` may hold (§5.5.1)."""
    n = plain_limit(size)
    return (HEADER if is_delta(codec) else 0) + n + n // 128 + SLACK


def unplane(stream: bytes, width: int) -> bytes:
    """The bytes whose plane stream of ``width`` is ``stream`` (§5.5.1)."""
    if width <= 1:
        return stream
    import numpy as np  # only where a leaf has planes: verify need not load it otherwise

    q = len(stream) // width
    planes = np.frombuffer(stream, np.uint8, count=q * width).reshape(width, q)
    values = np.empty((q, width), np.uint8)
    for k in range(width):  # a plane at a time: faster than one strided transpose
        values[:, k] = planes[k]
    return values.tobytes() + stream[q * width:]


def decode_leaf(files: ChunkFiles, row: ChunkRow) -> bytes:
    """The plain bytes of the chunk-file leaf of ``row``, its chain checked first; raises
    ``CodecRefused`` (or ``Unreadable`` for a chunk file that is gone) naming the leaf. The
    leaf's own bytes are left for the caller to check against its ID, like every leaf's."""
    oid = f"blake3:{row.id}"
    chain = _chain(files, row)
    plain = b""
    for i, link in enumerate(reversed(chain)):
        plain = _decode_link(files, link, plain, oid)
        if i < len(chain) - 1 and blake3.blake3(plain).hexdigest() != link.id:
            raise CodecRefused(oid, "wrong-bytes", f"its base blake3:{link.id} "
                               f"{_where(chain, link)} decodes to bytes that hash to "
                               f"blake3:{blake3.blake3(plain).hexdigest()}")
    return plain


def _where(chain: list[ChunkRow], link: ChunkRow) -> str:
    return f"(link {chain.index(link)} of its delta chain)"


def _chain(files: ChunkFiles, leaf: ChunkRow) -> list[ChunkRow]:
    """The leaf, its base, the base's base, ... down to a non-delta, every row checked."""
    oid = f"blake3:{leaf.id}"
    chain = [leaf]
    while True:
        link = chain[-1]
        about = "" if link is leaf else f"its base blake3:{link.id} {_where(chain, link)}: "

        def refuse(problem: str, why: str, *, missing: bool = False,
                   about: str = about) -> CodecRefused:
            return CodecRefused(oid, problem, about + why, missing=missing)

        codec = link.codec
        if not isinstance(codec, str) or codec not in WIDTHS:
            raise refuse("unknown-codec", f"unknown codec {codec!r} (docs/format.md §5.5.1 "
                                          f"names {', '.join(WIDTHS)})")
        if link.storage != "file":
            raise refuse("missing-base", f"a base must be a leaf in a chunk file, this one is "
                                         f"stored {link.storage!r}")
        if not is_delta(codec):
            if link.base is not None:
                raise refuse("base-mismatch", f"codec {codec} has no base, but the row's base "
                                              f"column names {link.base!r}")
            return chain
        if sum(is_delta(str(c.codec)) for c in chain) > DEPTH:
            raise refuse("chain-too-deep", f"its delta chain is more than {DEPTH} deltas deep")
        base = _checked_base(files, link, refuse)
        if any(c.id == base.id for c in chain):
            raise refuse("cycle", f"codec {codec} names blake3:{base.id} as its base, which "
                                  "is " + ("itself" if base.id == link.id else
                                          "in its own delta chain (a cycle)"))
        if base.size != link.size:
            raise refuse("base-size", f"its base blake3:{base.id} records {base.size!r} bytes, "
                                      f"it records {link.size!r}")
        chain.append(base)


def _checked_base(files: ChunkFiles, link: ChunkRow,
                  refuse: Callable[..., CodecRefused]) -> ChunkRow:
    """The base row a delta's row and header both name."""
    if not files.has_bases:
        raise refuse("base-mismatch", f"codec {link.codec} needs a base, but the store's "
                                      "objects table has no base column (migration "
                                      "0006_chunk_bases)")
    if link.base is None:
        raise refuse("base-mismatch", f"codec {link.codec} needs a base, but the row's base "
                                      "column is NULL")
    if not isinstance(link.base, str) or len(link.base) != 64 or not all(
            c in "0123456789abcdef" for c in link.base):
        raise refuse("base-mismatch", f"the row's base column {link.base!r} is not an ID")
    head = files.chunk_head(link.id, HEADER)
    if len(head) < HEADER:
        raise refuse("no-header", f"codec {link.codec}, but the chunk file holds {len(head)} "
                                  f"bytes, less than the {HEADER}-byte header naming its base")
    if head.hex() != link.base:
        raise refuse("base-mismatch", f"the chunk file's header names blake3:{head.hex()} as "
                                      f"its base, the row names blake3:{link.base}")
    base = files.chunk_row(link.base)
    if base is None:
        raise refuse("missing-base", f"its base blake3:{link.base} is not in the store",
                     missing=True)
    return base


def _decode_link(files: ChunkFiles, link: ChunkRow, below: bytes, oid: str) -> bytes:
    """One link's plain bytes; ``below`` is its base's plain bytes (for a delta)."""
    codec = str(link.codec)
    size = plain_limit(link.size)
    limit = stored_limit(link.size, codec)
    stored, where = files.chunk_bytes(link.id, limit)
    what = where if link.id == oid[7:] else f"its base blake3:{link.id}: {where}"

    def refuse(problem: str, why: str) -> CodecRefused:
        return CodecRefused(oid, problem, f"{what} {why}")

    if len(stored) > limit:
        raise refuse("stored-too-large", f"holds more than {limit} bytes, the most a "
                                         f"{codec} leaf of {size} bytes may (docs/format.md "
                                         "§5.5.1)")
    if codec == "raw":
        plain = stored
    else:
        plain = _inflate(stored[HEADER:] if is_delta(codec) else stored, size, refuse)
    if len(plain) > size:
        raise refuse("bomb", f"decodes past {size} bytes: at most {size} bytes, as its record "
                             "says")
    if len(plain) < size:
        raise refuse("short", f"decodes to {len(plain)} bytes, its record says {size}")
    width = WIDTHS[codec]
    plain = unplane(plain, width)
    if codec.startswith("sub"):
        plain = add_differences(plain, below, width)
    elif is_delta(codec):
        import numpy as np

        plain = (np.frombuffer(plain, np.uint8) ^ np.frombuffer(below, np.uint8)).tobytes()
    return plain


def _inflate(data: bytes, size: int, refuse: Callable[[str, str], CodecRefused]) -> bytes:
    """The concatenated content of the zstd frames ``data``, read to at most ``size + 1``
    bytes (a bomb is found by its first byte too many, never inflated)."""
    pieces, got = [], 0
    try:
        with zstandard.ZstdDecompressor(max_window_size=WINDOW_LIMIT).stream_reader(
                data, read_across_frames=True) as reader:
            while got <= size and (piece := reader.read(min(READ_CHUNK, size + 1 - got))):
                pieces.append(piece)
                got += len(piece)
    except zstandard.ZstdError as exc:
        text = str(exc)
        if "memory" in text or "window" in text.lower():
            raise refuse("window-too-large", f"has a zstd frame needing a window over "
                                             f"{WINDOW_LIMIT >> 20} MiB ({text})") from None
        raise refuse("corrupt", f"is not valid zstd ({text})") from None
    return b"".join(pieces)
