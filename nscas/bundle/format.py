"""The bundle format (docs/format.md §8, docs/bundle.md): its file names and versions, the
manifest's byte ranges, SHA256SUMS lines, and the one-pass hashing of a file and its ranges
that export and import share."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from nscas.errors import InvalidInput
from nscas.objects.digests import Digest, DualHasher

FORMAT = "nscas-bundle/2"
"""What export writes: model folders hold every file of their checkpoint (paths may repeat an
object). ``nscas import`` reads this and ``FORMAT_V1``."""
FORMAT_V1 = "nscas-bundle/1"
"""The first format: every object in one place only."""
FORMATS = (FORMAT_V1, FORMAT)
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"
TARBALL = "measurements.tar.gz"
RESERVED = frozenset({MANIFEST, SUMS, TARBALL})
WEIGHTS = "weights"  # the one reason for omitting objects so far
SIGNATURES = "signatures"  # signature/1 records of the closure's receipts
MODEL_SIGNATURES = "model-signatures"
"""``model-signatures/<arm>.sig``: OpenSSF Model Signing signatures of ``models/<arm>/``
(``--model-signing``); not objects, so in neither the manifest nor SHA256SUMS nor the tar."""
_BLOCK = 8 << 20
SUMS_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
"""One line of SHA256SUMS: ``<sha256>  <path>``."""
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class InvalidBundle(InvalidInput):
    """A bundle (or bundle tar) that import refuses; ``path`` is the file inside it, if any."""

    def __init__(self, source: str, path: str | None, problem: str) -> None:
        super().__init__(f"{source}: {path}: {problem}" if path else f"{source}: {problem}")
        self.source = source
        self.path = path
        self.problem = problem


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Range:
    """Bytes ``offset .. offset+size`` of the object ``source``."""

    source: Digest
    offset: int
    size: int



def model_folders(paths: Iterable[str]) -> tuple[str, ...]:
    """The ``<arm>`` of every ``models/<arm>/`` folder among bundle paths, sorted."""
    return tuple(sorted({p.split("/")[1] for p in paths
                         if p.startswith("models/") and p.count("/") >= 2}))


def is_model_signature(path: str, paths: Iterable[str]) -> bool:
    """Whether ``path`` is where ``--model-signing`` puts the signature of a model folder that
    the bundle (its manifest ``paths``) has: ``model-signatures/<arm>.sig``."""
    head, _, name = path.partition("/")
    return (head == MODEL_SIGNATURES and name.endswith(".sig") and "/" not in name
            and name[:-4] in model_folders(paths))


def hash_stream(src: BinaryIO, ranges: Iterable[Range], *,
                 sink: Callable[[bytes], Any] | None = None,
                 ) -> tuple[tuple[Digest, str, int], dict[Range, tuple[Digest, str]]]:
    """(ID, SHA-256, size) of a stream and {range: (ID, SHA-256)} of byte ranges of it, read
    once; ranges past the end are left out."""
    whole = DualHasher()
    parts = {r: DualHasher() for r in sorted(set(ranges))}
    pos = 0
    while chunk := src.read(_BLOCK):
        whole.update(chunk)
        if sink is not None:
            sink(chunk)
        view = memoryview(chunk)
        for r, h in parts.items():
            lo, hi = max(r.offset, pos), min(r.offset + r.size, pos + len(chunk))
            if lo < hi:
                h.update(view[lo - pos:hi - pos])
        pos += len(chunk)
    done = {r: (h.digest(), h.sha256()) for r, h in parts.items() if r.offset + r.size <= pos}
    return (whole.digest(), whole.sha256(), whole.size), done


def sha256sums(hashes: Mapping[str, str]) -> bytes:
    """coreutils ``sha256sum`` lines, ``<sha256>  <path>``, sorted bytewise by path."""
    return "".join(f"{hashes[p]}  {p}\n" for p in sorted(hashes, key=str.encode)).encode()
