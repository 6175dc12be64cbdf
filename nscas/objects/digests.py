"""Typed object IDs and the hashing that names objects (docs/format.md §1)."""

from __future__ import annotations

import re
from typing import Protocol

import blake3

from nscas.errors import InvalidDigest, InvalidInput

ALGORITHM = "blake3"
_FULL = re.compile(r"blake3:[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{64}")
_PREFIX = re.compile(r"(?:blake3:)?([0-9a-f]{8,64})")
# Above this size BLAKE3 uses its own thread pool; below it threads cost more than they save.
_PARALLEL_BYTES = 1 << 20


class Readable(Protocol):
    """A stream of bytes that fills a caller's buffer: a file opened ``rb``, a zstd reader, an
    S3 body (``typing.BinaryIO`` has no ``readinto``)."""

    def read(self, n: int = -1, /) -> bytes: ...
    def readinto(self, b: bytearray | memoryview, /) -> int: ...


class Digest:
    """A BLAKE3-256 object ID. Build it with :meth:`parse` or :meth:`of`, never from loose text.

    Immutable, hashable and ordered by its hex digits. Written out rather than as a dataclass:
    every command uses this class, and importing dataclasses (it imports inspect) was a good
    part of the start-up of a read command such as ``nscas log`` (docs/benchmarks.md §9).
    """

    __slots__ = ("hex",)
    __match_args__ = ("hex",)
    hex: str

    def __init__(self, hex: str) -> None:
        if not _HEX.fullmatch(hex):
            raise InvalidDigest(hex)
        object.__setattr__(self, "hex", hex)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Digest cannot change: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Digest cannot change: cannot delete {name!r}")

    def __reduce__(self) -> tuple[type[Digest], tuple[str]]:  # pickle and copy: through __init__
        return Digest, (self.hex,)

    def __hash__(self) -> int:
        return hash(self.hex)

    def __eq__(self, other: object) -> bool:
        return self.hex == other.hex if isinstance(other, Digest) else NotImplemented

    def __lt__(self, other: object) -> bool:
        return self.hex < other.hex if isinstance(other, Digest) else NotImplemented

    def __le__(self, other: object) -> bool:
        return self.hex <= other.hex if isinstance(other, Digest) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return self.hex > other.hex if isinstance(other, Digest) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return self.hex >= other.hex if isinstance(other, Digest) else NotImplemented

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse ``blake3:<64 lowercase hex>`` strictly."""
        if not isinstance(text, str) or not _FULL.fullmatch(text):
            raise InvalidDigest(str(text))
        return cls(text[7:])

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview) -> Digest:
        return cls(blake3_hex(data))

    @property
    def algorithm(self) -> str:
        return ALGORITHM

    @property
    def short(self) -> str:
        return self.hex[:12]

    def __str__(self) -> str:
        return f"{ALGORITHM}:{self.hex}"

    def __repr__(self) -> str:
        return f"Digest('{self}')"


def is_digest_text(text: object) -> bool:
    """True if ``text`` is exactly an object ID string (the link syntax of docs/format.md §2)."""
    return isinstance(text, str) and len(text) == 71 and _FULL.fullmatch(text) is not None


def is_hex_id(text: str) -> bool:
    """True if ``text`` is the 64 lowercase hex digits of an ID (a chunk file's or key's name)."""
    return _HEX.fullmatch(text) is not None


def parse_prefix(text: str) -> str:
    """The hex part of a CLI ID prefix (at least 8 hex digits, optional ``blake3:``)."""
    m = _PREFIX.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise InvalidInput(
            f"invalid object ID or prefix {text!r}: give 'blake3:' and 64 hex digits, "
            "or a unique prefix of at least 8 lowercase hex digits"
        )
    return m.group(1)


def blake3_hex(data: bytes | bytearray | memoryview) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO) if len(data) >= _PARALLEL_BYTES else blake3.blake3()
    h.update(data)
    return h.hexdigest()


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    import hashlib  # here, not above: loading OpenSSL costs a read command (log, lineage) ~6 ms

    return hashlib.sha256(data).hexdigest()


class DualHasher:
    """BLAKE3 and SHA-256 over one stream, fed once; both release the GIL on large updates."""

    __slots__ = ("_b3", "_sha", "size")

    def __init__(self) -> None:
        import hashlib  # as in sha256_hex: OpenSSL only for the reads and writes that hash

        self._b3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self._sha = hashlib.sha256()
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._b3.update(data)
        self._sha.update(data)
        self.size += len(data)

    def digest(self) -> Digest:
        return Digest(self._b3.hexdigest())

    def sha256(self) -> str:
        return self._sha.hexdigest()


def hash_stream(stream: Readable, block: int = 8 << 20) -> tuple[Digest, str, int]:
    """(BLAKE3 ID, SHA-256 hex, size) of everything left in ``stream``."""
    h = DualHasher()
    buf = bytearray(block)
    view = memoryview(buf)
    while n := stream.readinto(buf):
        h.update(view[:n])
    return h.digest(), h.sha256(), h.size


def hash_slice(stream: Readable, length: int, block: int = 8 << 20) -> Digest:
    """BLAKE3 ID of the next ``length`` bytes of ``stream``; short streams are an error."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    left = length
    while left:
        data = stream.read(min(block, left))
        if not data:
            raise InvalidInput(f"stream ends {left} bytes before the slice does")
        h.update(data)
        left -= len(data)
    return Digest(h.hexdigest())
